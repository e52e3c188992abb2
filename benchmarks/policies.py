"""Activation policies against torch's own tools: what a recomputed or offloaded layer really allocates.

Two checks of docs/model.md, "Activation policies" (CPU, float32):

1. **Per layer** (the profiler's allocation tracker,
   :class:`workbench.profiles.memtrace.AllocationTracker`): each layer runs its forward
   and backward as in :func:`workbench.profiles.memtrace.layer_memory`, plain
   (its profile columns), under ``torch.utils.checkpoint`` (:class:`~workbench.runtime.policy_layers.Recomputed`)
   and with its saved tensors moved off the device (:class:`~workbench.runtime.policy_layers.Offloaded`).
   The model's columns for the policy (:func:`workbench.model.activations.apply_policies`, from the
   plain columns only) are compared with the measured ones: the bytes the forward leaves on the
   device for the backward (resident: the model's activations, plus the one offloaded copy),
   and the forward's and backward's peaks above the state before them. The model must never be
   below a measurement (it is an upper bound) and should be close.
2. **Whole models on one device** (``torch.distributed._tools.mem_tracker.MemTracker`` around
   plain training steps, :func:`workbench.runtime.witness.plain_step_peak`): a zoo model with every
   layer recomputed, every other layer recomputed, or every layer offloaded, against the
   one-device plan's memory for the same policies (the issue's target: within 5 %, never more
   than 2 % below). Offload is held to the bound only: the model moves a stage's offloaded
   bytes out after the stage's forward and back before its backward (rule 8), so with one
   stage and one mini-batch in flight they are all on the device at once, as if kept; the
   measured layers move each tensor out as it is saved and back as it is needed, which
   needs less (the model must not be below it).

    .venv/bin/python benchmarks/policies.py            # both parts (a few minutes on 2 cores)
    .venv/bin/python benchmarks/policies.py --quick    # part 1 and the small models of part 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.model.activations import apply_policies  # noqa: E402
from workbench.model.chain import Chain, Layer, Platform  # noqa: E402
from workbench.model.units import format_bytes  # noqa: E402
from workbench.planners import plan as run_planner  # noqa: E402
from workbench.profiles import zoo  # noqa: E402
from workbench.profiles.memtrace import AllocationTracker, layer_memory  # noqa: E402
from workbench.profiles.profiler import profile_zoo, saved_tensor_bytes  # noqa: E402
from workbench.runtime.policy_layers import Offloaded, Recomputed, with_policies  # noqa: E402
from workbench.runtime.witness import plain_step_peak  # noqa: E402


#: (label, layer, input) of part 1
def layer_cases() -> list[tuple[str, nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    return [
        ("GPT block d=64", zoo.TransformerBlock(64, 4), torch.randn(2, 32, 64)),
        ("GPT block d=128", zoo.TransformerBlock(128, 4), torch.randn(2, 64, 128)),
        ("conv3x3+ReLU", nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU()), torch.randn(2, 8, 16, 16)),
        ("ResNet bottleneck", zoo.Bottleneck(16, 8), torch.randn(2, 16, 8, 8)),
        ("Linear", nn.Linear(64, 128), torch.randn(16, 64)),
        ("ReLU", nn.ReLU(), torch.randn(16, 64)),
        ("MLP 64-256-64 GELU", nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)), torch.randn(16, 64)),
    ]


def resident_after_forward(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes the forward leaves allocated besides its output (what waits on the device for the backward)."""
    inp = x.detach().requires_grad_(True)
    params = list(module.parameters())
    tracker = AllocationTracker([inp, *params, *module.buffers()])
    with tracker:
        out = module(inp)
        left = tracker.current - out.untyped_storage().nbytes()
    del out
    return int(left)


def measure_layer(label: str, module: nn.Module, x: torch.Tensor) -> list[dict]:
    cols = layer_memory(module, x, input_requires_grad=True)
    saved = float(saved_tensor_bytes(module, x)[0])
    with torch.no_grad():
        out_bytes = float(module(x).numel() * module(x).element_size())
    in_bytes = float(x.numel() * x.element_size())
    layer = Layer(label, 1.0, 1.0, 0.0, out_bytes, saved, cols["grad_bytes"], cols["max_param_bytes"],
                  cols["saved_input_bytes"], cols["saved_output_bytes"], cols["forward_peak_bytes"],
                  cols["backward_peak_bytes"])
    chain = Chain((layer,), input_bytes=in_bytes)
    rows = []
    for policy, wrapped in (("keep", module), ("recompute", Recomputed(module)), ("offload", Offloaded(module))):
        eff = apply_policies(chain, policy)[0]
        got = layer_memory(wrapped, x, input_requires_grad=True)
        # the model: what stays on the device per mini-batch (saved bytes but the input and output, which
        # the neighbours or the runtime hold), and each peak with the one offloaded copy counted in
        resident = max(float(eff.saved_bytes) - float(eff.saved_input_bytes) - float(eff.saved_output_bytes), 0.0)
        rows.append({"layer": label, "policy": policy, "what": "resident after forward",
                     "model": resident, "measured": float(resident_after_forward(wrapped, x))})
        rows.append({"layer": label, "policy": policy, "what": "forward peak",
                     "model": float(eff.forward_peak_bytes) + eff.offload_bytes, "measured": got["forward_peak_bytes"]})
        rows.append({"layer": label, "policy": policy, "what": "backward peak",
                     "model": float(eff.backward_peak_bytes) + eff.offload_bytes,
                     "measured": got["backward_peak_bytes"]})
    return rows


