"""Tensor parallelism: Megatron's split of each block over ``tp`` GPUs, profiled per rank (docs/model.md, "Layouts").

One module per idea: :mod:`~workbench.parallel.tensor.plan` (which modules are split how),
:mod:`~workbench.parallel.tensor.styles` (the hidden-state input style, GPT-2's ``Conv1D`` styles),
:mod:`~workbench.parallel.tensor.shard` (torch's ``parallelize_module`` on a mesh),
:mod:`~workbench.parallel.tensor.mesh` (the fake process group),
:mod:`~workbench.parallel.tensor.comm` (the bytes of every collective a layer issues),
:mod:`~workbench.parallel.tensor.times` (the roofline plus the collectives on the link),
:mod:`~workbench.parallel.tensor.boundaries` (each rank's local tensor at the chain's boundaries),
:mod:`~workbench.parallel.tensor.profile` (the per-rank profile, cached by content),
:mod:`~workbench.parallel.tensor.real` (the same measurement on gloo ranks) and
:mod:`~workbench.parallel.tensor.tiny` (the small decoders they are checked on: a Llama and a GPT-2).
"""
