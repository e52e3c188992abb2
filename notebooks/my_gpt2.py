"""A Hugging Face GPT-2 built from a config with random weights: the model of notebook 08.

``build()`` is all a user writes: the model, one batch, the targets and the loss
(``--module notebooks/my_gpt2.py:build`` on the command line). No weights are downloaded.
Under ``WORKBENCH_QUICK=1`` (the notebooks' quick setting) the model and batch are smaller.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

QUICK = bool(os.environ.get("WORKBENCH_QUICK"))


def lm_loss(out, targets):
    """Next-token cross-entropy of the model's logits."""
    return F.cross_entropy(out.logits.flatten(0, 1), targets.flatten())


def build():
    layers, width, seq, vocab = (2, 64, 32, 500) if QUICK else (6, 128, 64, 2000)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=4, n_positions=seq, vocab_size=vocab,
                        bos_token_id=0, eos_token_id=0, use_cache=False,           # no key/value cache in training
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)           # deterministic: gradients check
    ids = torch.randint(0, vocab, (4, seq))
    return GPT2LMHeadModel(config), ids, ids.roll(-1, 1), lm_loss
