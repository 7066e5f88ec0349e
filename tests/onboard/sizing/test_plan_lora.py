"""`onboard plan` of a workspace whose recipe has [lora]: Llama-3.1-70B (a twin workspace, built on meta)
with rank-16 adapters on every attention and MLP projection. The frozen base holds no gradient and no
AdamW state, so the plan fits it on 8 H100s, where full fine-tuning fits nothing; its step counts no
weight gradient of the base; and titan_core's own [lora] refusals (pp, cp, ep, the scanned Graph
Trainer) judge every option, so the recipe written is one titan_core runs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app
from real_size_configs import PUBLISHED
from titan_core.config import load_config

from titan_core.models.common.stats import flops_per_token, param_counts
from titan_core.models.model_builder import resolve_model_args

pytest.importorskip("peft")
pytestmark = pytest.mark.hf

LORA = """
[lora]
enable = true
rank = 16
alpha = 32.0
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""
runner = CliRunner()


@pytest.fixture(scope="module")
def l70(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan_lora")
    (root / "config.json").write_text(json.dumps(PUBLISHED["Llama-3.1-70B"][2]))
    made = runner.invoke(app, ["new-model", "l70", "--hf-config", str(root / "config.json"), "--dir", str(root),
                               "--device", "cpu", "--twin"])  # fmt: skip
    assert made.exit_code == 0, made.stderr
    return root


def _plan(root, target: str):
    return runner.invoke(app, ["plan", "l70", "--dir", str(root), "--target", target, "--json"])


def test_lora_fits_70b_on_8_h100_where_full_fine_tuning_does_not(l70):
    full = _plan(l70, "h100:8")
    assert full.exit_code == 1 and "nothing fits --seq 4096 on 8 x h100" in full.stderr
    ws = l70 / "onboarding" / "l70"
    with open(ws / "recipe.toml", "a") as f:
        f.write(LORA)
    result = _plan(l70, "h100:8")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    c, d = out["chosen"], out["degrees"]
    assert (d["pp"], d["cp"], d["ep"]) == (1, 1, 1) and c["mode"] != "scan"
    # what trains is the adapters: r x (in + out) per projection, 7 of them in each of 80 layers
    args = resolve_model_args(load_config(ws / "recipe.toml").model)
    full_args = resolve_model_args(load_config(out["recipe"]).model)
    kv = full_args.n_kv_heads * full_args.head_dim
    per_layer = 16 * ((8192 + 8192) * 2 + (8192 + kv) * 2 + (8192 + 28672) * 3)
    lora = per_layer * full_args.n_layers
    # AdamW's two fp32 states, over the dp shards (under tp the estimate keeps each adapter whole: one of
    # its halves is split, the other replicated)
    assert c["optimizer_bytes"] == pytest.approx(2 * 4 * lora / d["dp_shard"], rel=0.01)
    assert c["params_bytes"] > 10 * c["optimizer_bytes"]  # the frozen base dominates what a device holds
    # the step computes no weight gradient of the base: 4 FLOPs per frozen weight, not 6
    counts = param_counts(full_args)
    weights = 6.0 * (counts["active"] - counts["embedding"])
    assert out["flops_per_token"] == pytest.approx(flops_per_token(full_args, 4096) - weights / 3 + 6 * lora)
    assert args.n_layers < full_args.n_layers  # the recipe's model is the twin, the plan's the full model
    # titan_core's [lora] refusals judged every option: faster layouts with cp or pp were refused with its reason
    for degree in ("cp", "pp"):
        why = out["degrees_why"][degree]
        assert "refused by titan_core" in why and f"lora composes with SimpleFSDP, FSDP2 and tp only, not " \
            f"parallelism.{degree}" in why, why
    assert "lora under graph_trainer.scan_layers" in out["scan_why"]
    planned = load_config(out["recipe"])
    assert planned.lora.enable and planned.lora.rank == 16 and not planned.graph_trainer.scan_layers
