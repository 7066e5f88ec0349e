"""The twin: a small config with the full model's structure, chosen when the full model does
not fit the gates, written by new-model and read back by the same adapter.

The real-size configs are the published ones (tests/real_size_configs.py). Structure is
checked field by field on the args the adapter reads back, and (with transformers) the
upstream class built on meta from the twin config has exactly the names and shapes the
native twin exports: what parity then compares with values.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.errors import BadInput
from onboard.sizing.fit import choose_twin, gate_fit
from onboard.workspace.scaffold import plan_workspace
from real_size_configs import PUBLISHED
from titan_core.models import get_family
from titan_core.models.common.param_counts import count_params
from titan_core.models.registry import build_meta
from onboard.sizing.twin.derive import KEPT, TwinError, derive_twin
from onboard.sizing.twin.kept_layers import layer_kind, pattern_layers

REAL = ["Llama-3.1-8B", "Llama-3.1-70B", "Qwen3-8B", "Qwen3-235B-A22B", "Mistral-7B-v0.1", "Qwen2.5-7B", "Llama-3.2-1B"]


def twin_of(name: str, **knobs):
    family, _, cfg = PUBLISHED[name]
    return family, cfg, derive_twin(cfg, get_family(family).adapter, **knobs)


@pytest.mark.parametrize("name", REAL)
def test_twin_keeps_every_structural_feature(name):
    family, cfg, twin = twin_of(name)
    full, small = twin.full_args, twin.args
    for f in KEPT:
        assert getattr(small, f) == getattr(full, f), f
    # GQA stays GQA with 2 key/value heads and its ratio, as its row says; head_dim kept, explicit in the twin
    ratio, kept_ratio = full.n_heads // full.n_kv_heads, small.n_heads // small.n_kv_heads
    heads_row = next(r for r in twin.rows if r.field == "num_attention_heads")
    assert small.n_kv_heads == 2 and kept_ratio == ratio
    assert "kept" in heads_row.why and "--twin-width" not in heads_row.why
    assert twin.config.get("head_dim", cfg.get("head_dim")) == full.head_dim == small.head_dim
    assert small.dim == 256  # every family's twin equally wide, whatever its heads
    assert small.n_layers == 2 and small.vocab_size == 2048
    assert small.dim < full.dim and small.ffn_hidden_dim < full.ffn_hidden_dim
    assert twin.config["model_type"] == cfg["model_type"] and twin.config["architectures"] == cfg["architectures"]
    # only sizes (and ids that point past the vocabulary) change; every other key is kept as written
    changed = {k for k in cfg if twin.config.get(k) != cfg[k]}
    sizes = {"num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
             "moe_intermediate_size", "vocab_size", "max_window_layers", "sliding_window", "bos_token_id",
             "eos_token_id", "num_experts"}  # fmt: skip
    assert changed <= sizes, changed - sizes
    assert {r.field for r in twin.rows} >= changed
    # the twin costs what a debug model costs: a few million parameters
    assert count_params(build_meta(family, small)).total < 40e6


def test_twin_table_of_qwen3_235b():
    _, _, twin = twin_of("Qwen3-235B-A22B")
    rows = {r.field: r for r in twin.rows}
    assert (rows["num_hidden_layers"].full, rows["num_hidden_layers"].twin) == (94, 2)
    assert (rows["num_attention_heads"].twin, rows["num_key_value_heads"].twin) == (32, 2)  # GQA 64:4 -> 32:2
    assert "GQA ratio 16 kept with 2 key/value heads" in rows["num_key_value_heads"].why
    assert (rows["GQA ratio"].full, rows["GQA ratio"].twin) == ("64:4", "32:2")
    assert (rows["hidden_size"].full, rows["hidden_size"].twin) == (4096, 256)
    assert (rows["moe_intermediate_size"].full, rows["moe_intermediate_size"].twin) == (1536, 96)  # x 256/4096
    assert (rows["num_experts"].full, rows["num_experts"].twin, rows["top_k"].twin) == (128, 16, 8)  # 2 x top-8
    assert rows["bos_token_id"].twin == 2048 - (151936 - 151643)
    table = twin.table()
    assert table.splitlines()[0].split() == ["field", "full", "twin", "why"] and "GQA ratio" in table


def test_width_rules_follow_the_config_class():
    # Llama's config derives head_dim from hidden_size, but LlamaConfig and the adapter read an explicit one:
    # the twin writes head_dim 128 and stays 256 wide with the ratio's 16:2 heads
    _, _, llama = twin_of("Llama-3.1-70B")
    assert (llama.args.dim, llama.args.n_heads, llama.args.n_kv_heads, llama.args.head_dim) == (256, 16, 2, 128)
    assert llama.config["head_dim"] == 128 and llama.config["hidden_size"] == 256
    # a width is a multiple of 16 (float8's scaled matmul), the knob must agree
    with pytest.raises(TwinError, match=r"--twin-width 1000: .*multiples of 16.* e\.g\. --twin-width 992, 1008$"):
        twin_of("Llama-3.1-70B", width=1000)
    _, _, wide = twin_of("Llama-3.1-70B", width=2048)  # a wider twin keeps the same heads
    assert (wide.args.dim, wide.args.n_heads, wide.args.n_kv_heads) == (2048, 16, 2)
    # LlamaConfig wants hidden_size a multiple of the query heads: 128:8 keeps 32:2, so 272 rounds up to 288
    _, _, big = twin_of("Llama-3.1-405B", width=272)
    assert (big.args.dim, big.args.n_heads, big.args.n_kv_heads) == (288, 32, 2)
    assert "a multiple of the 32 query heads" in next(r.why for r in big.rows if r.field == "hidden_size")
    # Qwen3 has an explicit head_dim: the width is free
    _, _, qwen = twin_of("Qwen3-8B", width=384)
    assert (qwen.args.dim, qwen.args.head_dim, qwen.args.n_heads, qwen.args.n_kv_heads) == (384, 128, 8, 2)


def test_layer_pattern_periods_are_kept():
    glimmer = get_family("glimmer")
    cfg = glimmer.adapter.hf_config(glimmer.flavors["8B"])  # sliding/full every 4, RoPE skipped every 4
    twin = derive_twin(cfg, glimmer.adapter)
    assert twin.args.n_layers == 4 and twin.args.sliding_window == 64  # a gate's sequence crosses the window
    assert [layer_kind(twin.args, i) for i in range(4)] == [layer_kind(twin.full_args, i) for i in range(4)]
    assert twin.args.final_softcap == 30.0 and twin.args.tie_embeddings
    # dense-then-MoE every second layer: layers 0-2 dense (1 forced, 2 off the period), then a period of 2
    moe = get_family("qwen3_moe")
    args = replace(moe.flavors["30B-A3B"], moe_every=2, dense_layers=[0, 1])
    n, why = pattern_layers(args)
    assert n == 5 and "3 dense layer(s) first" in why and "MoE every 2" in why
    twin = derive_twin(moe.adapter.hf_config(args), moe.adapter)
    assert twin.config["mlp_only_layers"] == [0, 1] and twin.args.n_layers == 5
    assert [twin.args.layer_is_moe(i) for i in range(5)] == [False, False, False, True, False]


def test_knobs_out_of_range_are_refused():
    with pytest.raises(TwinError, match="between 2"):
        twin_of("Qwen3-8B", layers=1)
    with pytest.raises(TwinError, match="above top-k"):
        twin_of("Qwen3-235B-A22B", experts=8)
    _, _, twin = twin_of("Qwen3-235B-A22B", experts=16, layers=3)
    assert (twin.args.n_experts, twin.args.top_k, twin.args.n_layers) == (16, 8, 3)


def _recipe(family: str, budget_gib: float) -> str:
    """new-model's recipe.toml for `family`, with a memory budget per process set by hand."""
    plan = plan_workspace("x", Path("/nonexistent"), preset=f"{family}/debugmodel", device="cpu")
    return plan.files["recipe.toml"].replace('type = "cpu"', f'type = "cpu"\nmemory_budget_gib = {budget_gib}')


