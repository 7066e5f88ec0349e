"""Structurally impossible configs are refused where the args are made: new-model exits 2
with one line naming the file, the field, its value and what is accepted
(`<file>: <field> = <value> is not accepted; <accepted>`), and writes nothing; the trainer
refuses the same in a recipe edited by hand. On every path: native, port, transformers and
FLUX (tests/onboard/cli/test_config_fuzz.py feeds every numeric field bad values)."""

import json
import math
from pathlib import Path

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
from test_cli import LLAMA
from typer.testing import CliRunner

from onboard.cli.app import app
from titan_core.config import ConfigError
from titan_core.config.hf_config import MAX_DEPTH, json_depth, read_hf_config
from titan_core.models import FAMILY_NAMES, apply_model_overrides, get_family, resolve_args
from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.mapping_errors import AdapterError, ArchitectureError
from titan_core.models.common.validate import MAX_WIDTH
from titan_core.train import main as train_main

runner = CliRunner()
QWEN3 = {**LLAMA, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 16}
MOE = {**QWEN3, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4,
       "num_experts_per_tok": 2, "moe_intermediate_size": 32}  # fmt: skip
FLUX = get_family("flux").adapter.hf_config(resolve_args("flux", "debugmodel"))
DEEP = '{"model_type": "llama", "x": ' + "[" * 200_000 + "]" * 200_000 + "}"

PROBES = {
    "heads_0": ({**LLAMA, "num_attention_heads": 0}, ["num_attention_heads = 0 is not accepted; an integer from 1"]),
    "layers_0": ({**LLAMA, "num_hidden_layers": 0}, ["num_hidden_layers = 0 is not accepted; an integer from 1"]),
    "hidden_negative": ({**LLAMA, "hidden_size": -8}, ["hidden_size = -8 is not accepted", "an integer from 1"]),
    "hidden_fraction": ({**LLAMA, "hidden_size": 64.5}, ["hidden_size = 64.5 is not accepted", "an integer from 1"]),
    "hidden_1e30": ({**LLAMA, "hidden_size": 1e30}, ["hidden_size = 1e+30 is not accepted", f"to {MAX_WIDTH}"]),
    "hidden_int_10e30": ({**LLAMA, "hidden_size": 10**30}, [f"hidden_size = {10**30} is not accepted"]),
    "hidden_4_0": ({**LLAMA, "hidden_size": 64.0}, ["hidden_size = 64.0 is not accepted", "an integer"]),
    "hidden_text": ({**LLAMA, "hidden_size": "64"}, ['hidden_size = "64" is not accepted', "an integer"]),
    "theta_inf": (
        {**LLAMA, "rope_parameters": {"rope_theta": math.inf, "rope_type": "default"}},
        ["rope_parameters.rope_theta = Infinity is not accepted", "a finite number > 0"],
    ),
    "eps_nan": ({**LLAMA, "rms_norm_eps": math.nan}, ["rms_norm_eps = NaN is not accepted", "a finite number"]),
    "init_std_nan": ({**LLAMA, "initializer_range": math.nan}, ["initializer_range = NaN is not accepted"]),
    "tied_text": ({**LLAMA, "tie_word_embeddings": "false"}, ['tie_word_embeddings = "false" is not', "true or false"]),
    "pad_past_vocab": ({**LLAMA, "pad_token_id": 256}, ["pad_token_id = 256 is not accepted", "vocab_size = 256"]),
    "pad_list": ({**LLAMA, "pad_token_id": [0, 1]}, ["pad_token_id = [0, 1] is not accepted"]),
    "flux_float": ({**FLUX, "num_layers": 1.5}, ["num_layers = 1.5 is not accepted", "an integer from 0"]),
    "flux_overflow": ({**FLUX, "num_single_layers": 10**30}, [f"num_single_layers = {10**30} is not accepted"]),
    "flux_nan": ({**FLUX, "in_channels": math.nan}, ["in_channels = NaN is not accepted"]),
    "flux_guidance_text": ({**FLUX, "guidance_embeds": "false"}, ['guidance_embeds = "false" is not', "true or false"]),
    "flux_axes": ({**FLUX, "axes_dims_rope": [4, 6, 8]}, ["axes_dims_rope = [4, 6, 8] is not accepted", "= 16"]),
    "flux_patch": ({**FLUX, "patch_size": 2}, ["patch_size = 2 is not accepted; exactly 1"]),
    "kv_not_dividing": (
        {**LLAMA, "num_key_value_heads": 3},
        ["num_attention_heads = 4", "must be a multiple of num_key_value_heads = 3"],
    ),
    "hidden_66_4_heads": ({**LLAMA, "hidden_size": 66}, ["hidden_size = 66", "multiple of num_attention_heads = 4"]),
    "qwen3_hidden_66_no_head_dim": (
        {k: v for k, v in {**QWEN3, "hidden_size": 66}.items() if k != "head_dim"},
        ["hidden_size = 66", "unless head_dim is given"],
    ),
    "deep_nesting_200000": (DEEP, [f"nesting depth > {MAX_DEPTH}"]),
    "bool_for_int": ({**LLAMA, "num_hidden_layers": True}, ["num_hidden_layers = true is not accepted", "an integer"]),
    "top_k_over_experts": ({**MOE, "num_experts_per_tok": 8}, ["num_experts_per_tok = 8", "at most num_experts = 4"]),
    "odd_head_dim": ({**QWEN3, "head_dim": 15}, ["head_dim = 15", "must be even"]),
}


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def new_model(tmp_path: Path, cfg, *extra: str):
    path = tmp_path / "config.json"
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return runner.invoke(app, ["new-model", "m", "--hf-config", str(path), "--dir", str(tmp_path), *extra])


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_impossible_config_exits_2_naming_field_value_rule_and_writes_nothing(tmp_path, probe):
    cfg, needles = PROBES[probe]
    new_model(tmp_path, cfg)  # writes config.json, so the snapshot holds it
    before = snapshot(tmp_path)
    result = new_model(tmp_path, cfg)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    assert lines[0].startswith(f"error: {tmp_path.resolve() / 'config.json'}: ") or probe.startswith("deep"), lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert "--path" not in lines[0] or not probe.startswith("flux"), "FLUX runs on the native path only"

    result = new_model(tmp_path, cfg, "--json")
    assert result.exit_code == 2
    data = json.loads(result.stdout)  # one JSON object and nothing else
    assert isinstance(data, dict) and all(n in data["error"] for n in needles), data
    assert not (tmp_path / "onboarding").exists() and snapshot(tmp_path) == before


