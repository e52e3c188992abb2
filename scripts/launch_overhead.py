"""How much longer a layer's forward takes the way the runtime calls it than the way the profiler does.

The profiler times ``layer(x)``; a runtime worker calls
``torch.func.functional_call(layer, version, (x,))`` (the stashed weight
version) under a ``saved_tensors_hooks`` counter. Both launch the same kernels;
the second does more Python per call. When the GPU finishes a layer's kernels
faster than Python launches them (small layers, bf16), that extra Python is
extra time. This script times one forward of zoo model layers both ways (CUDA
events or ``perf_counter``; median of ``--repeats``), with the calling thread's
CPU time, and writes one CSV row per layer and way::

    python scripts/launch_overhead.py --model gpt --dtype bfloat16 --batch-size 8 \\
        --set layers=12 --set d_model=768 --set heads=12 --set seq_len=512 --set vocab=50257 --out o.csv
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402


def measure(model: str, batch_size: int, dtype: str, device: str, repeats: int, which: list[int] | None,
            **config) -> "pandas.DataFrame":  # noqa: F821
    import pandas as pd

    from workbench.profiles.zoo import build_model, sample_batch
    def storage_bytes(t):
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()

    class _SavedCounter:  # the pack hook the runtime used to count saved tensors (before allocator-level memory)
        def __init__(self, exclude):
            self.exclude, self.seen, self.bytes = exclude, set(), 0

        def pack(self, t):
            key, n = storage_bytes(t)
            if key not in self.exclude and key not in self.seen:
                self.seen.add(key)
                self.bytes += n
            return t

    def _unpack(t):
        return t

    net = build_model(model, dtype=dtype, **config).to(device).train()
    x, _ = sample_batch(model, batch_size, dtype=dtype, **config)
    children = list(net.named_children())
    inputs, h = [], x.to(device)
    with torch.no_grad():
        for _, m in children:
            inputs.append(h)
            h = m(h)
    cuda = device.startswith("cuda")

    def timed(fn):
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            c0 = time.thread_time()
            a.record()
            out = fn()
            b.record()
            c1 = time.thread_time()
            torch.cuda.synchronize()
            return out, a.elapsed_time(b) / 1e3, c1 - c0
        c0, t0 = time.thread_time(), time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0, time.thread_time() - c0

    rows = []
    for i in which if which is not None else range(len(children)):
        name, m = children[i]
        inp = inputs[i].detach()
        if inp.is_floating_point():
            inp.requires_grad_(True)
        params = {n: p.detach().requires_grad_(True) for n, p in m.named_parameters()}
        exclude = {storage_bytes(p)[0] for p in params.values()} | {storage_bytes(b)[0] for b in m.buffers()}

        def runtime_way():
            counter = _SavedCounter(exclude)
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, _unpack):
                return torch.func.functional_call(m, params, (inp,))

        for way, fn in (("profiler: layer(x)", lambda: m(inp)), ("runtime: functional_call + hooks", runtime_way)):
            wall, cpu = [], []
            for r in range(3 + repeats):
                out, w, c = timed(fn)
                del out
                if r >= 3:
                    wall.append(w)
                    cpu.append(c)
            rows.append({"layer": name, "way": way, "forward": statistics.median(wall),
                         "launch_cpu": statistics.median(cpu)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--layers", type=int, nargs="*", default=None, help="layer indices (default all)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    cfg = {}
    for item in args.set:
        k, v = item.split("=", 1)
        try:
            cfg[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            cfg[k] = v
    df = measure(args.model, args.batch_size, args.dtype, args.device, args.repeats, args.layers, **cfg)
    df.assign(model=args.model, dtype=args.dtype, device=args.device, batch_size=args.batch_size).to_csv(
        args.out, index=False)
    print(df.to_string(index=False, float_format=lambda v: f"{v * 1e3:.3f} ms"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
