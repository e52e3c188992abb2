"""workbench.profiles.tied_counts: a shared parameter's bytes at its owner only, the tie in the metadata."""

import json

import torch
from torch import nn

from workbench.profiles.profiler import profile_model


class Embed(nn.Module):
    def __init__(self, table: nn.Embedding) -> None:
        super().__init__()
        self.table = table

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table(x)


class Head(nn.Module):
    """A language-model head tied to the embedding, plus a bias of its own."""

    def __init__(self, table: nn.Embedding) -> None:
        super().__init__()
        self.table, self.bias = table, nn.Parameter(torch.zeros(table.num_embeddings))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.table.weight.T + self.bias


def test_a_tied_head_counts_only_its_own_parameters():
    table = nn.Embedding(10, 4)
    chain = profile_model([Embed(table), nn.Linear(4, 4), Head(table)], torch.zeros(2, 3, dtype=torch.long),
                          repeats=1, warmup=0)
    emb, _, head = chain.layers
    table_bytes = 10 * 4 * 4
    assert emb.weight_bytes == table_bytes and emb.grad_bytes == table_bytes
    assert head.weight_bytes == 10 * 4 and head.grad_bytes == 10 * 4 and head.max_param_bytes == 10 * 4  # the bias
    (tie,) = json.loads(chain.meta["tied"])
    assert tie["owner"] == emb.name and tie["layers"] == [emb.name, head.name] and tie["bytes"] == table_bytes


def test_no_tie_no_metadata():
    chain = profile_model([nn.Linear(2, 2), nn.Linear(2, 2)], torch.zeros(1, 2), repeats=1, warmup=0)
    assert "tied" not in chain.meta
