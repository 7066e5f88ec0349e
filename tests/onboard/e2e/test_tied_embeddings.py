"""Tied embeddings on every path: the output head IS the embedding, one tensor under two names.

The rule is titan_core/models/common/tied.py: the native model holds the tensor once, an HF
state dict in memory under both names, a checkpoint on disk once (some exporters twice). The
eager rung's full-model probe, the adapters in both directions and the export follow it, for
every native family (titan_core.models.registry.FAMILY_NAMES) on the native, port and
transformers paths, and for Gemma-2, which no family claims and whose config class ties by
default. Configs are written as a new user writes config.json; models are 2 layers of width 64.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.ladder.gates import evaluate, load_checklist
from onboard.parity.check import check_workspace
from onboard.parity.native import build_native, load_adapter, native_args, native_hf_config, read_workspace
from onboard.rungs import full_model
from onboard.rungs import gate_recipe
from onboard.ladder.contract import RungContext
from onboard.sizing.twin.setup import apply_twin
from onboard.workspace.layout import Workspace
from onboard.workspace.scaffold import plan_workspace, write_workspace
from test_parity_support import add_adapter_methods
from titan_core.models.common.mapping_errors import AdapterError
from titan_core.models.common.tied import aliases, same_tensor
from titan_core.models.registry import FAMILY_NAMES, get_family
from titan_core.training.hf_export import export_hf

pytestmark = pytest.mark.hf

BASE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=256,
    max_position_embeddings=128,
)
EMBEDDING_NUMEL = 256 * 64
"""The parameters a tied head does not add."""
# each native family's own model_type, with the features of its smallest config
FAMILY_CONFIGS = {
    "llama3": {"model_type": "llama"},
    "qwen3": {"model_type": "qwen3", "head_dim": 16},
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    },
    "glimmer": {
        "model_type": "glimmer",
        "head_dim": 16,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    # no family claims gemma2: the port path (from glimmer) or the transformers path runs it
    "gemma2": {"model_type": "gemma2", "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 64},
}
# glimmer has no transformers class, so it has no transformers path
CASES = (
    [("native", f) for f in FAMILY_NAMES]
    + [("port", f) for f in (*FAMILY_NAMES, "gemma2")]
    + [("transformers", f) for f in ("llama3", "qwen3", "qwen3_moe", "gemma2")]
)
# the native model is the upstream architecture (a gemma2 port from glimmer still lacks its sandwich norms)
UPSTREAM_LOADS = {case for case in CASES if case[1] != "glimmer" and case != ("port", "gemma2")}


def config(family: str, tied: bool | None) -> dict:
    """config.json of `family`'s tiny model; `tied` None leaves tie_word_embeddings out."""
    cfg = {**BASE, **FAMILY_CONFIGS[family]}
    return cfg if tied is None else {**cfg, "tie_word_embeddings": tied}


def workspace(tmp_path, name: str, cfg: dict, path: str, *, twin: bool = False) -> Workspace:
    """`onboard new-model NAME --hf-config config.json --path PATH` under tmp_path."""
    cfg_path = tmp_path / f"{name}.json"
    cfg_path.write_text(json.dumps(cfg))
    plan = plan_workspace(name, tmp_path, hf_config=cfg_path, path=path, device="cpu")
    if twin:
        apply_twin(plan, mode="on")
    write_workspace(plan)
    return Workspace.load(tmp_path, name)


def probe(ws: Workspace):
    """(measurements, full_model details, {criterion: ok} of the eager checklist) of the probe."""
    ctx = RungContext(workspace=ws, attempt_dir=ws.root / "attempt", evidence={}, log=lambda _: None)
    cfg = gate_recipe.job_config(ctx)
    part, details = full_model.probe(ctx, cfg)  # the full_model_* part of the eager record
    m = {**part, "tie_embeddings": gate_recipe.model_args(cfg).tie_embeddings}
    return m, details["full_model"], {c["name"]: c["ok"] for c in evaluate(load_checklist("eager"), m, {}, {})}


def test_every_native_family_is_covered():
    assert set(FAMILY_NAMES) <= set(FAMILY_CONFIGS)


@pytest.mark.parametrize(("path", "family"), CASES)
def test_eager_probe_passes_tied_and_untied(tmp_path, path, family):
    totals = {}
    for tied in (True, False):
        m, details, ok = probe(workspace(tmp_path, f"m{int(tied)}", config(family, tied), path))
        assert m["tie_embeddings"] is tied
        assert details["key_mismatches"] == [] and m["full_model_key_mismatches"] == 0
        assert ok["full_model_built_on_meta"] and ok["full_model_keys_match_upstream"]
        assert m["full_model_keys_reference"].startswith("the adapter's round trip (no twin")
        totals[tied] = m["full_model_params_total"]
    assert totals[False] - totals[True] == EMBEDDING_NUMEL  # the tied head is the embedding, counted once


def _loaded(model, back: dict) -> None:
    """Load `back`: every name has a place, and only an alias (HF's tied head) may be left to the tie."""
    missing, unexpected = model.load_state_dict(back, strict=False)
    assert unexpected == [] and set(missing) <= set(aliases(dict(model.named_parameters(remove_duplicate=False))))


