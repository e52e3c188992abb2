"""The project's profile format: CSV with ``# key: value`` metadata lines (DESIGN.md section 2).

Columns ``name,forward_ms,backward_ms,weight_bytes,activation_bytes[,saved_bytes]``
(``cut_bytes`` is also accepted, for chains linearised from a DAG), then the
profiler's memory columns, each optional (``grad_bytes``, ``max_param_bytes``,
``saved_input_bytes``, ``saved_output_bytes``, ``forward_peak_bytes``,
``backward_peak_bytes``: docs/model.md, "Memory"; a profile without them still
loads and the memory model estimates them). Bad input is refused with a
:class:`ProfileError` naming the file, row and column.

>>> import tempfile, pathlib
>>> from workbench.chain import Chain, Layer
>>> c = Chain((Layer("a", 0.001, 0.002, 10, 4),), meta={"network": "toy"})
>>> p = pathlib.Path(tempfile.mkdtemp()) / "toy.csv"
>>> write_profile(c, p)
>>> read_profile(p).layers[0].forward
0.001
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from ..chain import MEMORY_COLUMNS, Chain, Layer
from ..io import write_text_atomic

__all__ = ["ProfileError", "read_profile", "write_profile", "parse_profile_text", "REQUIRED_COLUMNS"]

REQUIRED_COLUMNS = ["name", "forward_ms", "backward_ms", "weight_bytes", "activation_bytes"]
OPTIONAL_COLUMNS = ["saved_bytes", "cut_bytes", *MEMORY_COLUMNS]


class ProfileError(ValueError):
    """A profile file that cannot be read; the message names file, row and column."""


def _number(text: str, where: str, column: str, *, optional: bool = False) -> float | None:
    s = text.strip() if text is not None else ""
    if s == "":
        if optional:
            return None
        raise ProfileError(f"{where}, column '{column}': empty value")
    try:
        v = float(s)
    except ValueError:
        raise ProfileError(f"{where}, column '{column}': not a number: {text!r}") from None
    if math.isnan(v):
        raise ProfileError(f"{where}, column '{column}': NaN is not allowed")
    if math.isinf(v):
        raise ProfileError(f"{where}, column '{column}': infinite value")
    if v < 0:
        raise ProfileError(f"{where}, column '{column}': negative value {v}")
    return v


def parse_profile_text(text: str, source: str = "<string>") -> Chain:
    """Parse the CSV profile format from a string; ``source`` names it in errors."""
    meta: dict[str, str] = {}
    body: list[tuple[int, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("#"):
            kv = stripped.lstrip("#").strip()
            if ":" in kv:
                k, v = kv.split(":", 1)
                meta[k.strip()] = v.strip()
            continue
        if stripped:
            body.append((lineno, line))
    if not body:
        raise ProfileError(f"{source}: empty profile (no header and no layers)")
    header_line, header = body[0]
    columns = [c.strip() for c in next(csv.reader([header]))]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise ProfileError(
            f"{source}, line {header_line}: missing column(s) {missing}; the header must have "
            f"{','.join(REQUIRED_COLUMNS)}[,saved_bytes]"
        )
    rows = body[1:]
    if not rows:
        raise ProfileError(f"{source}: empty chain (a header but no layer rows)")
    layers: list[Layer] = []
    cuts: list[float | None] = []
    seen: dict[str, int] = {}
    for row_no, (lineno, line) in enumerate(rows, start=1):
        values = next(csv.reader([line]))
        where = f"{source}, row {row_no} (line {lineno})"
        if len(values) != len(columns):
            raise ProfileError(f"{where}: {len(values)} fields, expected {len(columns)} ({','.join(columns)})")
        rec = dict(zip(columns, values))
        name = rec["name"].strip()
        if not name:
            raise ProfileError(f"{where}, column 'name': empty layer name")
        if name in seen:
            raise ProfileError(f"{where}, column 'name': duplicate layer name {name!r} (first at row {seen[name]})")
        seen[name] = row_no
        nums = {c: _number(rec[c], where, c) for c in REQUIRED_COLUMNS[1:]}
        saved = _number(rec["saved_bytes"], where, "saved_bytes", optional=True) if "saved_bytes" in rec else None
        cuts.append(_number(rec["cut_bytes"], where, "cut_bytes", optional=True) if "cut_bytes" in rec else None)
        extra = {c: _number(rec[c], where, c, optional=True) for c in MEMORY_COLUMNS if c in rec}
        layers.append(Layer(name, nums["forward_ms"] / 1e3, nums["backward_ms"] / 1e3,
                            nums["weight_bytes"], nums["activation_bytes"], saved, **extra))
    input_bytes = 0.0
    if "input_bytes" in meta:
        input_bytes = _number(meta["input_bytes"], f"{source}, metadata", "input_bytes") or 0.0
    cut_bytes = None
    if any(c is not None for c in cuts[:-1]):
        cut_bytes = tuple(c if c is not None else layers[i].activation_bytes for i, c in enumerate(cuts[:-1]))
    meta.setdefault("source_file", source)
    return Chain(tuple(layers), input_bytes=input_bytes, cut_bytes=cut_bytes, meta=meta)


def read_profile(path: str | Path) -> Chain:
    """Read a CSV profile; see the module docstring for the format."""
    path = Path(path)
    if not path.exists():
        raise ProfileError(f"{path}: no such profile file")
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise ProfileError(f"{path}: not a text file ({e})") from None
    return parse_profile_text(text, str(path))


_META_ORDER = ["network", "device", "batch_size", "dtype", "input_bytes", "torch", "source", "date"]


def write_profile(chain: Chain, path: str | Path) -> None:
    """Write ``chain`` as a CSV profile (atomically), metadata first."""
    meta = {k: v for k, v in chain.meta.items() if k != "source_file"}
    if chain.input_bytes and "input_bytes" not in meta:
        meta["input_bytes"] = f"{chain.input_bytes:.0f}"
    keys = [k for k in _META_ORDER if k in meta] + sorted(k for k in meta if k not in _META_ORDER)
    buf = io.StringIO()
    for k in keys:
        buf.write(f"# {k}: {meta[k]}\n")
    memory = [c for c in MEMORY_COLUMNS if any(getattr(l, c) is not None for l in chain.layers)]
    cols = REQUIRED_COLUMNS + ["saved_bytes"] + (["cut_bytes"] if chain.cut_bytes is not None else []) + memory
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for i, l in enumerate(chain.layers):
        row = [l.name, repr(l.forward * 1e3), repr(l.backward * 1e3), f"{l.weight_bytes:.0f}",
               f"{l.activation_bytes:.0f}", f"{chain.saved(i):.0f}"]
        if chain.cut_bytes is not None:
            row.append(f"{chain.cut(i):.0f}")
        row += ["" if getattr(l, c) is None else f"{getattr(l, c):.0f}" for c in memory]
        w.writerow(row)
    write_text_atomic(path, buf.getvalue())
