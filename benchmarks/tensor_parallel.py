"""Tensor-parallel profiles: fake against real ranks, Llama-3 8B/70B and GPT-2 blocks per rank against counts.

1. **Fake against real** (issue 37, target: every per-rank memory column within 1 %): a small Llama-style
   decoder (Hugging Face's Llama, 2 blocks of hidden 64, 4 heads; 2 key/value heads, 4 for tp=4, which 2
   would not divide) and a small GPT-2 of the same sizes (its fused query/key/value split by heads, its head
   tied) profiled under fake tensors with a fake group of ``tp`` ranks
   (:func:`workbench.parallel.tensor.profile.tensor_parallel_profile`) and on ``tp`` gloo processes with
   real CPU tensors (:func:`workbench.parallel.tensor.real.gloo_tensor_parallel`): for tp 1, 2, 4, with and
   without sequence parallelism, the largest relative difference over every layer and memory column of
   every rank, and one block's columns side by side.
2. **Llama-3-8B and 70B, fake profiles for tp 1, 2, 4, 8** (issue 36, target for 70B: the four in under 10
   minutes and 4 GB of RAM in all): ``python -m workbench profile --module examples/llama3.py:llama3_70b
   --fake --gpu h100-sxm --tp T`` in a child process each, its wall and CPU time and peak resident memory
   (``os.wait4``: the child's ``ru_maxrss``). On a shared machine the times are noisy; the memory is not.
3. **Per block, against independent arithmetic** (bf16, one sequence of 2048 tokens, b = 1):

   * weights: the block's parameters from the model's config, each sharded linear's divided by tp, the two
     norms whole;
   * activations (``saved_bytes``): a per-tensor count of what autograd keeps for a Hugging Face Llama block,
     written from its code: per RMSNorm its float32 input, its bfloat16 normalised output and the float32
     inverse RMS (``6bsh + 4bs``, two of them), the normalised input the query/key/value projections share
     and the one gate/up share (``2bsh`` each), all whole on every rank; and, split by tp, the rotated
     queries and keys and the values (``2bsh + 4b s kv d``), the attention's output, which the output
     projection saves as its input (one storage: the CPU flash kernel writes it in the layout the
     projection reads, ``2bsh``), its log-sum-exp (``4bas``, float32), the gate's and up's outputs, SiLU's
     output and the down projection's input (``8bsf``). Beside it, Korthikanti et al.'s count Megatron uses
     (``sbh (10 + 24/t + 5as/(ht))``: GPT blocks with dropout, a materialised attention matrix and a 4h MLP,
     none of which Llama-3 has, and no SwiGLU or grouped-query attention);
   * collectives: Megatron's two all-reduces of the hidden state (``b s h`` x 2 bytes) per block in the
     forward and two in the backward (sequence parallelism: two all-gathers and two reduce-scatters of it;
     the row ``8sp``, where the norms' tensors are split over the sequence too).

4. **GPT-2 blocks** (GPT-3 XL's shape, Brown et al. Table 2.1: 24 layers, hidden 2048, 16 heads, as Hugging
   Face's GPT-2 with its vocabulary padded to 50304 as Megatron-LM pads it; bf16, one sequence of 2048
   tokens), fake profiles for tp 1, 2, 4, 8 and 8 with sequence parallelism: per block, the weights against
   the config's arithmetic (the column-wise ``c_attn``, ``c_fc`` and the row-wise ``c_proj`` weights, the
   column-wise biases divided by tp; the row-wise biases and the two LayerNorms whole) and the collectives
   against Megatron's formula for its GPT (two all-reduces of ``b s h`` x 2 bytes forward, two backward; with
   sequence parallelism two all-gathers and two reduce-scatters), Korthikanti et al.'s activation count
   beside the saved bytes.

    .venv/bin/python benchmarks/tensor_parallel.py              # all (about 20 minutes on 2 shared cores)
    .venv/bin/python benchmarks/tensor_parallel.py --quick      # part 1 only
    .venv/bin/python benchmarks/tensor_parallel.py --only 70b   # parts 2 and 3 for one model
    .venv/bin/python benchmarks/tensor_parallel.py --only gpt2  # part 4
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from workbench.model.chain import COMM_FIELDS, MEMORY_COLUMNS  # noqa: E402
from workbench.parallel.tensor.profile import tensor_parallel_profile  # noqa: E402
from workbench.parallel.tensor.real import gloo_tensor_parallel  # noqa: E402
from workbench.parallel.tensor.tiny import tiny_gpt2, tiny_llama  # noqa: E402
from workbench.profiles.csvio import read_profile  # noqa: E402

COLUMNS = ("weight_bytes", "activation_bytes", "saved_bytes") + MEMORY_COLUMNS + COMM_FIELDS
SEQUENCE, BF16 = 2048, 2
#: examples/llama3.py's shapes: hidden, MLP, layers, heads, key/value heads (Meta's config.json files)
SHAPES = {"8b": (4096, 14336, 32, 32, 8), "70b": (8192, 28672, 80, 64, 8)}


def tiny_kv4(batch_size: int = 2):
    """The small decoder with 4 key/value heads (tp=4 divides them). Module level: gloo ranks import it."""
    return tiny_llama(batch_size, kv_heads=4)


def _largest_difference(fake, real) -> tuple[float, str]:
    worst, where = 0.0, "-"
    for f, r in zip(fake.layers, real.layers):
        for c in COLUMNS:
            a, b = getattr(f, c), getattr(r, c)
            if a is None and b is None:
                continue
            d = abs((a or 0.0) - (b or 0.0)) / max(abs(b or 0.0), 1.0)
            if d > worst:
                worst, where = d, f"{f.name}.{c}"
    return worst, where


def fake_against_real() -> float:
    print("1. per-rank memory columns, fake (fake process group) against real (gloo ranks, real CPU tensors)")
    print(f"   {'model':<10} {'tp':>2} {'sp':>3} {'ranks':>5} {'largest difference':>19}  {'where':<48} "
          f"{'real s':>7}")
    worst_all = 0.0
    for tp, build in ((1, tiny_llama), (2, tiny_llama), (4, tiny_kv4), (2, tiny_gpt2), (4, tiny_gpt2)):
        for sp in ((False,) if tp == 1 else (False, True)):
            fake = tensor_parallel_profile(build, "h100-sxm", tp, sequence_parallel=sp, cache=False)
            t0 = time.perf_counter()
            reals = gloo_tensor_parallel(build, "h100-sxm", tp, sequence_parallel=sp)
            seconds = time.perf_counter() - t0
            worst = max(_largest_difference(fake, r) for r in reals)
            worst_all = max(worst_all, worst[0])
            name = "gpt2" if build is tiny_gpt2 else "llama"
            print(f"   {name:<10} {tp:>2} {'yes' if sp else 'no':>3} {len(reals):>5} {worst[0]:>18.3%}  "
                  f"{worst[1]:<48} {seconds:>7.1f}")
            if tp == 2 and not sp:
                block = 1
                print(f"   tp=2, {fake[block].name}, fake | rank 0 | rank 1:")
                for c in COLUMNS:
                    print(f"      {c:<26} {getattr(fake[block], c):>10.0f} | "
                          + " | ".join(f"{getattr(r[block], c):>10.0f}" for r in reals))
    print(f"   largest difference over every row: {worst_all:.3%} (target: 1 %)")
    return worst_all


def profile_child(size: str, tp: int, out: Path, sp: bool = False) -> tuple[float, float, float]:
    """``profile --fake --tp`` in a child process: (wall seconds, CPU seconds, peak RSS bytes)."""
    cmd = [sys.executable, "-m", "workbench", "profile", "--module", f"{ROOT / 'examples' / 'llama3.py'}:llama3_{size}",
           "--fake", "--gpu", "h100-sxm", "--out", str(out)] + (["--tp", str(tp)] if tp > 1 else []) \
        + (["--sequence-parallel"] if sp else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (status {status}): {proc.stderr.read()[-2000:]}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024.0


def block_arithmetic(size: str, tp: int, sp: bool = False) -> dict[str, float]:
    """One block's weight, saved and collective bytes on a rank, counted from the config (module docstring);
    ``sp``: the norms' tensors split over the sequence too."""
    h, f, _, a, kv = SHAPES[size]
    d, b, s = h // a, 1, SEQUENCE
    linears = h * h + 2 * h * kv * d + h * h + 3 * h * f
    weights = (linears / tp + 2 * h) * BF16
    norms, shared = 2 * (6 * b * s * h + 4 * b * s), 2 * (2 * b * s * h)
    whole = shared + (0 if sp else norms)
    split = 2 * b * s * h + 4 * b * s * kv * d + 2 * b * s * h + 4 * b * a * s + 8 * b * s * f + (norms if sp else 0)
    korthikanti = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    return {"weights": weights, "saved": whole + split / tp, "korthikanti": korthikanti,
            "all_reduce": b * s * h * BF16}