@pytest.mark.parametrize(("path", "family"), CASES)
def test_tied_model_holds_one_tensor_and_its_export_round_trips(tmp_path, path, family):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ws = workspace(tmp_path, "t", config(family, True), path)
    wm = read_workspace(ws.root)
    adapter = load_adapter(ws.root)
    args = native_args(wm, adapter, native_hf_config(wm))
    model = build_native(wm, args, seed=0)
    emb = "model.embed_tokens.weight" if path == "transformers" else "tok_embeddings.weight"
    assert model.output_weight is dict(model.named_parameters())[emb]  # one tensor, two uses
    hf = adapter.to_hf(model.state_dict())
    assert same_tensor(hf["lm_head.weight"], hf["model.embed_tokens.weight"])  # HF's in-memory form

    out = export_hf(model, wm.family, args, tmp_path / "export", model_cfg=wm.model_config)
    stored = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in stored and json.loads((out / "config.json").read_text())["tie_word_embeddings"]
    with_head = {**stored, "lm_head.weight": stored["model.embed_tokens.weight"].clone()}  # some exporters keep it
    for checkpoint in (stored, with_head):
        fresh = build_native(wm, args, seed=1)
        _loaded(fresh, adapter.from_hf(checkpoint, tie_embeddings=True))
        assert fresh.output_weight is dict(fresh.named_parameters())[emb]  # loading kept the tie
        for k, v in model.state_dict().items():
            assert torch.equal(fresh.state_dict()[k], v), k
    if (path, family) in UPSTREAM_LOADS:  # transformers reads the export as the tied model it is
        upstream, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
        assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
        assert upstream.lm_head.weight is upstream.model.embed_tokens.weight
        assert torch.equal(upstream.lm_head.weight, model.output_weight)


@pytest.mark.parametrize(("path", "family"), [("native", "qwen3"), ("transformers", "llama3")])
def test_tied_model_passes_parity(tmp_path, path, family):
    res = check_workspace(workspace(tmp_path, "p", config(family, True), path).root)
    assert res["error"] is None and res["measurements"]["state_dict_same_keys"] is True
    m = {**res["measurements"], "pytest_passed": True}  # the test file's own verdict is this result
    assert [c["name"] for c in evaluate(load_checklist("parity"), m, {}, {}) if not c["ok"]] == []


def test_gemma2_without_the_key_is_tied_as_its_config_class_says(tmp_path):
    m, details, ok = probe(workspace(tmp_path, "g", config("gemma2", None), "port"))
    assert m["tie_embeddings"] is True and details["key_mismatches"] == [] and ok["full_model_keys_match_upstream"]
    llama = get_family("llama3").adapter.args_from_hf(config("llama3", None))[0]
    assert llama.tie_embeddings is False  # a family's own model_type: untied, as LlamaConfig defaults


def test_an_adapter_that_keeps_a_tied_head_is_named(tmp_path):
    ws = workspace(tmp_path, "keeps", config("llama3", True), "native")
    add_adapter_methods(ws.root, "def from_hf(self, sd, **kw):\n    return super().from_hf(sd, tie_embeddings=False)\n")
    m, details, ok = probe(ws)
    # a checkpoint stored once has no head to keep; HF's in-memory dict has
    assert details["key_mismatches"] == ["output.weight: only in the round trip of HF's in-memory dict"]
    assert not ok["full_model_keys_match_upstream"]


def test_a_native_model_untied_where_upstream_ties_is_named(tmp_path):
    ws = workspace(tmp_path, "unties", config("llama3", True), "native", twin=True)
    add_adapter_methods(
        ws.root,
        """
def args_from_hf(self, cfg):
    import dataclasses
    args, used = super().args_from_hf(cfg)
    return dataclasses.replace(args, tie_embeddings=False), used
""",
    )
    m, details, ok = probe(ws)
    assert m["full_model_keys_reference"] == "the upstream LlamaForCausalLM built on meta"
    assert details["key_mismatches"] == [
        "lm_head.weight: a tensor of its own in the native model (through the adapter), "
        "tied to model.embed_tokens.weight in upstream"
    ]
    assert not ok["full_model_keys_match_upstream"]


def test_a_stored_head_must_be_the_embedding():
    adapter = get_family("llama3").adapter
    emb = torch.randn(8, 4)
    with pytest.raises(AdapterError, match="another shape"):
        adapter.from_hf({"model.embed_tokens.weight": emb, "lm_head.weight": torch.zeros(4, 8)}, tie_embeddings=True)
    back = adapter.from_hf({"model.embed_tokens.weight": emb, "lm_head.weight": emb.clone()}, tie_embeddings=True)
    assert list(back) == ["tok_embeddings.weight"]


def _cli(*argv) -> int:
    return CliRunner().invoke(app, [str(a) for a in argv]).exit_code


def _fast(root) -> None:
    """The recipe on one thread, 2 x 64 tokens a step: the same gate on a shared 2-core CPU."""
    recipe = root / "recipe.toml"
    text = recipe.read_text()
    for old, new in (
        ("batch_size = 4", "batch_size = 2"),
        ("seq_len = 128", "seq_len = 64"),
        ('type = "cpu"', 'type = "cpu"\nthreads = 1'),
    ):
        assert old in text, old
        text = text.replace(old, new)
    recipe.write_text(text)


@pytest.mark.parametrize(("family", "path"), [("llama3", "native"), ("gemma2", "port")])
def test_cli_new_model_then_next_step_passes_eager(tmp_path, family, path):
    (tmp_path / "config.json").write_text(json.dumps(config(family, True if family == "llama3" else None)))
    assert (
        _cli(
            "new-model",
            "tied",
            "--hf-config",
            tmp_path / "config.json",
            "--path",
            path,
            "--device",
            "cpu",
            "--dir",
            tmp_path,
        )
        == 0
    )
    _fast(tmp_path / "onboarding" / "tied")
    assert _cli("next-step", "tied", "--dir", tmp_path) == 0
    ladder = json.loads((tmp_path / "onboarding" / "tied" / "ladder.json").read_text())
    assert [(a["rung"], a["status"]) for a in ladder["attempts"]] == [("eager", "passed")]
