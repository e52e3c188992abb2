"""``export``: a plan as torchtitan's settings (TOML, with torchtitan 0.3's command line in a comment) or as
Megatron-LM's flags (docs/model.md, "Export to torchtitan and Megatron-LM").

>>> from workbench.front.cli import build_parser
>>> build_parser().parse_args(["export", "plan.json", "--to", "megatron", "--seq-len", "8192"]).seq_len
8192
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["export_command", "export_text"]


def export_text(plan_file: str, to: str, seq_len: int | None = None) -> str:
    """The file ``export`` writes for ``plan_file`` (a ``ValueError`` naming the file and what is wrong)."""
    from workbench.parallel.export import job_from_plan, megatron_flags, read_plan, to_toml, torchtitan_settings

    job = job_from_plan(read_plan(plan_file), seq_len=seq_len, where=plan_file)
    header = [f"{job.layout.describe()}, {job.blocks} blocks, sequence {job.seq_len}: "
              f"python -m workbench export {plan_file} --to {to}",
              f"world size {job.layout.devices} = TP {job.layout.tp} x PP {job.layout.pp} x DP {job.layout.dp}"]
    if to == "torchtitan":
        return to_toml(torchtitan_settings(job), header)
    return megatron_flags(job).text(header)


def export_command(args: argparse.Namespace) -> int:
    text = export_text(args.plan_file, args.to, args.seq_len)
    if args.out:
        from workbench.io import write_text_atomic

        write_text_atomic(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
