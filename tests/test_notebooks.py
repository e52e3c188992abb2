"""The notebooks, read as files: times and sizes go through the unit helpers, and the claims their text makes
about committed data hold (the notebooks themselves run, and assert their live claims, under nbmake)."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from workbench.paths import DATA_DIR

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
#: a value converted by hand and formatted into text: ``{p.period * 1e3:.1f}``, ``{x / 2**30:.2f}``
HAND_FORMATTED = re.compile(r"\{[^{}]*(\*\s*1e3|\*\s*1000|/\s*1e3|/\s*2\s*\*\*\s*(10|20|30)|/\s*1e[69]|/\s*GiB|/\s*MiB)"
                            r"[^{}]*:[^{}]*\}")


def _code(path: Path) -> list[tuple[int, str]]:
    cells = json.loads(path.read_text())["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_text_writes_times_and_sizes_through_the_unit_helpers(path):
    """A number written into text picks its unit by magnitude (format_seconds, format_bytes, format_column,
    readable), so a period of 1.3 s never reads "1,277 ms" in one place and "1.28 s" in the next."""
    bad = [f"cell {i}: {m.group(0)}" for i, src in _code(path) for m in HAND_FORMATTED.finditer(src)]
    assert not bad, f"{path.name} formats a hand-converted unit: " + "; ".join(bad)


def test_the_pattern_catches_what_it_should():
    assert HAND_FORMATTED.search('f"period {p.period * 1e3:.2f} ms"')
    assert HAND_FORMATTED.search('f"{m / 2**30:.2f} GiB"')
    assert not HAND_FORMATTED.search('f"period {format_seconds(p.period)}"')
    assert not HAND_FORMATTED.search("assert round(x * 1e3, 2) == 10.44")


def test_the_committed_cpu_runs_agree_with_notebook_05s_text():
    """'the worst memory error ... within 2.1 %', 'the gradient error against one process (0: bit for bit)'."""
    index = pd.read_csv(DATA_DIR / "runs" / "index.csv")
    assert len(index) >= 10
    assert index["max_memory_error"].abs().max() <= 0.021
    assert (index["max_grad_error"] == 0).all()


NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_notebook_08s_shipped_profile_is_its_model_to_the_byte(quick, tmp_path):
    """Notebook 08 plans on a shipped profile (the same plans on every run): it must be the model my_gpt2.py builds
    in that mode, byte column for byte column, timed on one thread with the CPU clock; a fresh profile of the model
    (another process, the mode set by WORKBENCH_QUICK) is the independent check."""
    import os
    import subprocess
    import sys

    from workbench.model.chain import OPTIONAL_COLUMNS
    from workbench.profiles import load_profile

    shipped = load_profile(NOTEBOOKS_DIR / ("my_gpt2-quick.csv" if quick else "my_gpt2.csv"))
    assert shipped.meta["module"] == "my_gpt2.py:build" and shipped.meta["threads"] == "1"
    assert "thread_time" in shipped.meta["timing"]
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_QUICK"} | ({"WORKBENCH_QUICK": "1"} if quick else {})
    out = tmp_path / "fresh.csv"
    subprocess.run([sys.executable, "-m", "workbench", "profile", "--module", str(NOTEBOOKS_DIR / "my_gpt2.py:build"),
                    "--repeats", "1", "--warmup", "0", "--out", str(out)], env=env, check=True, capture_output=True)
    fresh = load_profile(out)
    assert [l.name for l in fresh.layers] == [l.name for l in shipped.layers]
    for a, b in zip(fresh.layers, shipped.layers):
        for column in ("weight_bytes", "activation_bytes", "weight_pending_bytes") + OPTIONAL_COLUMNS:
            assert getattr(a, column) == getattr(b, column), (a.name, column)
    assert fresh.meta["tied"] == shipped.meta["tied"]


def test_notebook_08s_plans_are_the_same_on_every_call():
    """The plans the notebook shows: planned twice on its shipped profiles, the same allocation, schedule and memory;
    the general ILP on work budgets that no wall clock cut short."""
    from workbench.model.target import Target
    from workbench.planners import plan
    from workbench.profiles import load_profile

    for name in ("my_gpt2-quick.csv", "my_gpt2.csv"):
        chain = load_profile(NOTEBOOKS_DIR / name)
        made = [(plan(chain, Target.of(2, bandwidth="12GB/s"), "dp"),
                 plan(chain, Target.of(2, bandwidth="12GB/s", weights="single"), "ilp", allocation="general",
                      time_limit=20, deterministic=True)) for _ in range(2)]
        for first, second in zip(*made):
            assert first.assignment == second.assignment and first.period == second.period
            assert first.memory == second.memory and [s.in_flight for s in first.stages] == \
                [s.in_flight for s in second.stages]
        ilp = made[0][1]
        assert ilp.extra.get("deterministic") and not ilp.extra.get("may_vary")
        assert ilp.period <= made[0][0].period * (1 + 1e-9)
