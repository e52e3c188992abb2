"""Graph mode of ``dp``: best topological order vs the default order on PipeDream's profiles.

Prints, per peer profile and P in {2, 4, 8}: the bottleneck stage compute
(ms, communication ignored, Input nodes zeroed) with the default order
(chains-on-chains on one fixed topological order) and with
``best_order`` (down-set chains), PipeDream's published optimum where known,
the down-sets searched, the compression bound and the seconds taken.

    .venv/bin/python benchmarks/graph_dp.py [net ...]
"""

from __future__ import annotations

import sys

from workbench.paths import peer_profiles_dir
from workbench.planners.dp.graph import best_order
from workbench.profiles.pipedream import read_pipedream_graph

NETS = ["alexnet", "vgg16", "gnmt", "resnet18", "resnet50", "inception_v3", "resnet101", "densenet121",
        "nasnetamobile"]
PIPEDREAM = {  # ms, P = 2 / 4 / 8
    "vgg16": (370.9, 216.4, 159.5),
    "resnet50": (221.9, 111.5, 56.7),
    "resnet101": (206.1, 103.9, 52.1),
    "densenet121": (163.1, 82.0, 41.6),
    "gnmt": (45.9, 25.9, 19.0),
}


def main(nets: list[str]) -> int:
    peer = peer_profiles_dir()
    if peer is None:
        print("PipeDream profiles not found (data/profiles/pipedream or $WORKBENCH_PEER_PROFILES); nothing to do")
        return 0
    print(f"{'network':14s} {'P':>2s} {'default ms':>10s} {'best ms':>9s} {'gain':>6s} {'PipeDream':>9s} "
          f"{'states':>7s} {'blocks':>6s} {'bound ms':>9s} {'seconds':>8s}")
    for net in nets:
        g = read_pipedream_graph(peer / net)
        for k, P in enumerate((2, 4, 8)):
            r = best_order(g, P)
            pd = PIPEDREAM.get(net)
            pd_s = f"{pd[k]:.1f}" if pd else "-"
            bound = "exact" if r.bound == 0 else ("n/a" if r.bound == float("inf") else f"{r.bound * 1e3:.2f}")
            gain = max(0.0, (r.default_value / r.value - 1) * 100) if r.value > 0 else 0.0
            print(f"{net:14s} {P:2d} {r.default_value * 1e3:10.2f} {r.value * 1e3:9.2f} {gain:5.1f}% {pd_s:>9s} "
                  f"{r.states:7d} {r.blocks:6d} {bound:>9s} {r.seconds:8.2f}", flush=True)
        print(f"  {r.compression}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or NETS))
