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
