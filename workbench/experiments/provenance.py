"""What made a result: the model code's version, a profile's digest, the package versions.

A cached result is reused only if everything that determines it is unchanged
(docs/model.md, "Cached results"). Two digests stand for the inputs that are
not plain settings:

* :func:`code_version`: a SHA-256 over the source of every module that
  computes results (the model, the planners, the checker and simulator, the
  profile readers, the experiments' unit code). Each module is hashed as its
  syntax tree without docstrings, so comments, docstrings and formatting do
  not count, while any change to what the code does does. Modules that only
  show, store or run results (``viz/``, ``runtime/``, the CLI, the report,
  the profiler) are left out: :data:`NOT_MODEL`.
* :func:`file_digest`: a SHA-256 of a profile file's bytes.

>>> len(code_version()), code_version() == code_version()
(16, True)
>>> with_doc = 'def f(x):\\n    "doc"\\n    return x  # note\\n'
>>> _normalised_source(with_doc) == _normalised_source('def f(x):\\n    return x\\n')
True
"""

from __future__ import annotations

import ast
import datetime as _dt
import hashlib
import platform as _pyplatform
import sys
from functools import lru_cache
from pathlib import Path

__all__ = ["code_version", "model_sources", "file_digest", "versions", "NOT_MODEL"]

_PACKAGE = Path(__file__).resolve().parents[1]

#: paths (relative to the package) of what does not change a result: presentation, storage, running plans
NOT_MODEL = (
    "__init__.py", "__main__.py", "io.py", "paths.py", "front/", "viz/", "runtime/", "experiments/__init__.py",
    "experiments/report.py", "experiments/analyses.py", "experiments/figures.py", "experiments/provenance.py",
    "experiments/executors.py",
    "profiles/profiler.py", "profiles/zoo.py", "profiles/compare.py", "profiles/memtrace.py", "profiles/discover.py",
    "profiles/wrappers.py", "profiles/usermodel.py", "profiles/timing.py", "profiles/workload.py", "profiles/found.py",
    "profiles/blocks_route.py", "profiles/tied_counts.py", "profiles/cache.py",
)


def model_sources() -> list[Path]:
    """The source files :func:`code_version` hashes, sorted (every ``.py`` of the package not in :data:`NOT_MODEL`)."""
    out = []
    for p in sorted(_PACKAGE.rglob("*.py")):
        rel = p.relative_to(_PACKAGE).as_posix()
        if not any(rel == n or (n.endswith("/") and rel.startswith(n)) for n in NOT_MODEL):
            out.append(p)
    return out


def _normalised_source(text: str) -> str:
    """The syntax tree of ``text`` without docstrings, as a string (comments and layout drop out)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            if doc and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


@lru_cache(maxsize=1)
def code_version() -> str:
    """16 hex digits naming the model code (see the module docstring); computed once per process."""
    h = hashlib.sha256()
    for p in model_sources():
        h.update(p.relative_to(_PACKAGE).as_posix().encode() + b"\n")
        h.update(_normalised_source(p.read_text(encoding="utf-8")).encode() + b"\n")
    return h.hexdigest()[:16]


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def versions() -> dict[str, str]:
    """Versions of what made the results (workbench, its code version, python, numpy, pandas, pyomo, highspy), host,
    date."""
    out = {"python": sys.version.split()[0], "host": _pyplatform.node(), "code_version": code_version(),
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    for mod in ("workbench", "numpy", "pandas", "pyomo", "highspy", "plotly"):
        try:
            m = __import__(mod)
            v = getattr(m, "__version__", None)
            if v is None and mod == "highspy":
                from importlib.metadata import version

                v = version("highspy")
            out[mod] = str(v)
        except Exception:  # noqa: BLE001
            out[mod] = "unavailable"
    try:
        import subprocess

        out["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_PACKAGE.parent, capture_output=True,
                                    text=True, timeout=5).stdout.strip()
    except Exception:  # noqa: BLE001
        out["git"] = ""
    return out
