"""A profile's times for the GPU a plan names: a fake profile re-estimated from its stored operations, or refused.

A plan made with ``--gpu NAME`` takes that GPU's memory and links; its times must be that GPU's too, never
another device's under its name. A fake profile (:mod:`workbench.profiles.fake`) stores what it needs to be
priced again: in its metadata, ``work``, every layer's operations (kind, precision, alignment, FLOPs and
bytes) in the order they run (:func:`encode_works`: the distinct operations once, runs of them per distinct
phase, a phase per layer), so that :func:`retimed` estimates its times for any GPU
(:mod:`workbench.profiles.kernel_time`). What cannot be
re-estimated is refused in one line by :func:`chain_for_gpu`: a profile measured on a CPU or on another GPU,
or a fake profile made for another GPU without its operations.

>>> from workbench.profiles.fake import fake_zoo
>>> chain = fake_zoo("tiny-gpt", 2, "h100-sxm")
>>> slow, note = chain_for_gpu(chain, "a100-40gb")
>>> slow.meta["gpu"], slow.total_compute >= chain.total_compute, note.startswith("note: times re-estimated")
('a100-40gb', True, True)
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import numpy as np

from workbench.model.accelerators import ACCELERATORS, Accelerator, accelerator
from workbench.model.chain import Chain
from workbench.profiles.kernel_time import H100_CALIBRATION, Calibration, phase_seconds

__all__ = ["encode_works", "decode_works", "retimed", "measured_gpu", "chain_for_gpu", "StoredPhase"]

_VERSION = 1


@dataclasses.dataclass(frozen=True)
class StoredPhase:
    """One phase's operations in the order they run (kind, precision, aligned, flops, bytes each)."""

    kind: np.ndarray
    precision: np.ndarray
    aligned: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray

    def seconds(self, gpu: Accelerator, calibration: Calibration, backward: bool) -> float:
        return phase_seconds(self.kind, self.precision, self.flops, self.bytes, self.aligned, gpu, calibration,
                             backward)


def _runs(work, ops: dict) -> tuple:  # noqa: ANN001 - an OpWork
    """``work``'s operations as runs of one distinct operation: ((id in ``ops``, how many in a row), ...)."""
    out: list[list[int]] = []
    for k, p, a, f, b in zip(work.kind, work.precision, work.aligned, work.flops, work.bytes):
        op = ops.setdefault((int(k), int(p), int(bool(a)), float(f), float(b)), len(ops))
        if out and out[-1][0] == op:
            out[-1][1] += 1
        else:
            out.append([op, 1])
    return tuple(map(tuple, out))


def encode_works(works: Sequence) -> str:
    """``works`` (one :class:`~workbench.profiles.roofline.LayerWork` a layer) as one line of JSON: the distinct
    operations, the distinct phases (runs of [operation, repeats] in order) and per layer its forward and
    backward phase.

    >>> from workbench.profiles.roofline import layer_work
    >>> import torch
    >>> w = layer_work(torch.nn.Linear(8, 8), torch.zeros(4, 8), True, None, torch.ones(4, 8))
    >>> f, b = decode_works(encode_works([w, w]))[1]
    >>> len(f.kind) == len(w.forward) and bool((b.bytes == w.backward.bytes).all())
    True
    """
    ops: dict[tuple, int] = {}
    phases: dict[tuple, int] = {}
    layers = [[phases.setdefault(_runs(work, ops), len(phases)) for work in (w.forward, w.backward)] for w in works]
    return json.dumps({"v": _VERSION, "ops": [list(k) for k in ops], "phases": [list(map(list, p)) for p in phases],
                       "layers": layers}, separators=(",", ":"))