def test_the_port_path_refuses_them_too(tmp_path):
    # another adapter error (gelu) is a TODO of the port; a zero head count is not
    cfg = {**LLAMA, "model_type": "granite", "hidden_act": "gelu", "num_attention_heads": 0}
    result = new_model(tmp_path, cfg, "--path", "port")
    assert result.exit_code == 2, result.stdout
    assert "num_attention_heads = 0" in result.stderr and not (tmp_path / "onboarding").exists()


def test_explicit_head_dim_frees_the_width_where_upstream_allows_it(tmp_path):
    # Qwen3 reads head_dim as given (its published models have heads * head_dim != hidden)
    result = new_model(tmp_path, {**QWEN3, "hidden_size": 66}, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["family"] == "qwen3"


def test_a_list_where_a_number_is_meant_stays_a_port_todo():
    # per-layer sizes are another config layout, not an impossible one: a plain AdapterError
    with pytest.raises(AdapterError) as e:
        get_family("llama3").adapter.args_from_hf({**LLAMA, "intermediate_size": [128, 256]})
    assert not isinstance(e.value, ArchitectureError) and "intermediate_size = [128, 256]" in str(e.value)


def test_every_flavor_and_its_export_pass_the_rules():
    for name in FAMILY_NAMES:
        fam = get_family(name)
        for flavor in fam.flavors:
            args = resolve_args(name, flavor)
            assert fam.adapter.args_from_hf(fam.adapter.hf_config(args))[0] == args, (name, flavor)


def test_an_override_breaking_a_rule_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"n_heads = 16 is not accepted; must be a multiple of model\.overrides"):
        resolve_args("llama3", "debugmodel", {"n_kv_heads": 3})
    with pytest.raises(ConfigError, match=r"model\.overrides\.n_layers = true"):
        resolve_args("llama3", "debugmodel", {"n_layers": True})


