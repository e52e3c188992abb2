"""Megatron-LM's flags of a plan (workbench.parallel.export.megatron), parsed by a mirror of Megatron's parser.

The mirror declares each flag the exporter writes as Megatron-LM core_v0.15.0 (commit
0d7e02bd26d3eb347ad8d1bef625002babfa6df7) declares it in megatron/training/arguments.py (type, choices,
store_true), and checks what its ``validate_args`` asserts of them: the virtual pipeline's divisibility, the
global batch against micro-batch x data-parallel size, the pipeline layout string (parsed here on its own, as
megatron/core/transformer/pipeline_parallel_layer_layout.py documents it: stages split by ``|``, ``E``
embedding, ``t`` decoder layer, ``L`` loss, ``x*n`` n copies).
"""

import argparse
import re

import pytest

from tests.export_plans import layout_plan
from workbench.parallel.export.job import job_from_plan
from workbench.parallel.export.megatron import megatron_flags


def megatron_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False)
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-layers", "--seq-length",
                 "--micro-batch-size", "--global-batch-size", "--num-layers-per-virtual-pipeline-stage",
                 "--recompute-num-layers"):
        p.add_argument(flag, type=int, default=None)
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp", "--bf16",
                 "--overlap-grad-reduce", "--overlap-param-gather"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--pipeline-model-parallel-layout", type=str, default=None)
    p.add_argument("--recompute-granularity", type=str, default=None, choices=["full", "selective"])
    p.add_argument("--recompute-method", type=str, default=None, choices=["uniform", "block"])
    p.add_argument("--data-parallel-sharding-strategy", type=str, default="no_shard",
                   choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    p.add_argument("--ckpt-format", type=str, default="torch_dist")
    return p


def unroll_layout(text: str) -> list[str]:
    """A layout string as one string of layer letters per stage."""
    text = text.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m[1] * int(m[2]), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m[1] * int(m[2]), text)
    return text.split("|")


def parse(job):
    flags = megatron_flags(job)
    args = megatron_parser().parse_args(flags.args)
    world = job.layout.devices
    dp = world // (args.tensor_model_parallel_size * args.pipeline_model_parallel_size)
    assert args.global_batch_size % (args.micro_batch_size * dp) == 0
    assert dp == job.layout.dp
    if args.pipeline_model_parallel_layout:
        stages = unroll_layout(args.pipeline_model_parallel_layout)
        flat = "".join(stages)
        assert len(stages) % args.pipeline_model_parallel_size == 0
        assert flat[0] == "E" and flat[-1] == "L" and flat.count("E") == flat.count("L") == 1
        assert flat.count("t") == args.num_layers and set(flat) <= set("EtL")
    elif args.num_layers_per_virtual_pipeline_stage:
        per_stage = args.num_layers // args.pipeline_model_parallel_size
        assert args.num_layers % args.pipeline_model_parallel_size == 0
        assert per_stage % args.num_layers_per_virtual_pipeline_stage == 0
    elif args.pipeline_model_parallel_size > 1:
        assert args.num_layers % args.pipeline_model_parallel_size == 0
    return args, flags


def test_nvidias_llama3_70b_layout():
    job = job_from_plan(layout_plan([2] * 40, pp=8, chunks=5, schedule="interleaved-1f1b", tp=4, dp=2, zero=1,
                                    sequence_parallel=True, loss_parallel=True, micro_batches=64), seq_len=8192)
    args, flags = parse(job)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (4, 8)
    assert args.num_layers == 80 and args.num_layers_per_virtual_pipeline_stage == 2       # 80 / 8 / 2 = VP 5
    assert args.sequence_parallel and args.use_distributed_optimizer and args.bf16
    assert (args.micro_batch_size, args.global_batch_size, args.seq_length) == (1, 128, 8192)
    assert args.pipeline_model_parallel_layout is None and args.recompute_granularity is None
    assert flags.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} and not flags.notes


def test_an_uneven_split_is_written_as_the_plans_layout():
    job = job_from_plan(layout_plan([3, 4, 5, 2], pp=4, tp=2), seq_len=4096)
    args, _ = parse(job)
    assert unroll_layout(args.pipeline_model_parallel_layout) == ["Ettt", "tttt", "ttttt", "ttL"]
    assert args.pipeline_model_parallel_layout == "Et*3|t*4|t*5|t*2L"


def test_an_interleaved_uneven_split_keeps_stage_order():
    job = job_from_plan(layout_plan([1, 2, 2, 3], pp=2, chunks=2, schedule="interleaved-1f1b"), seq_len=4096)
    args, _ = parse(job)
    assert unroll_layout(args.pipeline_model_parallel_layout) == ["Et", "tt", "tt", "tttL"]


@pytest.mark.parametrize("zero,flags", [(0, []), (1, ["--use-distributed-optimizer"]),
                                        (2, ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                                             "optim_grads"]),
                                        (3, ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                                             "optim_grads_params"])])
def test_zero_levels(zero, flags):
    job = job_from_plan(layout_plan([4], pp=1, dp=8, zero=zero, tp=1), seq_len=2048)
    args, out = parse(job)
    text = " ".join(out.args)
    assert all(f in text for f in flags)
    assert ("--ckpt-format fsdp_dtensor" in text) == (zero >= 2) and (bool(out.notes) == (zero >= 2))


