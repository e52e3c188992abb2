"""The chain of one rank, per tensor-parallel degree and micro-batch size, profiled once and cached by content
(docs/model.md, "Layouts").

A layout search needs the chain of one rank for every ``tp`` and micro-batch size it tries. A
:class:`RankChains` makes each as ``profile`` would from a ``--module FILE.py:FUNC`` builder: under fake tensors
for a named GPU (:func:`workbench.profiles.fake.fake_module`) or, without a GPU, measured on this machine; with
``tp > 1`` the per-rank tensor-parallel profile (:func:`tensor_parallel_chain`, the one call a ``tp > 1`` chain
comes from), with the layout's sequence parallelism and vocabulary-parallel loss (each setting its own profile).
When ``FUNC`` accepts ``batch_size`` it is called with each micro-batch size; otherwise the example's
batch is the only micro-batch size (:meth:`RankChains.micro_batch_sizes`).

Profiles are cached as CSV files in a folder (``build/profiles`` by default), named by a digest of what makes
them: the module file's bytes, the function, the GPU, ``tp``, the micro-batch size, sequence parallelism, the
vocabulary-parallel loss, torch's version and the source of the workbench's profilers. A second search of the
same model reads them back.

A model of identical blocks can be profiled with a few of them and its chain completed by
:func:`repeat_blocks` (notebook 09: Llama-3-70B's 80 blocks from a 2-block profile, its rows equal to the 80-block
profile's).

>>> key_digest({"module": "abc", "tp": 1}) == key_digest({"tp": 1, "module": "abc"})
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from workbench.model.chain import Chain

__all__ = ["RankChains", "tensor_parallel_chain", "key_digest", "profiler_digest", "tensor_parallel_available",
           "repeat_blocks", "check_rank_chain", "plan_rank_chain", "DEFAULT_CACHE", "MICRO_BATCH_SIZES"]

#: where profiles are cached unless told (relative to the working folder, as ``run``'s ``build/run``)
DEFAULT_CACHE = Path("build") / "profiles"
#: micro-batch sizes a search tries when the builder takes ``batch_size``
MICRO_BATCH_SIZES = (1, 2, 4, 8)


def key_digest(key: dict[str, Any]) -> str:
    """A short hex digest of a cache key (a JSON object, keys sorted)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


