"""[validation]: the held-out loss every `freq` steps, without gradients, in every execution mode;
bad held-out sets refused before step 1. (Two ranks: tests/core/dist/test_validation_two_ranks.py;
TensorBoard: test_tensorboard.py.)"""

from __future__ import annotations

import copy
import itertools
import json
import math

import pytest
import torch
import torch.nn.functional as F
from held_out_data import TINY_MODEL, VOCAB, make_cfg, paragraphs, write_corpus
from torch._dynamo.utils import counters

from titan_core.config.loader import ConfigError
from titan_core.data import IGNORE_INDEX, build_data_loader
from titan_core.measure.metrics import read_metrics
from titan_core.measure.numerics import rel
from titan_core.train import main
from titan_core.training.trainer import Trainer
from titan_core.training.validate import Validator, validation_config


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path)


def held_out_by_hand(cfg, model, n_batches: int | None) -> tuple[float, int]:
    """(sum of token cross-entropies / valid tokens, valid tokens) over the first n held-out
    batches (None: a streamed set read to its end), from the model's logits and F.cross_entropy
    (not the validator's code)."""
    held = copy.deepcopy(cfg)
    held.data.path = cfg.validation.path
    loader = build_data_loader(held, vocab_size=VOCAB)
    loader.endless = False  # a streamed set: StopIteration at its end (the other loaders never end)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for b in itertools.islice(loader, n_batches):
            logits = model(b.tokens, positions=b.positions, segment_ids=b.segment_ids).float()
            total += F.cross_entropy(logits.reshape(-1, VOCAB), b.labels.reshape(-1), ignore_index=IGNORE_INDEX,
                                     reduction="sum").item()  # fmt: skip
            count += int((b.labels != IGNORE_INDEX).sum())
    model.train()
    return total / count, count


def test_validation_every_freq_steps_and_at_the_last(corpus, capsys):
    cfg = make_cfg(corpus, "--metrics.log_freq=10")
    trainer = Trainer(cfg)
    result = trainer.train()
    rows = result.metrics
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in rows if "val_loss" in r] == [2, 4, 5]
    assert all({"val_ppl", "val_tokens"}.isdisjoint(r) for r in rows if r["step"] in (1, 3))
    assert read_metrics(corpus / "out" / "metrics.jsonl") == rows  # the file holds the same columns, exactly
    want, tokens = held_out_by_hand(cfg, trainer.model, 3)
    last = rows[-1]
    assert rel(last["val_loss"], want) <= 1e-6 and last["val_tokens"] == tokens
    assert all(r["val_ppl"] == math.exp(r["val_loss"]) and r["val_tokens"] == tokens for r in rows if "val_loss" in r)
    # the weights move, so each validation sees the same batches through another model
    assert len({r["val_loss"] for r in rows if "val_loss" in r}) == 3
    # one printed row per "step=" (the console may wrap a row), spaces normalised
    printed = [" ".join(chunk.split()) for chunk in capsys.readouterr().err.split("step=")[1:]]
    # log_freq 10 prints step 1 only; a validation puts its step on the console beside the training loss
    assert [p.split()[0] for p in printed] == ["1", "2", "4", "5"]
    assert "val loss" not in printed[0]
    assert f"val loss={rows[1]['val_loss']:.4f} val ppl={rows[1]['val_ppl']:.2f}" in printed[1]


def test_validation_takes_no_gradient_and_repeats_itself(corpus):
    cfg = make_cfg(corpus)
    t = Trainer(cfg, quiet=True)
    t.step += 1
    t.train_step()  # gradients and AdamW moments exist: validation must leave them as they are
    params = [p.detach().clone() for p in t.model.parameters()]
    grads = [p.grad.clone() for p in t.model.parameters()]
    opt_state = copy.deepcopy(t.optimizer.state_dict())
    seen = []
    loss = t.model.loss

    def spy(*a, **k):
        seen.append((torch.is_grad_enabled(), t.model.training))
        return loss(*a, **k)

    t.model.loss = spy
    first, second = t.validator.run(t.model), t.validator.run(t.model)
    assert first == second  # the same held-out batches, rewound each time
    assert seen == [(False, False)] * 6  # 3 batches a validation, no autograd, eval mode
    assert t.model.training  # back in the mode training left it in
    assert all(torch.equal(a, p) for a, p in zip(params, t.model.parameters()))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, t.model.parameters()))
    after = t.optimizer.state_dict()
    assert after["param_groups"] == opt_state["param_groups"]
    for k, st in opt_state["state"].items():
        assert all(torch.equal(v, after["state"][k][name]) for name, v in st.items())
    # steps beyond the held-out set: every whole batch it has, once (past them the loader would wrap)
    t.model.loss = loss
    everything = Validator(make_cfg(corpus, val_steps=1000), vocab_size=VOCAB)
    whole = everything.loader.num_rows // 2
    assert everything.num_batches == whole > 3
    got = everything.run(t.model)
    want, tokens = held_out_by_hand(cfg, t.model, whole)
    assert got["val_tokens"] == tokens and rel(got["val_loss"], want) <= 1e-6


