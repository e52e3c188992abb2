"""workbench.parallel.run.checks: what a layout run refuses before any rank starts (one error line, exit 2)."""

import re
from dataclasses import replace

import pytest

from layout_runs import pipeline_plan, write_layout_plan
from workbench.front.cli import main
from workbench.model.layout import Layout
from workbench.parallel.run import launch
from workbench.parallel.run.checks import (
    check_layout_plan,
    check_ranks,
    is_layout_run,
    layout_micro_batches,
    layout_of_plan,
)

LLAMA_MODULE = '''
from workbench.parallel.run.workloads import hf_workload


def build():
    wl = hf_workload("llama", batch_size=2, sequence=8, layers=2, hidden=32, heads=4, kv_heads=2, vocab=64)
    x, y = wl.batch(0)
    return wl.build(), x, y, wl.loss
'''


@pytest.fixture
def no_ranks(monkeypatch):
    """Any rank started fails the test: the refusals come first."""
    def started(*a, **k):
        raise AssertionError("a rank was started")
    monkeypatch.setattr(launch, "run_layout", started)


def _cli_error(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_more_ranks_than_the_run_can_start(tmp_path, capsys, no_ranks):
    plan = write_layout_plan(tmp_path / "p.json", pipeline_plan([], 5), Layout(dp=32))
    err = _cli_error(["run", str(plan), "--model", "mlp", "--batch-size", "4", "--out", str(tmp_path)], capsys)
    assert "needs 32 ranks but this run can start 16 on one machine" in err
    err = _cli_error(["run", str(plan), "--model", "mlp", "--max-ranks", "8", "--out", str(tmp_path)], capsys)
    assert "can start 8" in err


def test_sizes_tp_does_not_divide_are_named(tmp_path, capsys, no_ranks):
    module = tmp_path / "llama_tiny.py"
    module.write_text(LLAMA_MODULE)
    plan = write_layout_plan(tmp_path / "p.json", pipeline_plan([], 5), Layout(tp=3))
    err = _cli_error(["run", str(plan), "--module", f"{module}:build", "--out", str(tmp_path / "o")], capsys)
    assert re.search(r"tp=3 does not divide the model's .*heads \(4\)", err) and "key/value heads (2)" in err


def test_the_torchrun_entry_refuses_other_than_the_layouts_ranks(tmp_path, capsys, monkeypatch, no_ranks):
    from workbench.runtime.engine import main as torchrun_main

    plan = write_layout_plan(tmp_path / "p.json", pipeline_plan([2], 5), Layout(pp=2, dp=2))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert torchrun_main([str(plan), "--model", "mlp", "--steps", "2", "--out", str(tmp_path)]) == 2
    assert "needs 4 ranks but torchrun started 2" in capsys.readouterr().err


def test_the_plans_pipeline_must_match_the_layout():
    with pytest.raises(ValueError, match=r"pipeline devices \[0, 1\] but the layout has pp=4"):
        check_layout_plan(pipeline_plan([2], 5), Layout(pp=4, dp=2))
    stashed = pipeline_plan([2], 5, schedule="periodic")
    stashed = stashed.with_(stages=tuple(replace(s, in_flight=2) for s in stashed.stages), setup={"weights": "stash"})
    with pytest.raises(ValueError, match="weight stashing runs on the PipeDream engine"):
        check_layout_plan(stashed, Layout(pp=2, dp=2))
    with pytest.raises(ValueError, match="zero=3 shards over the data-parallel group, but dp=1"):
        check_layout_plan(pipeline_plan([2], 5), Layout(pp=2, zero=3))


def test_layout_of_a_plan_and_its_micro_batches(tmp_path):
    path = write_layout_plan(tmp_path / "p.json", pipeline_plan([2], 5, micro_batches=4), Layout(pp=2, dp=2))
    lay = layout_of_plan(path)
    assert lay == Layout(pp=2, dp=2) and is_layout_run(lay) and not is_layout_run(Layout(pp=4))
    assert layout_of_plan({"extra": {"parallel": {"tp": 2}}}) == Layout(tp=2)
    with pytest.raises(ValueError, match="unknown key"):
        layout_of_plan({"parallel": {"tensor": 2}})
    plan = pipeline_plan([2], 5, micro_batches=4)
    assert layout_micro_batches(plan, lay, None) == (4, 1)          # one optimizer step of the plan's 4
    assert layout_micro_batches(plan, lay, 12) == (4, 3)            # --steps counts mini-batches: 3 steps of 4
    with pytest.raises(ValueError, match=r"--steps 6: a 1f1b plan runs 4 micro-batches per optimizer step .* so 6 "
                                         r"leaves a partial step of 2; run --steps 4 \(1 step\) or 8 \(2 steps\)"):
        layout_micro_batches(plan, lay, 6)
    check_ranks(Layout(tp=2, pp=2, dp=2), max_ranks=8, started=None)


def test_dp_overlap_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"dpo=1.*does not do: plan it with dpo=0"):
        check_layout_plan(pipeline_plan([2], 5), Layout(pp=2, dp=2, zero=1, dp_overlap=True))


