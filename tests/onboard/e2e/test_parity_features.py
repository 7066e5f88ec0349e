"""Parity exercises what the config declares (issue #11, item 5) and names an embedding
divergence as the embedding (item 8).

A Gemma-2 port (tests/onboard/e2e/gemma2_port.py: soft-caps, sliding window, pad id, embedding
scale, sandwich norms) passes; each test breaks one line of it the way a port gets it wrong.
At the seeded init attention scores sit near 0.006 and logits near 0.1, far below the caps
of 50 and 30: without the features pass the first two bugs below pass parity.
"""

from __future__ import annotations

import json

import pytest
from gemma2_port import gemma2_workspace
from test_parity_support import BASE, edit_file, new_workspace

from onboard.parity.check import check_workspace
from onboard.parity.criteria import asserted_criteria, load_criteria, params, threshold
from onboard.parity.results import failure_summary

pytestmark = pytest.mark.hf

NO_ATTN_CAP = ("scores = softcap(scores, self.cap)\n", "\n")
NO_FINAL_CAP = (
    "return softcap(F.linear(self.hidden(tokens), self.output_weight), self.args.final_softcap)",
    "return F.linear(self.hidden(tokens), self.output_weight)",
)


def failed(m: dict) -> set[str]:
    return {c.name for c in asserted_criteria() if not c.check(m)[0]}


def test_gemma2_port_passes_with_every_declared_feature_exercised(tmp_path):
    res = check_workspace(gemma2_workspace(tmp_path, "g2"))
    assert res["error"] is None
    m = res["measurements"]
    assert failed(m) == set(), json.dumps(m, indent=1)
    assert m["features_exercised"] is True and m["features_idle"] == [] and m["first_divergence_module"] is None
    f = res["features"]
    need = params()["feature_softcap_clipped_min"]
    # idle at the seeded init, clipping in the features pass the scaled weights set up
    for name in ("attention_softcap", "final_softcap"):
        assert f[name]["exercised"] and f[name]["pass"] == "features" and f[name]["value"] >= need, f[name]
        assert "0.0% of" in f[name]["how"] and "clipped" in f[name]["how"]
    assert f["sliding_window"]["exercised"] and f["sliding_window"]["value"] == 512 / 128
    assert f["padding"]["exercised"] and f["padding"]["value"] >= 512 * params()["feature_pad_fraction"]
    assert f["experts"] == {**f["experts"], "declared": False, "exercised": None}
    assert [p["name"] for p in res["passes"]] == ["seeded", "features"]
    assert "q/k projections x" in res["passes"][1]["how"]
    # the features pass scaled the logits to the cap: their largest difference is read in units of
    # their RMS; at the seeded init (RMS below 1) it is the plain difference
    seeded, features_pass = (p["measurements"] for p in res["passes"])
    assert seeded["logits_rms"] == 1.0 and seeded["logits_max_abs"] == seeded["logits_max_abs_raw"]
    assert features_pass["logits_rms"] > 1.0
    assert features_pass["logits_max_abs"] == features_pass["logits_max_abs_raw"] / features_pass["logits_rms"]


def test_port_without_the_attention_softcap_fails_in_the_features_pass(tmp_path):
    root = gemma2_workspace(tmp_path, "no_attn_cap")
    edit_file(root, "model.py", *NO_ATTN_CAP)
    res = check_workspace(root)
    seeded, feature_pass = (p["measurements"] for p in res["passes"])
    assert not failed(seeded) & {"logits_rel_l2", "loss_abs_diff"}  # the seeded init alone would pass it
    assert {"logits_rel_l2", "loss_abs_diff", "grad_max_rel_l2"} <= failed(res["measurements"])
    assert feature_pass["logits_rel_l2"] > threshold("logits_rel_l2")
    assert res["measurements"]["first_divergence_module"] == "layers.0.attention"
    assert res["measurements"]["first_divergence_pass"] == "features"
    assert "in the features pass (q/k projections x" in failure_summary(res)


def test_port_without_the_final_softcap_fails_on_logits_and_loss(tmp_path):
    root = gemma2_workspace(tmp_path, "no_final_cap")
    edit_file(root, "model.py", *NO_FINAL_CAP)
    edit_file(root, "model.py", "CrossEntropyHead(args.final_softcap)", "CrossEntropyHead(None)")
    res = check_workspace(root)
    assert {"logits_rel_l2", "logits_max_abs", "loss_abs_diff"} <= failed(res["measurements"])
    seeded, feature_pass = (p["measurements"] for p in res["passes"])
    assert "loss_abs_diff" not in failed(seeded)  # the loss hides it at the seeded init
    assert feature_pass["loss_abs_diff"] > 1.0
    assert res["measurements"]["first_divergence_module"] == "output"