def _off(measured: float, expected: float) -> str:
    """``measured`` against ``expected``: '=' when equal, else the relative difference."""
    if measured == expected:
        return "="
    return f"{measured / expected - 1:+.2%}" if expected else "n/a"


def llama(size: str) -> None:
    print(f"\n2./3. Llama-3-{size.upper()} (bf16, 1 x {SEQUENCE} tokens), fake profiles for h100-sxm")
    print(f"   {'tp':>4} {'wall s':>7} {'CPU s':>6} {'peak RSS':>9} | per block: {'weights':>9} {'vs ar.':>6} "
          f"{'saved':>9} {'vs ct.':>6} {'Korth.':>9} | {'comm fwd':>9} {'bwd':>9} {'Megatron':>9} {'vs M.':>6} | "
          f"{'fwd ms':>7} {'bwd ms':>7} {'comm ms':>7}")
    print("   (vs ar.: against the arithmetic; vs ct.: against the per-tensor count; vs M.: against Megatron's "
          "collectives; comm ms: the forward's two all-reduces on NVLink, in fwd ms)")
    totals = [0.0, 0.0, 0.0]
    with tempfile.TemporaryDirectory() as tmp:
        for tp, sp in ((1, False), (2, False), (4, False), (8, False), (8, True)):
            out = Path(tmp) / f"{size}-tp{tp}{'-sp' if sp else ''}.csv"
            wall, cpu, rss = profile_child(size, tp, out, sp)
            if not sp:
                totals = [totals[0] + wall, totals[1] + cpu, max(totals[2], rss)]
            chain = read_profile(out)
            block = chain[1]
            assert all(chain[i] == dataclasses.replace(block, name=chain[i].name)
                       for i in range(1, len(chain) - 2)), "blocks differ"
            want = block_arithmetic(size, tp, sp)
            comm_ms = 0.0
            if tp > 1:
                from workbench.model.accelerators import accelerator
                from workbench.parallel.collectives import ring_seconds

                bw = accelerator("h100-sxm").link_bandwidth
                comm_ms = 2 * ring_seconds("all_reduce", want["all_reduce"], ranks=tp, bandwidth=bw) * 1e3
            mb, megatron = 2 ** 20, (4 if sp else 2) * want["all_reduce"] if tp > 1 else 0.0
            print(f"   {str(tp) + ('sp' if sp else ''):>4} {wall:>7.1f} {cpu:>6.1f} {rss / 2**30:>7.2f}GB | per block: "
                  f"{block.weight_bytes / mb:>7.1f}MB {_off(block.weight_bytes, want['weights']):>6} "
                  f"{block.saved_bytes / mb:>7.1f}MB {_off(block.saved_bytes, want['saved']):>6} "
                  f"{want['korthikanti'] / mb:>7.1f}MB | {(block.comm_forward_bytes or 0) / mb:>7.1f}MB "
                  f"{(block.comm_backward_bytes or 0) / mb:>7.1f}MB {megatron / mb:>7.1f}MB "
                  f"{_off(block.comm_forward_bytes or 0, megatron):>6} | {block.forward * 1e3:>7.2f} "
                  f"{block.backward * 1e3:>7.2f} {comm_ms:>7.2f}")
    print("   (8sp: with sequence parallelism; Megatron's collectives then 2 all-gathers and 2 reduce-scatters)")
    print(f"   tp 1, 2, 4, 8 in all: {totals[0]:.0f} s wall ({totals[0] / 60:.1f} min), {totals[1]:.0f} s CPU, "
          f"largest peak RSS {totals[2] / 2**30:.2f} GB (target for 70B: 10 min and 4 GB)")