def test_tp_overlap_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"tpo=1.*does not do: plan it with tpo=0"):
        check_layout_plan(pipeline_plan([2], 5), Layout(tp=2, pp=2, sequence_parallel=True, tp_overlap=True))


SOFTMAX_LOSS = '''
from workbench.parallel.run.workloads import hf_workload


def manual_cross_entropy(out, y):
    p = out.logits.softmax(-1)
    return -p.gather(-1, y.unsqueeze(-1)).log().mean()


def build():
    wl = hf_workload("llama", batch_size=2, sequence=8, layers=2, hidden=32, heads=4, kv_heads=2, vocab=64)
    x, y = wl.batch(0)
    return wl.build(), x, y, manual_cross_entropy
'''


def test_a_split_loss_that_is_not_a_plain_cross_entropy_is_named(tmp_path, capsys, no_ranks):
    """lp=1 with a loss that softmaxes the logits itself (torch's loss_parallel computes only a cross-entropy on
    vocabulary shards): one line naming the loss and what it does, before any rank."""
    (tmp_path / "net.py").write_text(SOFTMAX_LOSS)
    plan = write_layout_plan(tmp_path / "p.json", pipeline_plan([], 5), Layout(tp=2, loss_parallel=True))
    err = _cli_error(["run", str(plan), "--module", f"{tmp_path / 'net.py'}:build", "--out", str(tmp_path / "r")],
                     capsys)
    assert "lp=1" in err, err
    assert "net:build's loss manual_cross_entropy is not one: it applies softmax to the logits" in err, err
    assert "plan with lp=0" in err


def test_cross_entropy_refusal_follows_the_logits_only():
    import torch
    import torch.nn.functional as F

    from workbench.parallel.run.tensor import cross_entropy_refusal

    logits, y = torch.randn(2, 4, 16), torch.randint(0, 16, (2, 4))
    hf_style = lambda o, t: F.cross_entropy(o.float()[:, :-1].contiguous().view(-1, 16), t[:, 1:].reshape(-1)) / 3.0  # noqa: E731
    assert cross_entropy_refusal(hf_style, logits, y) is None        # views, a cast, then the loss scaled
    assert cross_entropy_refusal(lambda o, t: F.nll_loss(F.log_softmax(o, -1).flatten(0, 1), t.flatten()),
                                 logits, y) is None
    assert cross_entropy_refusal(lambda o, t: (o ** 2).mean(), logits, y).startswith("it applies")
    assert cross_entropy_refusal(lambda o, t: F.mse_loss(o, torch.zeros_like(o)), logits, y).startswith("it applies")
    assert "no cross-entropy" in cross_entropy_refusal(lambda o, t: t.float().sum(), logits, y)


OWN_LOSS = '''
import torch


def build():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, use_cache=False)
    ids = torch.randint(0, 64, (2, 8))
    return LlamaForCausalLM(cfg), {"input_ids": ids, "labels": ids}, ids, lambda out, y: out.loss
'''


def test_a_split_loss_of_a_loss_computed_inside_the_model_is_refused(tmp_path, capsys, no_ranks):
    """Hugging Face's own loss from ``labels=``: the chain's last layer returns the loss, not the logits the
    vocabulary-parallel loss needs; one line saying so, before any rank."""
    (tmp_path / "own.py").write_text(OWN_LOSS)
    plan = write_layout_plan(tmp_path / "p.json", pipeline_plan([], 5), Layout(tp=2, loss_parallel=True))
    err = _cli_error(["run", str(plan), "--module", f"{tmp_path / 'own.py'}:build", "--out", str(tmp_path / "r")],
                     capsys)
    assert "computes the loss on the LM head's logits (64 per token), but own:build's chain ends at lm_head with a " \
           "tensor of shape ()" in err, err
    assert "a loss computed inside the model, e.g. from labels=" in err