def test_recompute_whole_blocks():
    every = layout_plan([2, 2], pp=2, activations=["recompute"] * 7)
    args, _ = parse(job_from_plan(every, seq_len=2048))
    assert (args.recompute_granularity, args.recompute_method, args.recompute_num_layers) == ("full", "uniform", 1)
    # stage 0 recomputes 1 of its 2 blocks, stage 1 both: one number for every stage, the larger
    some = layout_plan([2, 2], pp=2, activations=["keep", "recompute", "keep", "offload", "recompute", "keep",
                                                  "keep"])
    args, flags = parse(job_from_plan(some, seq_len=2048))
    assert (args.recompute_method, args.recompute_num_layers) == ("block", 2)
    assert any("1 to 2 blocks per stage" in n for n in flags.notes) and any("offload" in n for n in flags.notes)


@pytest.mark.parametrize("schedule,closest", [("zbv", "interleaved-1f1b --chunks 2"), ("gpipe", "1f1b"),
                                              ("dualpipev", "interleaved-1f1b"), ("looped-bfs", "interleaved-1f1b")])
def test_schedules_megatron_lacks_name_the_closest(schedule, closest):
    chunks = 1 if schedule == "gpipe" else 2
    job = job_from_plan(layout_plan([2] * 2 * chunks, pp=2, chunks=chunks, schedule=schedule,
                                    v_shape=schedule in ("zbv", "dualpipev")), seq_len=2048)
    with pytest.raises(ValueError, match=f"re-plan with --method {closest}"):
        megatron_flags(job)


def test_a_plan_with_gathered_logits_says_megatron_splits_the_loss():
    gathered = megatron_flags(job_from_plan(layout_plan([2, 2], pp=2, tp=2), seq_len=2048))
    split = megatron_flags(job_from_plan(layout_plan([2, 2], pp=2, tp=2, loss_parallel=True), seq_len=2048))
    assert any("vocabulary-parallel" in n and "lp=1" in n for n in gathered.notes)
    assert not any("vocabulary-parallel" in n for n in split.notes) and split.args == gathered.args


def test_the_text_is_one_flag_per_line():
    job = job_from_plan(layout_plan([2, 2], pp=2, tp=2, sequence_parallel=True, loss_parallel=True), seq_len=2048)
    text = megatron_flags(job).text(["header"])
    lines = text.splitlines()
    assert lines[0] == "# header" and lines[1] == "export CUDA_DEVICE_MAX_CONNECTIONS=1"
    assert lines[2] == "--tensor-model-parallel-size 2 \\" and lines[-1].startswith("--") and "\\" not in lines[-1]
    flags = " ".join(line.rstrip(" \\") for line in lines if line.startswith("--")).split()
    assert megatron_parser().parse_args(flags).sequence_parallel


def test_the_text_pastes_into_a_shell_as_the_same_words():
    """The layout string holds ``*`` and ``|``: quoted, the shell reads back the very flags (shlex: POSIX rules)."""
    import shlex

    job = job_from_plan(layout_plan([3, 4, 5, 2], pp=4, tp=2), seq_len=4096)
    flags = megatron_flags(job)
    text = flags.text()
    body = " ".join(line.rstrip("\\").strip() for line in text.splitlines() if line.startswith("--"))
    assert shlex.split(body) == flags.args
    assert "'Et*3|t*4|t*5|t*2L'" in text
    assert megatron_parser().parse_args(shlex.split(body)).pipeline_model_parallel_layout == "Et*3|t*4|t*5|t*2L"


def test_tp_overlap_is_megatrons_tp_comm_overlap():
    plain = megatron_flags(job_from_plan(layout_plan([2, 2], pp=2, tp=2, sequence_parallel=True), seq_len=2048))
    overlapped = megatron_flags(job_from_plan(layout_plan([2, 2], pp=2, tp=2, sequence_parallel=True,
                                                          tp_overlap=True), seq_len=2048))
    assert "--tp-comm-overlap" not in plain.args
    i = overlapped.args.index("--tp-comm-overlap")
    assert overlapped.args[i - 1] == "--sequence-parallel"                 # Megatron asserts sequence parallelism
    assert [a for a in overlapped.args if a != "--tp-comm-overlap"] == plain.args
    assert any("userbuffers" in n for n in overlapped.notes)


def test_dp_overlap_is_megatrons_overlapped_distributed_optimizer():
    plain = megatron_flags(job_from_plan(layout_plan([4], pp=1, dp=8, zero=1, tp=1), seq_len=2048))
    overlapped = megatron_flags(job_from_plan(layout_plan([4], pp=1, dp=8, zero=1, tp=1, dp_overlap=True),
                                              seq_len=2048))
    args = megatron_parser().parse_args(overlapped.args)
    assert args.use_distributed_optimizer and args.overlap_grad_reduce and args.overlap_param_gather
    assert "--overlap-grad-reduce" not in plain.args and "--overlap-param-gather" not in plain.args
    extra = [a for a in overlapped.args if a not in plain.args]
    assert extra == ["--overlap-grad-reduce", "--overlap-param-gather"]
    assert any("dpo=1" in n and "fp32" in n for n in overlapped.notes)
