"""A FLUX diffusion transformer through onboarding: a diffusers config scaffolds a flux workspace,
parity against diffusers passes out of the box and fails on a broken adapter, the eager rung's
step-1 check knows a flow model, and the kernels rung compares on weights where attention matters."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.parity.check import check_workspace
from onboard.parity.criteria import asserted_criteria
from onboard.rungs import eager_rung
from onboard.rungs.kernels_rung.compare import build_model_with, forward, kernels_for, make_batch
from onboard.workspace.scaffold import plan_workspace, write_workspace
from titan_core.measure.numerics import rel_l2
from titan_core.models.common.attention import NaiveAttention
from titan_core.models.registry import get_family

FLUX = get_family("flux")
DEBUG = FLUX.flavors["debugmodel"]
runner = CliRunner()


def diffusers_config(tmp_path):
    """The debug model's config as diffusers writes one: no model_type, a _class_name."""
    cfg = {k: v for k, v in FLUX.adapter.hf_config(DEBUG).items() if k != "model_type"}
    cfg["_diffusers_version"] = "0.42.1"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def flux_workspace(tmp_path, name="tiny_flux"):
    return write_workspace(plan_workspace(name, tmp_path, hf_config=diffusers_config(tmp_path), device="cpu"))


def test_a_diffusers_config_scaffolds_a_flux_workspace(tmp_path):
    root = flux_workspace(tmp_path)
    recipe = (root / "recipe.toml").read_text()
    assert 'family = "flux"' in recipe and "seq_len = 64  # a sample's image tokens" in recipe
    assert "cache_dir" not in recipe  # no tokenizer for a flow model
    assert "FluxTransformer2DModel" in (root / "adapter.py").read_text()
    ledger = json.loads((root / "ladder.json").read_text())
    assert ledger["workspace"]["model_type"] == "flux" and ledger["workspace"]["unconsumed_keys"] == []
    # the causal-LM paths refuse it, with the path that runs it
    out = runner.invoke(app, ["new-model", "other", "--hf-config", str(diffusers_config(tmp_path)), "--path",
                              "transformers", "--dir", str(tmp_path)])  # fmt: skip
    assert out.exit_code == 2 and "leave --path out" in out.output
    assert not (tmp_path / "onboarding" / "other").exists()


def _failed(res):
    return {c.name for c in asserted_criteria() if not c.check(res["measurements"])[0]}


def test_parity_against_diffusers_passes_and_catches_a_swapped_weight(tmp_path):
    root = flux_workspace(tmp_path)
    res = check_workspace(root)
    m = res["measurements"]
    assert res["error"] is None and res["upstream_class"] == "FluxTransformer2DModel"
    assert _failed(res) == set(), json.dumps(m, indent=1)
    assert m["seq_len"] >= 512 and res["sample"]["image_tokens"] + res["sample"]["text_tokens"] == m["seq_len"]
    assert m["features_exercised"] is True and res["features"]["guidance"]["exercised"] is True
    assert m["modules_compared"] >= 40
    # an adapter that maps the image stream's q and k projections to each other's weights
    text = (root / "adapter.py").read_text()
    text += '''

class _Swapped(type(ADAPTER)):
    def from_hf(self, sd, **kw):
        out = super().from_hf(sd, **kw)
        q, k = "layers.0.attention.qkv.wq.weight", "layers.0.attention.qkv.wk.weight"
        out[q], out[k] = out[k], out[q]
        return out


ADAPTER = _Swapped()
'''
    (root / "adapter.py").write_text(text)
    bad = check_workspace(root)
    assert {"logits_rel_l2", "grad_max_rel_l2"} <= _failed(bad)
    # modules are paired through the adapter's own mapping, so the swapped projections agree with
    # the upstream ones they were loaded from: the divergence is named at the step after them,
    # inside the first block's attention
    assert bad["measurements"]["first_divergence_module"].startswith("layers.0.attention.")
    assert "layers.0.attention.wo" in bad["localisation"]["first"]["why"]


