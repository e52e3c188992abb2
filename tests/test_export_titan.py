"""torchtitan's settings of a plan (workbench.parallel.export.titan), checked against torchtitan's own names.

torchtitan is not a requirement of the project: the keys below are read from its source, and the tests marked
``torchtitan`` run its own config classes when it is importable (benchmarks/torchtitan_export.py runs both
versions' ``ConfigManager`` in their own environments).
"""

import tomllib

import pytest
from torch.distributed.pipelining.schedules import get_schedule_class

from tests.export_plans import layout_plan
from workbench.methods import method
from workbench.parallel.export.job import job_from_plan
from workbench.parallel.export.titan import SCHEDULES, default_split, to_toml, torchtitan_settings

#: torchtitan v0.2.2 (commit 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce), torchtitan/config/job_config.py: the
#: fields of JobConfig's Parallelism, Training and ActivationCheckpoint dataclasses that the TOML may set, and types
JOBCONFIG_022 = {
    "parallelism": {"data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
                    "fsdp_reshard_after_forward": ("default", "always", "never"), "tensor_parallel_degree": int,
                    "disable_loss_parallel": bool, "enable_async_tensor_parallel": bool,
                    "pipeline_parallel_degree": int, "module_fqns_per_model_part": list,
                    "pipeline_parallel_first_stage_less_layers": int, "pipeline_parallel_last_stage_less_layers": int,
                    "pipeline_parallel_layers_per_stage": int, "pipeline_parallel_schedule": str,
                    "pipeline_parallel_schedule_csv": str, "pipeline_parallel_microbatch_size": int,
                    "context_parallel_degree": int},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int, "max_norm": float,
                 "steps": int, "enable_cpu_offload": bool, "dtype": ("bfloat16", "float32"),
                 "mixed_precision_param": ("bfloat16", "float32"), "mixed_precision_reduce": ("float32",)},
    "activation_checkpoint": {"mode": ("selective", "full", "memory_budget", "none"), "selective_ac_option": str,
                              "early_stop": bool, "memory_budget": float, "preserve_rng_state": bool},
}
#: torchtitan 0.3.0 (the package registry's wheel), torchtitan/config/configs.py: ParallelismConfig's and
#: TrainingConfig's fields, each a ``--parallelism.KEY`` / ``--training.KEY`` option; and the sub-commands of
#: torchtitan/distributed/activation_checkpoint.py's ActivationCheckpointingConfig
CLI_030 = {
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "enable_fsdp_symm_mem", "tensor_parallel_degree", "enable_sequence_parallel", "spmd_backend",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size", "context_parallel_degree",
                    "context_parallel_load_balancer", "context_parallel_ptrr_mask_key", "expert_parallel_degree"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps", "enable_cpu_offload",
                 "disable_cuda_graphs", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq",
                 "gc_debug"},
}
AC_SUBCOMMANDS_030 = {"selective", "full", "memory-budget", "none"}

LAYOUTS = {
    "70B TP4 PP8 VP5 DP2 ZeRO-1": layout_plan([2] * 40, pp=8, chunks=5, schedule="interleaved-1f1b", tp=4, dp=2,
                                              zero=1, sequence_parallel=True),
    "uneven 1F1B, TP2, recompute": layout_plan([3, 4, 5, 2], pp=4, tp=2, dp=1, activations=["recompute"] * 17),
    "ZB-V, DP2 FSDP": layout_plan([3, 3, 3, 3], pp=2, chunks=2, schedule="zbv", v_shape=True, dp=2, zero=3),
    "FSDP 8": layout_plan([6], pp=1, dp=8, zero=3),
    "DDP 2 x PP 2, half recomputed": layout_plan([4, 4], pp=2, dp=2, activations=["keep", *["keep", "recompute"] * 4,
                                                                                  "keep", "keep"]),
}


def _settings(name, seq=4096):
    job = job_from_plan(LAYOUTS[name], seq_len=seq)
    return job, torchtitan_settings(job)


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_toml_parses_and_sets_only_keys_of_jobconfig(name):
    job, s = _settings(name)
    parsed = tomllib.loads(to_toml(s, ["a header"]))
    assert parsed == s.sections
    for section, keys in parsed.items():
        for key, value in keys.items():
            want = JOBCONFIG_022[section][key]
            assert value in want if isinstance(want, tuple) else isinstance(value, want), (section, key, value)
    lay = job.layout
    par = parsed["parallelism"]
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == lay.dp
    assert par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] * lay.dp == lay.devices
    assert parsed["training"]["global_batch_size"] == lay.global_batch
    assert parsed["training"]["local_batch_size"] % par["pipeline_parallel_microbatch_size"] == 0


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_model_parts_hold_every_module_once_in_the_plans_stages(name):
    job, s = _settings(name)
    parts = s.sections["parallelism"].get("module_fqns_per_model_part")
    if job.layout.pp == 1:
        assert parts is None
        return
    flat = [m for part in parts for m in part]
    assert flat == ["tok_embeddings", *(f"layers.{i}" for i in range(job.blocks)), "norm", "output"]
    assert [sum(m.startswith("layers.") for m in part) for part in parts] == [p.blocks for p in job.parts]


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_command_line_sets_only_options_of_torchtitan_0_3(name):
    job, s = _settings(name)
    args = s.overrides
    assert args[-1].split(":")[0] == "activation-checkpoint" and args[-1].split(":")[1] in AC_SUBCOMMANDS_030
    for arg in args[:-1]:
        if arg.startswith("--"):
            section, key = arg[2:].split(".", 1)
            assert key.removeprefix("no_") in CLI_030[section], arg
    assert ("--training.disable_cuda_graphs" in args) == (job.layout.pp > 1)   # 0.3 refuses CUDA graphs under PP