@pytest.fixture
def one_eager_step(corpus):
    """The validation columns after one eager step (the reference of the execution modes)."""
    t = Trainer(make_cfg(corpus), quiet=True)
    t.step += 1
    t.train_step()
    return t.validator.run(t.model)


def test_validation_runs_the_compiled_blocks(corpus, one_eager_step):
    t = Trainer(make_cfg(corpus, "--compile.enable", "--compile.backend=aot_eager"), quiet=True)
    t.step += 1
    t.train_step()
    graphs = counters["stats"]["unique_graphs"]
    got = t.validator.run(t.model)
    # eval mode without autograd is a new guard: the compiled blocks compile once more for it, and
    # the next validation reuses those graphs
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > graphs
    assert t.validator.run(t.model) == got and counters["stats"]["unique_graphs"] == compiled
    assert rel(got["val_loss"], one_eager_step["val_loss"]) <= 1e-6
    assert got["val_tokens"] == one_eager_step["val_tokens"]


def test_validation_after_graph_trainer_steps(corpus, one_eager_step):
    t = Trainer(make_cfg(corpus, "--graph_trainer.enable"), quiet=True)
    t.step += 1
    t.train_step()
    assert t.graph_step.stats.captures == 1
    # the captured program wrote the step's weights back: the plain forward validates them
    got = t.validator.run(t.model)
    assert rel(got["val_loss"], one_eager_step["val_loss"]) <= 1e-6
    assert got["val_tokens"] == one_eager_step["val_tokens"]


@pytest.mark.parametrize(
    "held_out, needle",
    [
        ("", "contains no text"),
        ("\n\n   \n", "contains no text"),
        ("alpha beta", "fewer than one global batch"),
        (None, "does not exist"),
    ],
    ids=["empty", "blank", "short", "missing"],
)
def test_a_held_out_set_without_a_batch_is_refused_before_step_1(corpus, held_out, needle):
    val = corpus / "held_out.txt"
    if held_out is not None:
        val.write_text(held_out)
    with pytest.raises(ConfigError) as e:
        Trainer(make_cfg(corpus, f"--validation.path={val}"), quiet=True)
    assert f"validation.path '{val}'" in str(e.value) and needle in str(e.value)
    assert not (corpus / "out" / "metrics.jsonl").exists()


def test_entry_point_exits_2_naming_the_held_out_file(corpus, capsys):
    val = corpus / "empty.txt"
    val.write_text("")
    argv = [TINY_MODEL, "--training.steps=2", "--training.batch_size=2", "--training.seq_len=32",
            "--device.type=cpu", "--parallelism.data_parallel=none", f"--metrics.output_dir={corpus / 'out'}",
            "--data.source=text", f"--data.path={corpus / 'train.txt'}", "--validation.enable",
            f"--validation.path={val}"]  # fmt: skip
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: validation.path") and str(val) in err[0]


def test_sections_that_disagree_are_refused(corpus):
    with pytest.raises(ConfigError, match="validation.enable needs validation.path"):
        validation_config(make_cfg(corpus, "--validation.path="))
    synthetic = make_cfg(corpus, "--data.source=synthetic")
    with pytest.raises(ConfigError, match="data.source = 'synthetic' reads no files"):
        validation_config(synthetic)
    # synthetic data: held-out rows of their own seed, not the training rows
    synthetic.validation.path = ""
    held = Validator(synthetic, vocab_size=VOCAB)
    train = build_data_loader(synthetic, vocab_size=VOCAB)
    assert held.num_batches is None and not torch.equal(held.loader.batch_at(0).tokens, train.batch_at(0).tokens)


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_a_jsonl_held_out_set_is_read_once_to_its_end(corpus):
    train = _jsonl(corpus / "train.jsonl", paragraphs(0, 60).split("\n\n"))
    val = _jsonl(corpus / "val.jsonl", paragraphs(500, 24).split("\n\n"))
    cfg = make_cfg(corpus, "--data.source=dataset", f"--data.path={train}", f"--validation.path={val}",
                   steps=2, freq=1, val_steps=1000)  # fmt: skip
    t = Trainer(cfg, quiet=True)
    assert t.validator.num_batches is None  # a stream does not know its length: read until it ends
    rows = t.train().metrics
    assert [r["step"] for r in rows if "val_loss" in r] == [1, 2]
    want, tokens = held_out_by_hand(cfg, t.model, None)
    assert rows[0]["val_tokens"] == rows[1]["val_tokens"] == tokens > 0  # the same rows, once each
    assert rel(rows[1]["val_loss"], want) <= 1e-6
    empty = corpus / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match=str(empty)):
        Trainer(make_cfg(corpus, "--data.source=dataset", f"--data.path={train}", f"--validation.path={empty}"))