def test_args_an_adapter_let_through_are_refused_as_its_error():
    bad = TransformerArgs(dim=64, n_heads=4, n_kv_heads=3)  # no check on construction
    with pytest.raises(ArchitectureError) as e:
        apply_model_overrides(bad, None)
    assert not isinstance(e.value, ConfigError) and set(e.value.fields) == {"n_heads", "n_kv_heads"}


def test_json_depth_counts_brackets_outside_strings_only(tmp_path):
    assert json_depth('{"a": [1, {"b": [2]}]}') == 4
    assert json_depth('{"a": "[[[{{{", "b": "\\"[["}') == 1
    assert json_depth("[" * 10_000) == MAX_DEPTH + 1  # stops at the limit
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "x": [[[[{"y": [1]}]]]]}))
    assert read_hf_config(path)["x"][0][0][0][0]["y"] == [1]  # a few levels read as before


@pytest.mark.parametrize(
    "model, needle",
    [
        ({"family": "llama3", "flavor": "debugmodel", "overrides": {"n_heads": 0}}, "model.overrides.n_heads = 0"),
        ({"family": "llama3", "hf_config": "HF"}, "num_attention_heads = 4 is not accepted; must be a multiple of"),
    ],
)
def test_the_trainer_refuses_a_hand_edited_recipe_with_exit_2(tmp_path, capsys, model, needle):
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({**LLAMA, "num_key_value_heads": 3}))
    table = {k: str(hf) if v == "HF" else v for k, v in model.items() if k != "overrides"}
    lines = ["[model]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    lines += ["[model.overrides]"] + [f"{k} = {v}" for k, v in model.get("overrides", {}).items()]
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("\n".join(lines) + "\n")
    argv = ["--config", str(recipe), "--device.type=cpu", "--training.steps=1", f"--metrics.output_dir={tmp_path}/o"]
    assert train_main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


# ---- the transformers path ---------------------------------------------------------------
TRANSFORMERS_PROBES = {
    # the config class's own validation (a strict dataclass error, no ValueError), named by field
    "hidden_text": ({**LLAMA, "hidden_size": "64"}, ['hidden_size = "64" is not accepted', "LlamaConfig"]),
    "pad_list": ({**LLAMA, "pad_token_id": [1, 2]}, ["pad_token_id = [1, 2] is not accepted"]),  # Whisper-shaped
    "pad_past_vocab": ({**LLAMA, "pad_token_id": 9999}, ["pad_token_id = 9999 is not accepted", "vocab_size = 256"]),
    "mamba_hidden_negative": (
        {"model_type": "mamba", "hidden_size": -4, "num_hidden_layers": 2, "vocab_size": 256},
        ["hidden_size = -4 is not accepted; an integer from 1"],
    ),
    "xlnet": (
        {"model_type": "xlnet", "d_model": 64, "n_layer": 2, "n_head": 4, "d_inner": 128, "vocab_size": 256},
        ["xlnet is not a causal LM", "attends ahead"],
    ),
    "bert": (
        {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 128, "vocab_size": 256},
        ["bert is not a causal LM", "is_decoder = true"],
    ),  # fmt: skip
    "t5": (
        {"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4, "d_ff": 128, "vocab_size": 256},
        ["no causal-LM class for model_type 't5'", "encoder-decoder"],
    ),
}


@pytest.mark.parametrize("probe", sorted(TRANSFORMERS_PROBES))
def test_the_transformers_path_refuses_with_one_line_naming_the_field(tmp_path, probe):
    cfg, needles = TRANSFORMERS_PROBES[probe]
    result = new_model(tmp_path, cfg, "--path", "transformers")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path.resolve() / 'config.json'}: "), result.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    assert "Traceback" not in result.stderr and not (tmp_path / "onboarding").exists()


def test_an_encoder_set_up_as_a_decoder_is_a_causal_lm():
    from onboard.compat.causal import not_causal_reason

    bert = TRANSFORMERS_PROBES["bert"][0]
    assert "not a causal LM" in not_causal_reason(bert)
    assert not_causal_reason({**bert, "is_decoder": True}) is None
    assert not_causal_reason(LLAMA) is None
