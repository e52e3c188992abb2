"""scripts/gpu_validation.py without a GPU: its smoke test (the tiny mlp on the CPU) in both dtypes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import gpu_validation  # noqa: E402


def test_profile_files_keep_the_dtypes_apart():
    out = Path("o")
    assert gpu_validation.profile_file(out, "vgg16").name == "vgg16.csv"
    assert gpu_validation.profile_file(out, "vgg16", "bfloat16").name == "vgg16-bf16.csv"
    assert "mlp-P2" not in gpu_validation.DEFAULT_RUNS and "mlp" not in gpu_validation.DEFAULT_PROFILES


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_smoke_run(tmp_path, dtype):
    from workbench.profiles import read_profile
    from workbench.runtime.engine import grad_tolerance

    out = tmp_path / "gpu"
    rc = gpu_validation.main(["--device", "cpu", "--quick", "--dtype", dtype, "--profiles", "mlp",
                              "--runs", "mlp-P2", "--out", str(out)])
    assert rc == 0
    assert json.loads((out / "env.json").read_text())["dtype"] == dtype
    prof = gpu_validation.profile_file(out, "mlp", dtype)
    assert read_profile(prof).meta["dtype"] == dtype
    val = pd.read_csv(out / "validation.csv")
    assert list(val["run"]) == ["mlp-P2"] and val.loc[0, "dtype"] == dtype and val.loc[0, "profile"] == prof.stem
    # allocator-level memory holds more than rule 7 (gradient buffers, optimizer state, ...)
    assert val.loc[0, "replay_memory_error_max"] > 0 and val.loc[0, "shared_memory_error_max"] > 0
    assert val.loc[0, "shared_max_grad_error"] <= grad_tolerance(dtype)
    # a second call into the same folder keeps the first call's rows (validation.csv is every row.json)
    (out / "runs" / "other").mkdir()
    (out / "runs" / "other" / "row.json").write_text(json.dumps({"run": "other", "dtype": dtype}))
    assert list(gpu_validation.validation_table(out)["run"]) == ["mlp-P2", "other"]


def test_a_profile_of_the_other_dtype_is_refused(tmp_path):
    out = tmp_path / "gpu"
    assert gpu_validation.main(["--device", "cpu", "--quick", "--profiles", "mlp", "--only-profiles",
                                "--out", str(out)]) == 0
    (out / "profiles" / "mlp.csv").rename(gpu_validation.profile_file(out, "mlp", "bfloat16"))
    with pytest.raises(ValueError, match="measured in float32, not bfloat16"):
        gpu_validation.validate(out, "mlp-P2", 4, "cpu", "bfloat16")
