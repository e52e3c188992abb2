"""Random small instances with activation policies in play, shared by the policy tests.

>>> ch, plat = instance(0)
>>> len(ch) >= 2 and plat.devices >= 1
True
"""

from __future__ import annotations

import random

from workbench.model.chain import Chain, Layer
from workbench.model.target import Target


def random_chain(rng: random.Random, L: int) -> Chain:
    """Layers with activations large against their parameters, some saving their output, some with
    measured peaks (the rest estimated)."""
    layers = []
    for i in range(L):
        layers.append(Layer(f"l{i}", rng.uniform(0.2, 2.0), rng.uniform(0.5, 3.0), rng.uniform(0, 8),
                            rng.uniform(1, 40), rng.uniform(0, 80), None, None, None,
                            rng.choice([0.0, None]), rng.choice([None, rng.uniform(0, 120)]),
                            rng.choice([None, rng.uniform(0, 200)])))
    return Chain(tuple(layers), input_bytes=5)


def instance(seed: int, *, max_layers: int = 5, max_devices: int = 3) -> tuple[Chain, Target]:
    """A chain and a platform whose memory limit is 0.45..1.0 of what the unconstrained keep plan needs."""
    from workbench.planners import plan

    rng = random.Random(seed)
    chain = random_chain(rng, rng.randint(2, max_layers))
    P = rng.randint(1, max_devices)
    opt = rng.choice(["sgd", "adam"])
    free = plan(chain, Target.of(P, optimizer=opt), "dp")
    return chain, Target.of(P, memory=free.peak_memory * rng.uniform(0.45, 1.0), optimizer=opt,
                           host_bandwidth=rng.uniform(10, 300), bandwidth=rng.uniform(10, 100))
