"""The ladder starts from the user's weights (issue 34, part 6): a workspace made with `--weights`
has `checkpoint.initial_hf` in its recipe, and the eager rung's step-1 loss from those weights is
transformers' loss of the same checkpoint on the same batch, recorded in the ledger.

On a tiny Llama that transformers' `save_pretrained` wrote in 2 shards (tests/core/hf_tiny.py):
the gate passes and records both losses within the bound; with a gate/up swap planted in the
workspace's adapter.py (a pure rename, so the header check cannot see it) the same gate fails on
step1_loss_vs_transformers and its log names both numbers; a packed batch of real data is scored
one document at a time, as the trainer's document-masked step computes it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "core"))  # the tiny checkpoint helpers
from hf_tiny import hf_loss, write_tiny_llama  # noqa: E402

from onboard.cli.app import app  # noqa: E402
from onboard.ladder.gates import load_checklist  # noqa: E402
from titan_core.config import load_config  # noqa: E402
from titan_core.data import build_data_loader  # noqa: E402

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

BOUND = load_checklist("eager").criterion("step1_loss_vs_transformers").threshold

SWAP_GATE_UP = '''

class Adapter(Adapter):  # planted: gate and up projections swapped (same shape: only the loss can tell)
    def layer_keys(self):
        return {**super().layer_keys(), "feed_forward.w1.weight": "mlp.up_proj.weight",
                "feed_forward.w3.weight": "mlp.gate_proj.weight"}


ADAPTER = Adapter()
'''


def onboard(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    # weights far from a fresh init's (std 0.3, not 0.02): the loss is not ln(vocab), as a trained model's is not
    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama", initializer_range=0.3)
    assert len(list(folder.glob("model-*-of-00002.safetensors"))) == 2
    return folder


def _workspace(tmp_path: Path, ckpt: Path, name: str) -> Path:
    made = onboard("new-model", name, "--hf-config", ckpt / "config.json", "--weights", ckpt,
                   "--device", "cpu", "--dir", tmp_path)  # fmt: skip
    assert made.exit_code == 0, made.output
    ws = tmp_path / "onboarding" / name
    recipe = ws / "recipe.toml"
    text = recipe.read_text()
    assert f'initial_hf = "{ckpt}"' in text
    # seconds on a loaded CPU: 2 x 32 tokens, one intra-op thread
    text = text.replace("batch_size = 4", "batch_size = 2").replace("seq_len = 128", "seq_len = 32")
    recipe.write_text(text.replace('type = "cpu"', 'type = "cpu"\nthreads = 1'))
    return ws


def _eager_entry(ws: Path) -> dict:
    return next(e for e in json.loads((ws / "ladder.json").read_text())["attempts"] if e["rung"] == "eager")


def test_eager_from_weights_equals_transformers_and_the_ledger_records_both(tmp_path, ckpt):
    ws = _workspace(tmp_path, ckpt, "tiny")
    res = onboard("next-step", "tiny", "--dir", tmp_path, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["rung"], out["status"]) == ("eager", "passed"), out
    entry = _eager_entry(ws)
    m, d = entry["measurements"], entry["details"]["step1_vs_transformers"]
    ours, theirs = m["step1_loss_compared"], m["step1_loss_transformers"]
    assert ours == m["step1_loss"] and (d["ours"], d["transformers"]) == (ours, theirs)
    assert m["step1_loss_vs_transformers_rel_err"] == d["rel_err"] == abs(ours - theirs) / theirs <= BOUND
    assert (d["precision"], d["bound"], d["checkpoint"]) == ("fp32", BOUND, str(ckpt))
    assert d["upstream_loading"] == {"weights_missing_keys": 0, "weights_unexpected_keys": 0,
                                     "weights_mismatched_keys": 0}  # fmt: skip
    # transformers' loss, computed independently (tests/core/hf_tiny.py) on the run's first batch
    batch = next(build_data_loader(load_config(ws / "recipe.toml", ["--data.repeat_batch=true"]), vocab_size=512))
    assert math.isclose(theirs, hf_loss(ckpt, batch.tokens, batch.labels), rel_tol=1e-6)
    # a trained checkpoint does not start at ln(vocab): what step 1 should be is transformers' loss
    assert m["expected_step1_loss"] == theirs and "transformers" in m["expected_step1_loss_is"]
    assert abs(theirs - math.log(512)) / math.log(512) > 0.25  # judged against ln(vocab), step 1 would fail
    assert str(ckpt / "model-00001-of-00002.safetensors") in entry["files_read"]


def test_a_wrongly_mapped_weight_fails_the_gate_naming_both_losses(tmp_path, ckpt):
    ws = _workspace(tmp_path, ckpt, "swapped")
    with open(ws / "adapter.py", "a", encoding="utf-8") as f:
        f.write(SWAP_GATE_UP)
    res = onboard("next-step", "swapped", "--dir", tmp_path)  # the text a person reads
    assert res.exit_code == 1, res.output
    entry = _eager_entry(ws)
    assert entry["status"] == "failed"
    failed = {c["name"]: c for c in entry["criteria"] if not c["ok"]}
    assert set(failed) == {"step1_loss_vs_transformers"}, failed
    assert "from_hf maps a tensor to the wrong place" in failed["step1_loss_vs_transformers"]["hint"]
    m = entry["measurements"]
    ours, theirs = m["step1_loss_compared"], m["step1_loss_transformers"]
    assert m["step1_loss_vs_transformers_rel_err"] == failed["step1_loss_vs_transformers"]["value"] > 100 * BOUND
    assert f"ours {ours} (the recipe's step 1), transformers {theirs}" in res.stderr
    assert "NOT within the fp32 bound" in res.stderr
    assert "step1_loss_vs_transformers" in res.output


def test_a_packed_batch_is_scored_one_document_at_a_time(tmp_path, ckpt):
    """Real data packs several documents into a row (segment ids, positions from 0 in each): the
    reference scores each document alone, which is what the trainer's document-masked step computes."""
    from hf_data import doc_text, write_jsonl, write_tokenizer
    from hf_tiny import tiny_cfg

    from onboard.rungs.eager_from_weights import transformers_loss
    from titan_core.models.model_builder import resolve_model_args
    from titan_core.training.trainer import Trainer

    corpus = write_jsonl(tmp_path / "train.jsonl", [{"text": doc_text(i)} for i in range(40)])
    cfg = tiny_cfg(ckpt, tmp_path / "out", "--data.source=dataset", f"--data.path={corpus}", "--data.tokenizer=hf",
                   f"--data.tokenizer_path={write_tokenizer(tmp_path / 'tok')}", "--data.repeat_batch=true")  # fmt: skip
    batch = next(build_data_loader(cfg, vocab_size=512))
    assert batch.segment_ids is not None and int(batch.segment_ids[0].max()) >= 2  # several documents in a row
    theirs, how = transformers_loss(cfg, resolve_model_args(cfg.model))
    assert how["packed"] and how["valid_tokens"] == int((batch.labels != -100).sum())
    assert math.isclose(theirs, hf_loss(ckpt, batch.tokens, batch.labels, batch.segment_ids), rel_tol=1e-6)
    ours = Trainer(cfg, quiet=True).train().metrics[0]["loss"]
    assert abs(ours - theirs) / theirs <= BOUND


def test_a_checkpoint_that_does_not_fit_is_refused_before_anything_trains(tmp_path, ckpt):
    """The header check runs first: a checkpoint short of a tensor fails the gate in seconds, naming the
    tensor, and the model is not trained (no metrics were written)."""
    import shutil
    import time

    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    dropped = "model.layers.1.mlp.down_proj.weight"
    del index["weight_map"][dropped]
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    ws = _workspace(tmp_path, broken, "short")
    started = time.monotonic()
    res = onboard("next-step", "short", "--dir", tmp_path)
    assert res.exit_code == 1, res.output
    entry = _eager_entry(ws)
    failed = {c["name"] for c in entry["criteria"] if not c["ok"]}
    assert "full_model_checkpoint_matches" in failed
    assert entry["measurements"]["full_model_checkpoint_problems"] >= 1
    assert "the model was not trained" in entry["details"]["not_trained"]
    assert dropped in json.dumps(entry["details"]["full_model"]["checkpoint"])
    assert not (ws / "runs" / "eager" / f"attempt-{entry['attempt']}" / "metrics.jsonl").exists()
    assert "the --weights checkpoint does not fit the model" in res.stderr
    assert time.monotonic() - started < 60  # the header check alone, not 20 training steps