def test_wrong_padding_idx_fails_on_the_embedding_gradient_and_names_padding_idx(tmp_path):
    root = gemma2_workspace(tmp_path, "no_pad")
    edit_file(root, "model.py", 'padding_idx=args.extra["pad_token_id"]', "padding_idx=None")
    res = check_workspace(root)
    assert failed(res["measurements"]) == {"grad_max_rel_l2"}  # forward and loss agree: only the pad row's gradient
    assert res["measurements"]["grad_worst_param"] in ("lm_head.weight", "model.embed_tokens.weight")  # tied
    assert "padding_idx=0" in res["grads"]["diagnosis"] and "pad row" in res["grads"]["diagnosis"]
    assert "padding_idx" in failure_summary(res)
    grad = next(c for c in load_criteria() if c.name == "grad_max_rel_l2")
    assert "padding_idx" in grad.hint


def test_missing_embedding_scale_is_named_as_the_embedding(tmp_path):
    """Gemma scales inside embed_tokens (an integer-input module: compared, never crashed on)."""
    root = gemma2_workspace(tmp_path, "no_scale")
    edit_file(root, "model.py", "return out * torch.tensor(self.embedding_dim**0.5, dtype=out.dtype)", "return out")
    res = check_workspace(root)
    assert res["error"] is None
    assert res["measurements"]["first_divergence_module"] == "tok_embeddings"
    assert "same input" in res["localisation"]["first"]["why"]


def test_embedding_scale_applied_after_the_embedding_is_not_a_divergence(tmp_path):
    """The port scales in hidden() where upstream scales inside embed_tokens: the same model."""
    root = gemma2_workspace(tmp_path, "scale_after")
    edit_file(root, "model.py", "return out * torch.tensor(self.embedding_dim**0.5, dtype=out.dtype)", "return out")
    edit_file(
        root,
        "model.py",
        "h = self.tok_embeddings(tokens)\n",
        "h = self.tok_embeddings(tokens)\n        h = h * torch.tensor(self.args.dim**0.5, dtype=h.dtype)\n",
    )
    res = check_workspace(root)
    assert failed(res["measurements"]) == set()
    assert res["measurements"]["first_divergence_module"] is None
    emb = next(r for r in res["localisation"]["table"] if r["native"] == "tok_embeddings")
    assert emb["relocated"] and emb["rel_l2"] > threshold("logits_rel_l2")


def test_embedding_multiplier_outside_the_embedding_is_named_as_the_embedding_not_layer0(tmp_path):
    """Granite multiplies after embed_tokens; a llama-shaped port forgets it. Every compared
    module inside layers.0 sees the scaled input, so layers.0 looked like the culprit."""
    import transformers as tf

    cfg = tf.GraniteConfig(
        **BASE, embedding_multiplier=12.0, residual_multiplier=1.0, attention_multiplier=16**-0.5, logits_scaling=1.0
    )
    res = check_workspace(new_workspace(tmp_path, "granite", cfg, path="port"))
    m = res["measurements"]
    assert m["first_divergence_module"] == "tok_embeddings", res["localisation"]["first"]
    assert m["first_divergence_rel_l2"] > threshold("logits_rel_l2")  # the first block's input, not the agreeing output
    assert "input of layers.0 already differs" in res["localisation"]["first"]["why"]
    assert "embedding scale or multiplier" in res["localisation"]["first"]["why"]


def test_a_port_that_raises_records_the_error_and_what_was_measured_before(tmp_path):
    root = gemma2_workspace(tmp_path, "raises")
    raising = '        raise RuntimeError("loss head not ported yet")\n        ce = self.loss_head('
    edit_file(root, "model.py", "        ce = self.loss_head(", raising)
    res = check_workspace(root)
    message = "native loss failed: RuntimeError: loss head not ported yet"
    assert res["error"] == {"kind": "port", "message": message}
    assert res["measurements"]["logits_rel_l2"] == 0.0  # the forward ran and agreed before the loss raised
    assert failure_summary(res).splitlines()[0] == f"port error: {message}"
    on_disk = json.loads((root / "runs" / "parity" / "results.json").read_text())
    assert on_disk["error"] == res["error"]
