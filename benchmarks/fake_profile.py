"""Fake-tensor profiles against real ones and against torch's own tracker; their speed and memory here.

1. **Memory columns, fake against real** (target: every column within 1 % per layer): a tied GPT-2
   and a BERT (Hugging Face, from configs, random weights) and a CNN (the zoo's resnet50 at 64 px)
   profiled twice on this CPU, for real (:func:`workbench.profiles.profiler.profile_model`) and under
   fake tensors (:func:`workbench.profiles.fake.fake_profile`), every memory column compared layer by
   layer (``weight_bytes``, ``activation_bytes``, ``saved_bytes`` and the allocator-level columns).
2. **A one-device plan of a fake Llama-3-8B against MemTracker** (target: within 5 %, never more
   than 2 % under): ``examples/llama3.py:llama3_8b`` (bf16, one sequence of 2048 tokens) profiled
   fake for ``h100-sxm``, planned on one device (``dp``, AdamW in bf16, weights ``single``:
   ``memory[0]`` is the device's peak), against the peak ``MemTracker`` records around plain
   training steps of the same model under fake tensors
   (:func:`workbench.runtime.witness.plain_step_peak`, the foreach AdamW a GPU runs: no profiler, no
   planner).
3. **Speed and memory of fake profiles** (targets: Llama-3-8B under 5 min and 4 GB, Llama-3-70B
   under 15 min and 6 GB): ``python -m workbench profile --module ... --fake --gpu h100-sxm`` in a
   child process, its wall time and peak resident memory (``os.wait4``). On a shared machine the
   times are noisy; the memory is not.

    .venv/bin/python benchmarks/fake_profile.py            # all three (about 10 minutes on 2 cores)
    .venv/bin/python benchmarks/fake_profile.py --quick    # part 1 only
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from workbench.model.chain import MEMORY_COLUMNS  # noqa: E402
from workbench.model.target import Target  # noqa: E402
from workbench.model.units import format_bytes  # noqa: E402
from workbench.planners import plan as run_planner  # noqa: E402
from workbench.profiles import zoo  # noqa: E402
from workbench.profiles.fake import fake_module, fake_profile, unpacked_sequences  # noqa: E402
from workbench.profiles.profiler import profile_model  # noqa: E402

COLUMNS = ("weight_bytes", "activation_bytes", "saved_bytes") + MEMORY_COLUMNS
LLAMA_8B = f"{ROOT / 'examples' / 'llama3.py'}:llama3_8b"
LLAMA_70B = f"{ROOT / 'examples' / 'llama3.py'}:llama3_70b"


def _lm_loss(out, y):
    return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def gpt2_tied():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, vocab_size=8192, bos_token_id=0,
                     eos_token_id=0, use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, 8192, (4, 128))
    return GPT2LMHeadModel(cfg), ids, ids.roll(-1, 1), _lm_loss


def bert():
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                     vocab_size=8192, max_position_embeddings=128, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    ids = torch.randint(0, 8192, (4, 128))
    return BertForMaskedLM(cfg), ids, ids, _lm_loss


def resnet50():
    model = zoo.build_model("resnet50", image_size=64)
    x, y = zoo.sample_batch("resnet50", 8, image_size=64)
    return model, x, y, zoo.loss_fn("resnet50")


def compare(name: str, build) -> float:
    """The largest relative difference of any memory column of any layer, fake against real."""
    model, x, y, loss = build()
    real = profile_model(model, x, loss=loss, target=y, repeats=1, warmup=0)
    fake = fake_profile(build, "h100-sxm")
    assert [l.name for l in real.layers] == [l.name for l in fake.layers]
    worst, where = 0.0, ""
    for a, b in zip(real.layers, fake.layers):
        for c in COLUMNS:
            ra, fb = float(getattr(a, c) or 0.0), float(getattr(b, c) or 0.0)
            err = abs(fb - ra) / max(ra, 1.0)
            if err >= worst:
                worst, where = err, f"{a.name}.{c}"
    total = sum(float(l.forward_peak_bytes or 0) for l in real.layers)
    print(f"{name:<34} {len(real):>3} layers x {len(COLUMNS)} columns: largest difference {worst:.3%} ({where}); "
          f"sum of forward peaks {format_bytes(total)}", flush=True)
    return worst


def witness(spec: str = LLAMA_8B) -> tuple[float, float]:
    """(plan's memory[0], MemTracker's peak) of one device, Llama-3-8B, AdamW, bf16."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workbench.profiles.usermodel import load_user_model
    from workbench.runtime.witness import plain_step_peak

    t0 = time.perf_counter()
    chain = fake_module(spec, "h100-sxm")
    plan = run_planner(chain, Target.of(1, weights="single", optimizer="adamw", precision="bf16"), "dp")
    t1 = time.perf_counter()
    with FakeTensorMode():
        um = load_user_model(spec)
        with unpacked_sequences():      # as the profile (and a real run of an unpacked batch) sees it
            measured = plain_step_peak(um.model, um.inputs, um.targets, um.loss, "adamw", foreach=True)
    t2 = time.perf_counter()
    predicted = plan.memory[0]
    print(f"Llama-3-8B, bf16, AdamW, 1 x 2048 tokens, one device: plan {format_bytes(predicted)}, MemTracker "
          f"{format_bytes(measured)}: {predicted / measured - 1:+.3%} (target: within 5 %, never below -2 %); "
          f"profile + plan {t1 - t0:.0f} s, witness {t2 - t1:.0f} s", flush=True)
    return predicted, measured


def speed(spec: str) -> tuple[float, float]:
    """(wall seconds, peak resident bytes) of ``profile --module spec --fake --gpu h100-sxm`` in a child."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "workbench", "profile", "--module", spec, "--fake", "--gpu", "h100-sxm",
               "--out", str(Path(tmp) / "p.csv")]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (status {status})")
    return seconds, usage.ru_maxrss * 1024.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the fake-against-real columns only")
    args = ap.parse_args()
    print("1. memory columns, fake against real (target: within 1 % per layer and column)")
    worst = max(compare(n, b) for n, b in (("gpt-2 (HF, tied, 4 x 256, vocab 8k)", gpt2_tied),
                                           ("bert (HF, masked LM, 4 x 256)", bert),
                                           ("resnet50 (zoo, 64 px, batch 8)", resnet50)))
    print(f"   largest difference over the three: {worst:.3%}")
    if args.quick:
        return 0
    print("2. a fake Llama-3-8B's one-device plan against MemTracker around a plain fake step")
    witness()
    print("3. fake profiles, wall time and peak RSS (a shared machine: times are noisy)")
    for label, spec, limits in (("Llama-3-8B", LLAMA_8B, (300, 4e9)), ("Llama-3-70B", LLAMA_70B, (900, 6e9))):
        s, rss = speed(spec)
        print(f"   {label}: {s:.0f} s (target < {limits[0]} s), peak RSS {rss / 1e9:.2f} GB (target < "
              f"{limits[1] / 1e9:.0f} GB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