def test_schedules_are_the_names_torch_maps_to_the_same_classes():
    for name, titan in SCHEDULES.items():
        cls = get_schedule_class(titan)
        assert cls.__name__ == (method(name).torch_class or {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}[name])


def test_zero_levels_and_activation_policies():
    _, s = _settings("ZB-V, DP2 FSDP")
    par = s.sections["parallelism"]
    assert (par["data_parallel_shard_degree"], par["fsdp_reshard_after_forward"]) == (2, "always")
    assert par["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    _, s = _settings("70B TP4 PP8 VP5 DP2 ZeRO-1")
    assert s.sections["parallelism"]["fsdp_reshard_after_forward"] == "never"
    assert any("ZeRO-1" in n for n in s.notes)
    _, s = _settings("DDP 2 x PP 2, half recomputed")
    assert s.sections["parallelism"]["data_parallel_replicate_degree"] == 2
    assert s.sections["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}
    assert any("DDP" in n for n in s.notes) and s.overrides[-1] == "activation-checkpoint:full"
    _, s = _settings("uneven 1F1B, TP2, recompute")
    assert s.sections["activation_checkpoint"] == {"mode": "full"}
    assert "--parallelism.no_enable_sequence_parallel" in s.overrides
    assert s.sections["parallelism"]["disable_loss_parallel"] is True and any("lp=1" in n for n in s.notes)


def test_the_layouts_loss_parallel_is_torchtitans():
    for lp in (False, True):
        plan = layout_plan([2, 2], pp=2, tp=2, loss_parallel=lp)
        s = torchtitan_settings(job_from_plan(plan, seq_len=2048))
        assert s.sections["parallelism"]["disable_loss_parallel"] is (not lp)
        assert any("disable_loss_parallel" in n for n in s.notes) is (not lp)
        assert not any("loss_parallel" in x for x in s.overrides)      # torchtitan 0.3 has no such option


def test_default_split_by_hand_and_the_split_settings():
    # 34 = 32 blocks + 1 + 1 over 4 stages: 9, 9, 8, 8 less the embedding and the head
    assert default_split(32, 4, 1, 1) == [8, 9, 8, 7]
    assert default_split(80, 40, 0, 0) == [2] * 40
    _, s = _settings("ZB-V, DP2 FSDP")                    # [3, 3, 3, 3]: 12 + 0 + 0 over 4
    args = s.overrides
    assert args[args.index("--parallelism.pipeline_parallel_layers_per_stage") + 1] == "3"
    _, s = _settings("uneven 1F1B, TP2, recompute")        # [3, 4, 5, 2]: no even split gives it
    assert "--parallelism.pipeline_parallel_layers_per_stage" not in s.overrides
    assert any("module_fqns_per_model_part" in n and "lm_head" in n for n in s.notes)


def test_default_split_is_torchtitans_own():
    pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    split = getattr(pp, "_generate_llm_fqn_per_model_part", None)
    if split is None:
        pytest.skip("this torchtitan has no _generate_llm_fqn_per_model_part")
    for blocks, stages, first, last in [(32, 4, 1, 1), (80, 40, 0, 0), (12, 4, 0, 0), (61, 8, 2, 1), (7, 3, 1, 0)]:
        got = [sum(m.startswith("layers.") for m in part) for part in split(stages, blocks, first, last)]
        assert got == default_split(blocks, stages, first, last)


def test_torchtitans_config_classes_take_the_settings():
    configs = pytest.importorskip("torchtitan.config.configs")
    for name in LAYOUTS:
        _, s = _settings(name)
        keep = CLI_030["parallelism"]
        par = configs.ParallelismConfig(**{k: v for k, v in s.sections["parallelism"].items() if k in keep})
        training = configs.TrainingConfig(**s.sections["training"])
        assert par.tensor_parallel_degree == s.sections["parallelism"]["tensor_parallel_degree"]
        assert training.global_batch_size == s.sections["training"]["global_batch_size"]


def test_tp_overlap_is_torchs_async_tp_under_compile():
    import tomllib

    for tpo in (False, True):
        plan = layout_plan([2, 2], pp=2, tp=2, sequence_parallel=True, tp_overlap=tpo)
        s = torchtitan_settings(job_from_plan(plan, seq_len=2048))
        assert s.sections["parallelism"]["enable_async_tensor_parallel"] is tpo
        assert ("compile" in s.sections) is tpo and any("async TP" in n for n in s.notes) is tpo
        if tpo:
            assert tomllib.loads(to_toml(s))["compile"] == {"enable": True}


def test_dp_overlap_names_fsdp_as_the_closest():
    for dpo in (False, True):
        plan = layout_plan([4], pp=1, dp=8, zero=1, tp=1, dp_overlap=dpo)
        s = torchtitan_settings(job_from_plan(plan, seq_len=2048))
        assert any("dpo=1" in n and "zero=2" in n for n in s.notes) is dpo
        assert s.sections["parallelism"]["data_parallel_shard_degree"] == 8