#: (label, zoo model, config, batch, optimizer, policies by layer count)
MODELS = [
    ("gpt 4x256, vocab 4k", "gpt", {"layers": 4, "d_model": 256, "heads": 4, "seq_len": 256, "vocab": 4096}, 4, "adam"),
    ("resnet50 64px", "resnet50", {"image_size": 64}, 8, "sgd"),
    ("vgg16 64px", "vgg16", {"image_size": 64}, 8, "momentum"),
]
QUICK_MODELS = MODELS[:1]
#: patterns the model should predict within 5 %; the others (with offload) it bounds
EXACT_PATTERNS = ("keep", "recompute all", "recompute odd")
PATTERNS = {
    "keep": lambda n: ["keep"] * n,
    "recompute all": lambda n: ["recompute"] * n,
    "recompute odd": lambda n: ["recompute" if i % 2 else "keep" for i in range(n)],
    "offload all": lambda n: ["offload"] * n,
    "mixed": lambda n: [("keep", "recompute", "offload")[i % 3] for i in range(n)],
}


def measure_model(label: str, name: str, config: dict, batch: int, optimizer: str) -> list[dict]:
    chain = profile_zoo(name, batch, repeats=1, warmup=0, **config)
    platform = Platform(1, weights="single", optimizer=optimizer)
    rows = []
    for pattern, make in PATTERNS.items():
        pol = make(len(chain))
        t0 = time.perf_counter()
        predicted = run_planner(chain, platform, "dp", activations=pol).memory[0]
        torch.manual_seed(0)
        model = with_policies(zoo.build_model(name, **config), pol)
        x, y = zoo.sample_batch(name, batch, **config)
        measured = plain_step_peak(model, x, y, zoo.loss_fn(name), optimizer)
        rows.append({"model": label, "policies": pattern, "predicted": predicted, "measured": measured,
                     "error": predicted / measured - 1, "seconds": time.perf_counter() - t0})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="part 1 and the smallest model of part 2")
    args = ap.parse_args(argv)
    print("1. per layer (AllocationTracker): the model's figure against the measured one")
    print(f"{'layer':20s} {'policy':10s} {'what':24s} {'model':>11s} {'measured':>11s} {'model/meas':>10s}")
    below = []
    ratios = []
    for case in layer_cases():
        for r in measure_layer(*case):
            ratio = r["model"] / r["measured"] if r["measured"] else float("inf") if r["model"] else 1.0
            if r["policy"] != "keep":
                ratios.append(ratio)
            if r["model"] < r["measured"] * (1 - 1e-9):
                below.append(r)
            print(f"{r['layer']:20s} {r['policy']:10s} {r['what']:24s} {format_bytes(r['model']):>11s} "
                  f"{format_bytes(r['measured']):>11s} {ratio:10.3f}", flush=True)
    print(f"policy rows: model/measured from {min(ratios):.3f} to {max(ratios):.3f}; "
          f"{len(below)} row(s) below the measurement")
    print("\n2. one device, plain training steps (MemTracker) against the plan's memory")
    print(f"{'model':22s} {'policies':14s} {'predicted':>11s} {'measured':>11s} {'error':>7s} {'s':>5s}")
    rows = []
    for case in (QUICK_MODELS if args.quick else MODELS):
        for r in measure_model(*case):
            rows.append(r)
            print(f"{r['model']:22s} {r['policies']:14s} {format_bytes(r['predicted']):>11s} "
                  f"{format_bytes(r['measured']):>11s} {r['error']:+7.2%} {r['seconds']:5.1f}", flush=True)
    exact = [r for r in rows if r["policies"] in EXACT_PATTERNS]
    bound = [r for r in rows if r["policies"] not in EXACT_PATTERNS]
    over = max(r["error"] for r in exact)
    under = min(r["error"] for r in exact)
    bound_ok = all(r["error"] >= -0.02 for r in bound)
    ok = not below and over <= 0.05 and under >= -0.02 and bound_ok
    print(f"\n{len(exact)} keep/recompute cases: error from {under:+.2%} to {over:+.2%} (target: within +5 %, never "
          f"below -2 %); {len(bound)} offload cases an upper bound: {'yes' if bound_ok else 'NO'}; "
          f"per layer never below: {'yes' if not below else 'NO'}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