def decode_works(text: str) -> list[tuple[StoredPhase, StoredPhase]]:
    """The layers' (forward, backward) :class:`StoredPhase` stored by :func:`encode_works`; a ValueError if
    ``text`` is not such a record."""
    try:
        data = json.loads(text)
        ops = np.array(data["ops"], dtype=float).reshape(-1, 5)
        phases = []
        for runs in data["phases"]:
            idx = np.repeat(np.array([r[0] for r in runs], dtype=int), np.array([r[1] for r in runs], dtype=int))
            o = ops[idx]
            phases.append(StoredPhase(o[:, 0].astype(int), o[:, 1].astype(int), o[:, 2].astype(bool), o[:, 3],
                                      o[:, 4]))
        return [(phases[f], phases[b]) for f, b in data["layers"]]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ValueError(f"metadata 'work' is not a record of the layers' operations ({e})") from None


def retimed(chain: Chain, gpu: str | Accelerator, calibration: Calibration = H100_CALIBRATION) -> Chain:
    """``chain`` (a fake profile with its ``work``) with every layer's times estimated for ``gpu``; the memory
    columns are the GPU's own too (they do not depend on it)."""
    from workbench.profiles.roofline import gpu_meta

    acc = gpu if isinstance(gpu, Accelerator) else accelerator(gpu)
    if not chain.meta.get("work"):
        raise ValueError("the profile stores no operations ('work' metadata) to estimate its times from")
    phases = decode_works(str(chain.meta["work"]))
    if len(phases) != len(chain.layers):
        raise ValueError(f"metadata 'work' has {len(phases)} layers, the profile {len(chain.layers)}")
    layers = tuple(dataclasses.replace(l, forward=f.seconds(acc, calibration, False),
                                       backward=b.seconds(acc, calibration, True))
                   for l, (f, b) in zip(chain.layers, phases))
    return dataclasses.replace(chain, layers=layers, meta={**chain.meta, **gpu_meta(acc, calibration)})


def measured_gpu(device: str) -> str | None:
    """The known GPU a measured profile's ``device`` names (torch's device name), or None.

    >>> measured_gpu("cuda (NVIDIA H100 80GB HBM3)"), measured_gpu("cuda (NVIDIA A100-SXM4-40GB)")
    ('h100-sxm', 'a100-40gb')
    >>> measured_gpu("cpu (x86_64)") is None
    True
    """
    s = device.lower()
    if not s.startswith("cuda"):
        return None
    rules = (("h100", "pcie", "h100-pcie"), ("h100", "", "h100-sxm"), ("h200", "", "h200"),
             ("a100", "40gb", "a100-40gb"), ("a100", "80gb", "a100-80gb"), ("b200", "", "b200"),
             ("l40s", "", "l40s"), ("mi300x", "", "mi300x"))
    return next((name for chip, extra, name in rules if chip in s and extra in s and name in ACCELERATORS), None)


def chain_for_gpu(chain: Chain, gpu: str | None) -> tuple[Chain, str | None]:
    """``chain`` with times for ``gpu`` (None: unchanged) and a note to print, or a one-line ValueError when its
    times are another device's and cannot be estimated again (module docstring)."""
    if not gpu:
        return chain, None
    name = accelerator(gpu).name
    meta = chain.meta
    device = str(meta.get("device") or "").strip()
    fix = (f"profile the model for it (profile --fake --gpu {name}), or plan without --gpu (--memory and "
           f"--bandwidth give the platform)")
    if str(meta.get("times", "")).strip() == "estimated":
        made_for = str(meta.get("gpu", "")).strip()
        if made_for == name:
            return chain, None
        if not meta.get("work"):
            raise ValueError(f"--gpu {name}: the profile's times are estimates for {made_for or 'another GPU'} "
                             f"and it stores no operations to estimate them again; {fix}")
        return retimed(chain, name), (f"note: times re-estimated for {name} from the profile's operations "
                                      f"(it was made for {made_for or 'another GPU'})")
    if not device:
        return chain, (f"note: the profile does not say on which device its times were measured; they are "
                       f"planned as times on {name}")
    if measured_gpu(device) == name:
        return chain, None
    raise ValueError(f"--gpu {name}: the profile's times were measured on {device}, not on {name}; {fix}")