def test_choose_twin_when_the_full_model_does_not_fit():
    family, _, cfg = PUBLISHED["Qwen3-8B"]
    adapter = get_family(family).adapter
    recipe = _recipe(family, 8.0)  # 8 GiB a process: 8B in fp32 is 30.5 GiB of parameters alone
    full = gate_fit(cfg, adapter, recipe_text=recipe)
    # memory_budget_gib is per process, so every rank gets it whole: the unsharded eager run is the tightest
    assert not full.fits and full.run == "eager (one process)"
    choice = choose_twin(cfg, adapter, recipe_text=recipe)
    assert choice.twin is not None and choice.twin_fit.fits and "does not fit" in choice.reason
    assert choose_twin(cfg, adapter, recipe_text=recipe, mode="off").twin is None
    small = adapter.hf_config(get_family(family).flavors["debugmodel"])
    assert choose_twin(small, adapter, recipe_text=recipe).twin is None  # it fits
    assert choose_twin(small, adapter, recipe_text=recipe, mode="on").twin is not None
    with pytest.raises(BadInput, match="--no-twin"):
        choose_twin(cfg, adapter, recipe_text=recipe, mode="off", layers=3)


def test_experts_halve_until_the_twin_fits():
    family, _, cfg = PUBLISHED["Qwen3-235B-A22B"]
    adapter = get_family(family).adapter
    with16 = gate_fit(derive_twin(cfg, adapter).config, adapter, recipe_text=_recipe(family, 1.0))
    # a budget between the 9-expert twin's estimate (top-8 + 1) and the default 16-expert twin's
    with9 = gate_fit(derive_twin(cfg, adapter, experts=9).config, adapter, recipe_text=_recipe(family, 1.0))
    budget = (with16.estimate.total + with9.estimate.total) / 2 / 2**30
    choice = choose_twin(cfg, adapter, recipe_text=_recipe(family, budget))
    assert choice.twin.args.n_experts == 9 and choice.twin_fit.fits
    assert any(r.field == "num_experts" and "fits the budget" in r.why for r in choice.twin.rows)