@lru_cache(maxsize=1)
def profiler_digest() -> str:
    """A digest of the workbench's profiler sources (a cached profile made by other code is not reused)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for folder in ("profiles", "parallel/tensor"):
        for path in sorted((root / folder).glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:20]


def repeat_blocks(chain: Chain, blocks: int) -> Chain:
    """``chain`` with its numbered blocks (consecutive layers named ``PREFIX.0``, ``PREFIX.1``, ...) extended to
    ``blocks`` of them by repeating its last block, renamed ``PREFIX.k``: the chain of the same model with more
    identical blocks. The blocks it has must be identical but for their names (else ``ValueError``), which is
    what makes the repeated chain the deeper model's (checked against a whole 80-block profile of Llama-3-70B in
    ``tests/test_parallel_profiles.py``).

    >>> from workbench.model.chain import Layer
    >>> c = Chain((Layer("embed", 1, 1, 8, 2),) + tuple(Layer(f"h.{i}", 2, 4, 16, 2) for i in range(2))
    ...           + (Layer("head", 1, 1, 8, 1),))
    >>> [l.name for l in repeat_blocks(c, 4).layers]
    ['embed', 'h.0', 'h.1', 'h.2', 'h.3', 'head']
    """
    numbered = [(i, m.group(1), int(m.group(2))) for i, l in enumerate(chain.layers)
                if (m := re.fullmatch(r"(.*\.)(\d+)", l.name))]
    if not numbered:
        raise ValueError(f"{chain.name}: no numbered blocks (layers named PREFIX.0, PREFIX.1, ...) to repeat")
    first, prefix = numbered[0][0], numbered[0][1]
    run = [x for x in numbered if x[1] == prefix]
    if [x[0] for x in run] != list(range(first, first + len(run))) or [x[2] for x in run] != list(range(len(run))):
        raise ValueError(f"{chain.name}: the blocks {prefix}0.. are not consecutive layers numbered from 0")
    if blocks < len(run):
        raise ValueError(f"repeat_blocks: {blocks} blocks is fewer than the {len(run)} the chain has")
    last = chain.layers[run[-1][0]]
    for i, _, _ in run[:-1]:
        if dataclasses.replace(chain.layers[i], name=last.name) != last:
            raise ValueError(f"{chain.name}: block {chain.layers[i].name} differs from {last.name}; only identical "
                             "blocks can be repeated")
    end = run[-1][0]
    extra = tuple(dataclasses.replace(last, name=f"{prefix}{k}") for k in range(len(run), blocks))
    layers = chain.layers[:end + 1] + extra + chain.layers[end + 1:]
    cuts = None
    if chain.cut_bytes is not None:
        cuts = chain.cut_bytes[:end] + (chain.cut_bytes[end - 1] if end > first else chain.cut_bytes[end],) * len(
            extra) + chain.cut_bytes[end:]
    meta = {k: v for k, v in chain.meta.items() if k != "work"}     # the work's per-layer map is the short chain's
    meta["repeated_blocks"] = f"{len(run)} profiled, {blocks} in the chain"
    return Chain(layers, chain.input_bytes, cuts, meta)


def tensor_parallel_available() -> bool:
    """Whether this workbench has per-rank tensor-parallel profiles (:mod:`workbench.parallel.tensor`)."""
    try:
        from workbench.parallel.tensor.profile import tensor_parallel_profile  # noqa: F401
    except ImportError:
        return False
    return True


def tensor_parallel_chain(spec: str, gpu: str, tp: int, micro_batch_size: int | None,
                          sequence_parallel: bool = False, loss_parallel: bool = False, kernels: str = "eager"
                          ) -> Chain:
    """The chain of rank 0 of a tensor-parallel group of ``tp`` (the module's blocks sharded as Megatron and
    torchtitan shard them; :mod:`workbench.parallel.tensor`), with sequence parallelism and the
    vocabulary-parallel loss when asked."""
    if not tensor_parallel_available():
        raise ValueError(f"tp={tp}: this workbench has no per-rank tensor-parallel profiles "
                         "(workbench.parallel.tensor); plan with tp=1")
    from workbench.parallel.tensor.profile import tensor_parallel_profile

    return tensor_parallel_profile(spec, gpu, tp, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel,
                                   micro_batch_size=micro_batch_size, kernels=kernels)


@dataclass
class RankChains:
    """Chains of one rank of ``spec``'s model (module docstring): ``gpu`` for fake profiles (None: measured
    here, tp 1 and the example's batch only); ``cache`` the folder (None: no cache); ``progress`` one line per
    profile made; ``sequence_parallel``, ``loss_parallel``: the settings of tp > 1 unless a call names them;
    ``kernels``: ``eager`` or ``fused`` (fake profiles only: :mod:`workbench.profiles.fused`), the same for every
    chain."""

    spec: str
    gpu: str | None = None
    cache: Path | None = DEFAULT_CACHE
    sequence_parallel: bool = False
    progress: Callable[[str], None] | None = None
    made: dict = field(default_factory=dict)
    loss_parallel: bool = False
    kernels: str = "eager"

    def takes_batch_size(self) -> bool:
        """Whether the builder accepts ``batch_size`` (a search may then try other micro-batch sizes)."""
        from workbench.profiles import usermodel

        path, func = usermodel.parse_spec(self.spec)
        fn = getattr(usermodel._import(path), func, None)
        try:
            return callable(fn) and "batch_size" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False

    def micro_batch_sizes(self) -> tuple[int | None, ...]:
        """The micro-batch sizes a search tries: :data:`MICRO_BATCH_SIZES` when the builder takes ``batch_size``
        (fake profiles), else the example's only (None)."""
        return MICRO_BATCH_SIZES if self.gpu and self.takes_batch_size() else (None,)

    def _switches(self, tp: int, sequence_parallel: bool | None, loss_parallel: bool | None) -> tuple[bool, bool]:
        """(sequence parallelism, vocabulary-parallel loss) of a call: the call's, else the fields'; for tp 1
        neither (one rank holds the whole sequence and vocabulary), and asking for one there is refused."""
        sp = self.sequence_parallel if sequence_parallel is None else sequence_parallel
        lp = self.loss_parallel if loss_parallel is None else loss_parallel
        if tp == 1:
            if sequence_parallel or loss_parallel:
                raise ValueError("tp=1: sequence parallelism and the vocabulary-parallel loss need tp > 1")
            return False, False
        return bool(sp), bool(lp)

    def key(self, tp: int, micro_batch_size: int | None, sequence_parallel: bool = False,
            loss_parallel: bool = False) -> dict[str, Any]:
        """What makes the profile (module docstring)."""
        import torch

        from workbench.profiles.usermodel import parse_spec

        path, func = parse_spec(self.spec)
        module = Path(path)
        if not module.is_file():
            raise ValueError(f"--module: no such file {path!r}")
        return {"module": hashlib.sha256(module.read_bytes()).hexdigest(), "function": func, "gpu": self.gpu,
                "tp": tp, "micro_batch_size": micro_batch_size, "sequence_parallel": sequence_parallel,
                "loss_parallel": loss_parallel, "torch": torch.__version__, "profilers": profiler_digest(),
                **({} if self.kernels == "eager" else {"kernels": self.kernels})}

    def __call__(self, tp: int, micro_batch_size: int | None = None, *, sequence_parallel: bool | None = None,
                 loss_parallel: bool | None = None) -> Chain:
        """The chain of one rank for ``tp``, the micro-batch size, sequence parallelism and the vocabulary-parallel
        loss (None: the fields'), from the cache when it is there: under fake tensors
        :func:`workbench.parallel.tensor.tensor_parallel_profile` (every tp, its own content cache in the same
        folder) where the workbench has it."""
        sp, lp = self._switches(tp, sequence_parallel, loss_parallel)
        if self.kernels != "eager" and self.gpu is None:
            raise ValueError(f"kernels {self.kernels!r}: fused kernels are priced under fake tensors (--fake --gpu)")
        if self.gpu is not None and tensor_parallel_available():
            return self._tensor_parallel(tp, micro_batch_size, sp, lp)
        key = self.key(tp, micro_batch_size, sp, lp)
        digest = key_digest(key)
        if digest in self.made:
            return self.made[digest]
        path = self._path(tp, micro_batch_size, digest)
        if path is not None and path.is_file():
            from workbench.profiles import load_profile

            chain = load_profile(path)
        else:
            chain = self._profile(tp, micro_batch_size, sp, lp)
            if path is not None:
                from workbench.profiles.csvio import write_profile

                path.parent.mkdir(parents=True, exist_ok=True)
                write_profile(chain.with_meta(cache_key=json.dumps(key, sort_keys=True)), path)
        self.made[digest] = chain
        return chain

    def _tensor_parallel(self, tp: int, micro_batch_size: int | None, sp: bool, lp: bool) -> Chain:
        from workbench.parallel.tensor.profile import tensor_parallel_profile
        from workbench.profiles.usermodel import user_code

        key = (tp, micro_batch_size, sp, lp)
        if key not in self.made:
            if self.progress:
                self.progress(f"profiling {self.spec} for tp={tp}{', sequence parallel' * sp}"
                              f"{', loss parallel' * lp}, micro-batch size {micro_batch_size or 'as built'} "
                              f"under fake tensors for {self.gpu} (or reading it from the cache)")
            with user_code(self.spec):
                self.made[key] = tensor_parallel_profile(
                    self.spec, self.gpu, tp, sequence_parallel=sp, loss_parallel=lp,
                    micro_batch_size=micro_batch_size, cache=self.cache if self.cache is not None else False,
                    kernels=self.kernels)
        return self.made[key]

    def _path(self, tp: int, micro_batch_size: int | None, digest: str) -> Path | None:
        if self.cache is None:
            return None
        from workbench.profiles.usermodel import parse_spec

        path, func = parse_spec(self.spec)
        mbs = "example" if micro_batch_size is None else micro_batch_size
        return Path(self.cache) / f"{Path(path).stem}-{func}-{self.gpu or 'here'}-tp{tp}-mbs{mbs}-{digest}.csv"

    def _profile(self, tp: int, micro_batch_size: int | None, sp: bool = False, lp: bool = False) -> Chain:
        from workbench.profiles.usermodel import user_code

        if self.progress:
            self.progress(f"profiling {self.spec} for tp={tp}, micro-batch size {micro_batch_size or 'as built'}"
                          f"{' under fake tensors for ' + self.gpu if self.gpu else ' on this machine'}")
        with user_code(self.spec):
            if tp > 1:
                if self.gpu is None:
                    raise ValueError(f"tp={tp} needs --fake --gpu NAME (tensor-parallel profiles are made under "
                                     "fake tensors)")
                return tensor_parallel_chain(self.spec, self.gpu, tp, micro_batch_size, sp, lp, self.kernels)
            if self.gpu is not None:
                from workbench.profiles.fake import fake_module

                return fake_module(self.spec, self.gpu, batch_size=micro_batch_size, kernels=self.kernels)
            return _measured(self.spec)