#: GPT-3 XL's shape (Brown et al. 2020, Table 2.1) as a GPT-2: layers, hidden, heads; Megatron's padded vocabulary
GPT_XL, GPT_VOCAB = (24, 2048, 16), 50304


def gpt_xl(batch_size: int = 1):
    """GPT-3 XL's shape as Hugging Face's GPT-2 (bf16, its vocabulary padded to 50304), one 2048-token sequence."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from workbench.parallel.tensor.tiny import lm_loss
    from workbench.profiles.fake import default_dtype

    layers, h, a = GPT_XL
    config = GPT2Config(n_layer=layers, n_embd=h, n_head=a, n_positions=SEQUENCE, vocab_size=GPT_VOCAB,
                        use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                        eos_token_id=0)
    with default_dtype(torch.bfloat16):
        model = GPT2LMHeadModel(config)
    ids = torch.randint(0, GPT_VOCAB, (batch_size, SEQUENCE))
    return model, ids, ids.roll(-1, 1), lm_loss


def gpt2_block_arithmetic(tp: int, sp: bool = False) -> dict[str, float]:
    """One GPT-2 block's weight bytes on a rank, one hidden-state all-reduce's bytes and Korthikanti et al.'s
    activation count (with sequence parallelism: its ``sbh (34 + 5as/h) / t``)."""
    _, h, a = GPT_XL
    b, s = 1, SEQUENCE
    params = 12 * h * h / tp + (3 * h + 4 * h) / tp + 2 * h + 4 * h
    korthikanti = s * b * h * ((34 + 5 * a * s / h) / tp if sp else 10 + 24 / tp + 5 * a * s / (h * tp))
    return {"weights": params * BF16, "all_reduce": b * s * h * BF16, "korthikanti": korthikanti}


def gpt2_blocks() -> None:
    layers, h, a = GPT_XL
    print(f"\n4. GPT-2 blocks of GPT-3 XL's shape ({layers} layers, hidden {h}, {a} heads, vocabulary {GPT_VOCAB}; "
          f"bf16, 1 x {SEQUENCE} tokens), fake profiles for h100-sxm")
    print(f"   {'tp':>4} {'wall s':>7} | per block: {'weights':>9} {'vs ar.':>6} {'saved':>9} {'Korth.':>9} | "
          f"{'comm fwd':>9} {'bwd':>9} {'Megatron':>9} {'vs M.':>6} {'vs M. bwd':>9}")
    for tp, sp in ((1, False), (2, False), (4, False), (8, False), (8, True)):
        t0 = time.perf_counter()
        chain = tensor_parallel_profile(gpt_xl, "h100-sxm", tp, sequence_parallel=sp, cache=False)
        wall = time.perf_counter() - t0
        block = chain[1]
        assert all(chain[i] == dataclasses.replace(block, name=chain[i].name)
                   for i in range(1, len(chain) - 2)), "blocks differ"
        want, mb = gpt2_block_arithmetic(tp, sp), 2 ** 20
        megatron = (4 if sp else 2) * want["all_reduce"] if tp > 1 else 0.0
        fwd, bwd = block.comm_forward_bytes or 0.0, block.comm_backward_bytes or 0.0
        print(f"   {str(tp) + ('sp' if sp else ''):>4} {wall:>7.1f} | per block: {block.weight_bytes / mb:>7.1f}MB "
              f"{_off(block.weight_bytes, want['weights']):>6} {block.saved_bytes / mb:>7.1f}MB "
              f"{want['korthikanti'] / mb:>7.1f}MB | {fwd / mb:>7.1f}MB {bwd / mb:>7.1f}MB {megatron / mb:>7.1f}MB "
              f"{_off(fwd, megatron):>6} {_off(bwd, megatron):>9}")
    print("   (vs ar.: the weights against the arithmetic; vs M.: the collectives against Megatron's; Korth.: "
          "Korthikanti et al.'s count, with dropout masks and a materialised attention matrix this model has not)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="part 1 only (fake against real)")
    ap.add_argument("--only", choices=sorted(SHAPES) + ["gpt2"], help="parts 2 and 3 for one Llama, or part 4")
    args = ap.parse_args()
    if not args.only:
        fake_against_real()
    if not args.quick:
        for size in ([args.only] if args.only in SHAPES else [] if args.only else ["8b", "70b"]):
            llama(size)
        if args.only in (None, "gpt2"):
            gpt2_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