runner = CliRunner()


def test_new_model_writes_the_twin_and_runs_the_gates_on_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED["Qwen3-8B"][2]))
    # --twin: whether 8B fits depends on the host (the auto rule is tested above with a set budget)
    result = runner.invoke(app, ["new-model", "q8", "--hf-config", str(tmp_path / "config.json"), "--dir",
                                 str(tmp_path), "--device", "cpu", "--twin", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    root = tmp_path / "onboarding" / "q8"
    assert "twin.json" in out["files"] and out["twin"]["file"] == "twin.json" and out["warnings"] == []
    assert out["twin_decision"] == "--twin"
    twin = json.loads((root / "twin.json").read_text())
    assert twin["num_hidden_layers"] == 2 and twin["head_dim"] == 128
    assert json.loads((root / "config.json").read_text()) == PUBLISHED["Qwen3-8B"][2]  # the full model, untouched
    assert 'hf_config = "twin.json"' in (root / "recipe.toml").read_text()
    readme = (root / "README.md").read_text()
    assert "| `num_hidden_layers` | 36 | 2 |" in readme
    ledger = json.loads((root / "ladder.json").read_text())
    assert ledger["workspace"]["twin"]["rows"] == out["twin"]["rows"]

    from onboard.workspace.layout import Workspace

    ws = Workspace.load(tmp_path, "q8")
    assert ws.twin_path == root / "twin.json"
    assert ws.model_label().startswith("twin of the full model: twin.json (num_hidden_layers 2")


def test_new_model_twin_knobs_are_bad_input(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED["Llama-3.1-8B"][2]))
    base = ["new-model", "l8", "--hf-config", str(tmp_path / "config.json"), "--dir", str(tmp_path), "--device", "cpu"]
    for extra, needle in (
        (["--twin-layers", "1"], "--twin-layers 1"),
        (["--twin-width", "300"], "--twin-width 300"),
        (["--no-twin", "--twin-layers", "3"], "--no-twin"),
    ):
        result = runner.invoke(app, base + extra)
        assert result.exit_code == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not (tmp_path / "onboarding" / "l8").exists()
    result = runner.invoke(app, base + ["--no-twin", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["twin"] is None


@pytest.mark.hf
@pytest.mark.parametrize("name", ["Llama-3.1-8B", "Llama-3.1-70B", "Qwen3-235B-A22B", "Mistral-7B-v0.1", "Qwen2.5-7B"])
def test_upstream_twin_has_the_native_twins_names_and_shapes(name, tmp_path):
    transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")
    import torch

    family, _, twin = twin_of(name)
    config = transformers.AutoConfig.for_model(**twin.config)
    with torch.device("meta"):
        upstream = transformers.AutoModelForCausalLM.from_config(config)
    native = get_family(family).adapter.to_hf(build_meta(family, twin.args).state_dict())
    shapes = {k: tuple(v.shape) for k, v in upstream.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in native.items()} == shapes