def _measured(spec: str) -> Chain:
    """``spec`` profiled on this machine's CPU, as ``profile --module`` does."""
    from workbench.profiles.profiler import profile_workload
    from workbench.profiles.workload import Workload

    chain = profile_workload(Workload.module(spec), "cpu", warmup=1, repeats=3)
    assert isinstance(chain, Chain)
    return chain.with_meta(module=spec)


def check_rank_chain(chain: Chain, layout: Any, source: str) -> None:
    """Refuse (one ``ValueError`` naming both values) a chain that is not the chain of one rank of ``layout``:
    a profile of another tensor-parallel degree, micro-batch size, sequence parallelism or vocabulary-parallel loss
    (``source``: where the chain came from, e.g. ``--profile FILE``). A chain that records none of them is taken
    as tp = 1."""
    from workbench.profiles.csvio import batch_size_of

    tp = int(str(chain.meta.get("tp", "1")).split()[0] or 1)
    if tp != layout.tp:
        raise ValueError(f"{source} is the chain of a rank of tp={tp}, but the plan's layout has tp={layout.tp}: "
                         "give that rank's profile, or no --profile to make it from the plan's model")
    batch = batch_size_of(chain.meta, source)
    if batch is not None and layout.micro_batch_size is not None and batch != layout.micro_batch_size:
        raise ValueError(f"{source} was profiled with a batch of {batch}, but the plan's layout has micro-batch size "
                         f"{layout.micro_batch_size}")
    for key in ("sequence_parallel", "loss_parallel"):
        made = str(chain.meta.get(key, "false")).lower() == "true"
        if tp > 1 and made != bool(getattr(layout, key)):
            raise ValueError(f"{source} has {key} {str(made).lower()}, the plan's layout "
                             f"{str(bool(getattr(layout, key))).lower()}")


