"""The project's profile format: CSV with ``# key: value`` metadata lines (docs/model.md, "Instance").

Columns ``name,forward_ms,backward_ms,weight_bytes,activation_bytes[,saved_bytes]``
(``cut_bytes`` is also accepted, for chains linearised from a DAG), then the
profiler's memory columns, each optional (``grad_bytes``, ``max_param_bytes``,
``saved_input_bytes``, ``saved_output_bytes``, ``forward_peak_bytes``,
``backward_peak_bytes``: docs/model.md, "Memory"; a profile without them still
loads and the memory model estimates them), and the backward's split, also optional
(``backward_weight_ms``, the weight-gradient share of ``backward_ms``, and
``weight_pending_bytes``: docs/model.md, "Backward split"), and a tensor-parallel profile's collective bytes,
also optional (``comm_forward_bytes``, ``comm_backward_bytes``: docs/model.md, "Tensor parallelism"); other
columns are read past. Bad
input is refused with a :class:`ProfileError` naming the file, row and column:
a column named twice, a value that is not a finite non-negative number, and
values no measurement gives (a layer time over ``MAX_LAYER_MS`` or, other than 0,
under ``MIN_LAYER_MS``, a size in any column over ``MAX_BYTES`` (``weight_pending_bytes`` too), every layer taking
no time: :func:`check_values`, which every loader runs), and metadata the workbench
computes with out of its range (:func:`check_meta`: ``runtime_bytes``, ``input_bytes``,
``batch_size``, ``dtype``, ``tied``, ``model_config``). A profile with no memory at all (every weight and activation 0)
loads with a :class:`ProfileWarning`. A UTF-8 byte-order mark is skipped.

>>> import tempfile, pathlib
>>> from workbench.model.chain import Chain, Layer
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

from workbench.io import write_text_atomic
from workbench.model.chain import COMM_FIELDS, MEMORY_COLUMNS, OVERLAP_FIELDS, Chain, Layer
from workbench.model.units import MAX_BYTES, bytes_value

__all__ = ["ProfileError", "ProfileWarning", "read_profile", "write_profile", "parse_profile_text", "check_values",
           "check_meta", "batch_size_of", "REQUIRED_COLUMNS", "MAX_LAYER_MS", "MIN_LAYER_MS", "MAX_BYTES", "DTYPES"]

REQUIRED_COLUMNS = ["name", "forward_ms", "backward_ms", "weight_bytes", "activation_bytes"]
#: the backward split's columns (docs/model.md, "Backward split"): column -> (Layer field, scale to seconds/bytes)
SPLIT_COLUMNS = {"backward_weight_ms": ("backward_weight", 1e-3), "weight_pending_bytes": ("weight_pending_bytes", 1.0),
                 # tensor parallelism's collectives in ms, overlapped or not (docs/model.md, "Communication overlap")
                 **{f"{f}_ms": (f, 1e-3) for f in OVERLAP_FIELDS}}
OPTIONAL_COLUMNS = ["saved_bytes", "cut_bytes", *MEMORY_COLUMNS, *SPLIT_COLUMNS, *COMM_FIELDS]


#: a layer's forward or backward time above this (ms; about 2.8 hours per mini-batch) is not a measurement
MAX_LAYER_MS = 1e7
#: a layer's time below this but above 0 (ms; a nanosecond) is not a measurement either (write 0 for none)
MIN_LAYER_MS = 1e-6
#: the precisions a profile's ``dtype`` names (what the profilers write)
DTYPES = ("float32", "bfloat16", "float16", "float64")


class ProfileError(ValueError):
    """A profile file that cannot be read; the message names file, row and column."""


class ProfileWarning(UserWarning):
    """A profile that loads but is probably not what was meant (e.g. it holds no memory at all)."""


def check_values(chain: Chain, source: str) -> Chain:
    """``chain`` if its values can come from a measurement; else a :class:`ProfileError` naming
    ``source`` and the layer. Warns (:class:`ProfileWarning`) when no layer holds any memory.

    >>> from workbench.model.chain import Chain, Layer
    >>> check_values(Chain((Layer("a", 1e297, 0.0),)), "p.csv")
    Traceback (most recent call last):
    workbench.profiles.csvio.ProfileError: p.csv, layer 1 ('a'): forward_ms 1e+300 is above 1e+07 ms; not a measurement
    """
    limits = [("forward", "forward_ms", 1e3, MAX_LAYER_MS), ("backward", "backward_ms", 1e3, MAX_LAYER_MS)]
    limits += [(c, c, 1.0, MAX_BYTES) for c in ("weight_bytes", "activation_bytes", "saved_bytes", *MEMORY_COLUMNS,
                                                "weight_pending_bytes", *COMM_FIELDS)]
    for i, layer in enumerate(chain.layers):
        for attr, column, scale, top in limits:
            v = getattr(layer, attr)
            unit = "ms" if scale != 1.0 else "bytes"
            if v is not None and v * scale > top:
                raise ProfileError(f"{source}, layer {i + 1} ({layer.name!r}): {column} {v * scale:.6g} is above "
                                   f"{top:.6g} {unit}; not a measurement")
            if unit == "ms" and 0 < v * scale < MIN_LAYER_MS:
                raise ProfileError(f"{source}, layer {i + 1} ({layer.name!r}): {column} {v * scale:.6g} is below "
                                   f"{MIN_LAYER_MS:.6g} ms (a nanosecond); not a measurement (0: no time)")
    cuts = chain.cut_bytes or ()
    for i, c in enumerate(cuts):
        if c > MAX_BYTES:
            raise ProfileError(f"{source}, layer {i + 1} ({chain[i].name!r}): cut_bytes {c:.6g} is above "
                               f"{MAX_BYTES:.6g} bytes; not a measurement")
    if chain.input_bytes > MAX_BYTES:
        raise ProfileError(f"{source}, metadata: input_bytes {chain.input_bytes:.6g} is above {MAX_BYTES:.6g} bytes")
    check_meta(chain.meta, [l.name for l in chain.layers], source)
    if not any(l.forward > 0 or l.backward > 0 for l in chain.layers):
        raise ProfileError(f"{source}: every layer has zero forward and backward time; there is nothing to plan")
    if not any(l.weight_bytes > 0 or l.activation_bytes > 0 or (l.saved_bytes or 0) > 0 for l in chain.layers):
        import warnings

        warnings.warn(f"{source}: every weight and activation size is 0; plans will hold no memory",
                      ProfileWarning, stacklevel=2)
    return chain


def check_meta(meta: dict, names: list[str], source: str) -> None:
    """The metadata values the workbench computes with, each within what a measurement gives: ``runtime_bytes``
    and ``input_bytes`` (0 to 1 PiB), ``batch_size`` (a whole number from 1 or ``unknown``, as PipeDream's
    graphs leave it, a note may follow: :func:`batch_size_of`), ``dtype``
    (:data:`DTYPES`), ``tied`` (shared parameters of the profile's layers, docs/model.md) and ``model_config``
    (a JSON object); a :class:`ProfileError` naming ``source`` and the key otherwise.

    >>> check_meta({"runtime_bytes": "-5000000000"}, ["a"], "p.csv")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    workbench.profiles.csvio.ProfileError: p.csv, metadata: runtime_bytes -5000000000: must be a number of bytes ...
    """
    where = f"{source}, metadata"
    try:
        for key in ("runtime_bytes", "input_bytes"):
            if str(meta.get(key, "")).strip():
                bytes_value(meta[key], key)
        batch_size_of(meta, source)
        if str(meta.get("dtype", "")).strip() and meta["dtype"] not in DTYPES:
            raise ValueError(f"dtype {meta['dtype']!r}: must be one of {', '.join(DTYPES)}")
        if str(meta.get("model_config", "")).strip() and not isinstance(_json(meta["model_config"], "model_config"),
                                                                         dict):
            raise ValueError("model_config: must be a JSON object")
        if str(meta.get("tied", "")).strip():
            _check_tied(_json(meta["tied"], "tied"), names)
    except ProfileError:
        raise
    except ValueError as e:
        raise ProfileError(f"{where}: {e}") from None


def batch_size_of(meta: dict, source: str = "profile") -> int | None:
    """The metadata's ``batch_size``: a whole number from 1, perhaps with a note after it (PipeDream's: where
    it was inferred from); None where it is missing or ``unknown`` (a PipeDream graph records none, and the
    loader could not infer it); a :class:`ProfileError` naming ``source`` for anything else.

    >>> batch_size_of({"batch_size": "128 (inferred from the classifier output, fp32)"})
    128
    >>> batch_size_of({"batch_size": "unknown (PipeDream's graph.txt does not record it)"}) is None
    True
    >>> batch_size_of({"batch_size": "0"}, "p.csv")
    Traceback (most recent call last):
    workbench.profiles.csvio.ProfileError: p.csv, metadata: batch_size 0: must be a whole number from 1 or unknown
    """
    text = str(meta.get("batch_size", "")).strip()
    if not text or text.split()[0] == "unknown":
        return None
    where = f"{source}, metadata"
    b = _number(text.split()[0], where, "batch_size")
    if b is None or b < 1 or b != int(b):
        raise ProfileError(f"{where}: batch_size {meta['batch_size']}: must be a whole number from 1 or unknown")
    return int(b)


def _json(text: str, key: str) -> object:
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{key}: not JSON ({e.msg} at character {e.pos})") from None


def _check_tied(tied: object, names: list[str]) -> None:
    """``tied``: a list of {"owner", "layers" (owner first, each a layer of the profile), "bytes", "parameter"}."""
    if not isinstance(tied, list):
        raise ValueError("tied: must be a JSON list of shared parameters")
    for k, t in enumerate(tied, start=1):
        if not isinstance(t, dict) or not {"owner", "layers", "bytes"} <= set(t):
            raise ValueError(f"tied, entry {k}: must hold owner, layers and bytes")
        layers = t["layers"]
        if not isinstance(layers, list) or len(layers) < 2 or layers[0] != t["owner"]:
            raise ValueError(f"tied, entry {k}: layers must list the owner first and at least one other layer")
        unknown = [n for n in layers if n not in names]
        if unknown:
            raise ValueError(f"tied, entry {k}: {unknown} are not layers of the profile")
        bytes_value(t["bytes"], f"tied, entry {k}: bytes")


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
    text = text.removeprefix("\ufeff")  # a byte-order mark (spreadsheets write one)
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
    for j, c in enumerate(columns):
        if c in columns[:j]:
            raise ProfileError(f"{source}, line {header_line}: column {c!r} appears twice (columns "
                               f"{columns.index(c) + 1} and {j + 1}); which one holds the values is ambiguous")
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
        extra = {c: _number(rec[c], where, c, optional=True) for c in MEMORY_COLUMNS + COMM_FIELDS if c in rec}
        for c, (f, scale) in SPLIT_COLUMNS.items():
            value = _number(rec[c], where, c, optional=True) if c in rec else None
            extra[f] = None if value is None else value * scale
        weight = extra.get("backward_weight")
        if weight is not None and weight > nums["backward_ms"] / 1e3 * (1 + 1e-9):
            raise ProfileError(f"{where}, column 'backward_weight_ms': {rec['backward_weight_ms']} ms is more than the "
                               f"layer's backward_ms {rec['backward_ms']} (it is a part of it)")
        layers.append(Layer(name, nums["forward_ms"] / 1e3, nums["backward_ms"] / 1e3,
                            nums["weight_bytes"], nums["activation_bytes"], saved, **extra))
    input_bytes = 0.0
    if "input_bytes" in meta:
        input_bytes = _number(meta["input_bytes"], f"{source}, metadata", "input_bytes") or 0.0
    cut_bytes = None
    if any(c is not None for c in cuts[:-1]):
        cut_bytes = tuple(c if c is not None else layers[i].activation_bytes for i, c in enumerate(cuts[:-1]))
    meta.setdefault("source_file", source)
    check_meta(meta, [l.name for l in layers], source)
    return check_values(Chain(tuple(layers), input_bytes=input_bytes, cut_bytes=cut_bytes, meta=meta), source)


def read_profile(path: str | Path) -> Chain:
    """Read a CSV profile; see the module docstring for the format."""
    path = Path(path)
    if not path.exists():
        raise ProfileError(f"{path}: no such profile file")
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ProfileError(f"{path}: is a folder, not a profile file") from None
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
    for k in keys:       # one line each: a value of several lines (a linearisation's summary) joined by " | "
        value = " | ".join(line.strip() for line in str(meta[k]).splitlines() if line.strip())
        buf.write(f"# {k}: {value}\n")
    memory = [c for c in MEMORY_COLUMNS + COMM_FIELDS if any(getattr(l, c) is not None for l in chain.layers)]
    split = [c for c, (f, _) in SPLIT_COLUMNS.items() if any(getattr(l, f) is not None for l in chain.layers)]
    cols = (REQUIRED_COLUMNS + ["saved_bytes"] + (["cut_bytes"] if chain.cut_bytes is not None else []) + memory
            + split)
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for i, l in enumerate(chain.layers):
        row = [l.name, repr(l.forward * 1e3), repr(l.backward * 1e3), f"{l.weight_bytes:.0f}",
               f"{l.activation_bytes:.0f}", f"{chain.saved(i):.0f}"]
        if chain.cut_bytes is not None:
            row.append(f"{chain.cut(i):.0f}")
        row += ["" if getattr(l, c) is None else f"{getattr(l, c):.0f}" for c in memory]
        for c in split:
            f, scale = SPLIT_COLUMNS[c]
            value = getattr(l, f)
            row.append("" if value is None else (repr(value / scale) if scale != 1.0 else f"{value:.0f}"))
        w.writerow(row)
    write_text_atomic(path, buf.getvalue())