def test_eager_expects_a_flow_model_to_start_at_the_velocity_mean_square():
    rows = [{"loss": 1.99, "grad_norm": 0.2, "step_time_s": 0.1, "tokens_per_s": 1.0, "mfu": 0.0,
             "peak_mem_bytes": 1}, {"loss": 1.9, "grad_norm": 0.2, "step_time_s": 0.1, "tokens_per_s": 1.0,
             "mfu": 0.0, "peak_mem_bytes": 1}]  # fmt: skip
    m = eager_rung.measure(rows, DEBUG, 10, steps=2)
    assert m["expected_step1_loss"] == 2.0 and "vocab_size" not in m
    assert math.isclose(m["step1_loss_rel_to_expected"], 0.005)


def test_kernel_comparisons_on_a_flux_model_are_not_vacuous():
    """adaLN-Zero makes every block the identity at init: the kernels rung's models are livened, so
    an attention that drops the wrong mask is seen in the output and the loss."""
    ref = build_model_with("flux", DEBUG, kernels_for("attention", "naive", None), "cpu", torch.float32,
                           field_name="attention")  # fmt: skip
    wrong = build_model_with("flux", DEBUG, kernels_for("attention", "naive", None), "cpu", torch.float32,
                             state=ref.state_dict(), field_name="attention")  # fmt: skip

    class Causal(NaiveAttention):
        def forward(self, q, k, v, **kw):
            return super().forward(q, k, v, **{**kw, "causal": True})

    for block in wrong.layers.values():
        block.attention.core = Causal()
    b = make_batch(DEBUG, batch=2, seq_len=64, seed=0, device="cpu")
    # ten times the kernels gate's 1e-5 on the output (the loss, dominated by the target's own
    # variance, moves less: the gate judges output and gradients beside it)
    assert rel_l2(forward(wrong, b), forward(ref, b)) > 1e-4


def test_an_unknown_demo_preset_is_bad_input(tmp_path):
    out = runner.invoke(app, ["demo", "--preset", "sd3_debug", "--dir", str(tmp_path)])
    assert out.exit_code == 2 and "flux_debug" in out.output
    assert not (tmp_path / "onboarding").exists()


FLUX1_DEV = {
    "_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.30.0.dev0", "attention_head_dim": 128,
    "guidance_embeds": True, "in_channels": 64, "joint_attention_dim": 4096, "num_attention_heads": 24,
    "num_layers": 19, "num_single_layers": 38, "patch_size": 1, "pooled_projection_dim": 768,
    "axes_dims_rope": [16, 56, 56],
}  # fmt: skip
"""FLUX.1-dev's transformer/config.json as diffusers ships it."""


def test_flux1_dev_gets_a_twin_and_is_counted_whole_on_meta(tmp_path):
    from onboard.parity.diffusion import diffusers_model
    from onboard.sizing.twin.setup import apply_twin
    from titan_core.models.registry import build_meta

    path = tmp_path / "config.json"
    path.write_text(json.dumps(FLUX1_DEV))
    plan = plan_workspace("dev", tmp_path, hf_config=path, device="cpu")
    choice = apply_twin(plan)
    twin = choice.twin.config
    assert (twin["num_layers"], twin["num_single_layers"], twin["num_attention_heads"]) == (1, 1, 2)
    assert twin["attention_head_dim"] == 128 and twin["axes_dims_rope"] == [16, 56, 56] and twin["guidance_embeds"]
    assert "seq_len = 64  #" in plan.files["recipe.toml"]  # the twin's sample, not FLUX.1's 4096 image tokens
    full_args, _ = FLUX.adapter.args_from_hf(plan.hf_config)
    ours = build_meta("flux", full_args)
    with torch.device("meta"):
        theirs = diffusers_model(plan.hf_config)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters()) == 11_901_408_320
    mapped = {k: tuple(v.shape) for k, v in FLUX.adapter.to_hf(ours.state_dict()).items()}
    assert mapped == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    # FLOPs per image token at 1024 px (4096 image + 512 text tokens): 5.45e10, about 2.2e14 per sample
    assert math.isclose(ours.flops_per_token(), 54_480_947_328, rel_tol=1e-12)