def plan_rank_chain(plan: Any, layout: Any, *, cache: Path | None = DEFAULT_CACHE,
                    progress: Callable[[str], None] | None = None) -> Chain:
    """The chain of one rank of a layout ``plan`` made with ``plan --module ... --parallel``: its model
    (``extra.module``) profiled as ``plan`` profiled it (under fake tensors for the plan's GPU where it records
    one, else on this machine) for the layout's ``tp`` and micro-batch size, read back from ``cache`` where
    ``plan`` left it. A plan that records no module, or whose layers are not the module's, is refused."""
    module = (plan.extra or {}).get("module")
    if not module:
        raise ValueError("--profile is required to check or simulate this plan: it records no model "
                         "(extra.module) to profile")
    gpu = (plan.setup or {}).get("gpu")
    rc = RankChains(str(module), gpu=gpu, cache=cache, sequence_parallel=bool(layout.sequence_parallel),
                    loss_parallel=bool(layout.loss_parallel), progress=progress,
                    kernels=str((plan.extra or {}).get("kernels", "eager")))
    example = rc(1, None)
    built = int(str(example.meta.get("batch_size", 1)).split()[0] or 1)
    mbs = layout.micro_batch_size
    chain = example if layout.tp == 1 and mbs in (None, built) else rc(layout.tp, None if mbs in (None, built)
                                                                         else mbs)
    names = [layer.name for layer in chain.layers]
    planned = list((plan.extra or {}).get("layer_names") or names)
    if names != planned:
        raise ValueError(f"the plan's model {module} has {len(names)} layers, the plan {len(planned)} (a chain "
                         "made longer, e.g. by repeat_blocks?): give its profile with --profile")
    return chain
