"""The parity rung proves a recipe's [lora] (onboard/parity/lora_parity.py): on a workspace scaffolded by
`onboard new-model` from a tiny Llama checkpoint, with [lora] appended to its recipe, parity measures the
adapters at B = 0 against the base (exactly 0), against peft on transformers' class with the same adapter
weights (the logits' bound), the gradients (adapters alone), and merged against unmerged; each of the four
fails when one thing is broken; a recipe without [lora] records "none" and the four are not applicable,
in the workspace test's check and in the gate alike; a [lora] the model cannot take is bad input."""

from __future__ import annotations

import shutil

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch
from typer.testing import CliRunner

from hf_tiny import write_tiny_llama
from onboard.ladder import gates
from onboard.ladder.measurements.parity_measurements import ParityMeasurements
from onboard.parity import lora_parity
from onboard.parity.check import check_workspace
from onboard.parity.criteria import asserted_criteria, checklist_path, threshold
from onboard.parity.native import (
    build_native, load_adapter, load_converted, native_args, native_hf_config, read_workspace,
)  # fmt: skip
from onboard.upstream.hf_model import build_upstream

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.hf

LORA = '\n[lora]\nenable = true\nrank = 4\ntarget_modules = ["q_proj", "v_proj", "down_proj"]\n'
LORA_CRITERIA = {"lora_zero_b", "lora_peft", "lora_grads_only_adapters", "lora_merge"}
BATCH = 1
"""One sequence of parity's 512 tokens: the seq_len criterion holds, the tiny model takes seconds."""


def scaffold(root, name: str, *flags: str, tied: bool = False):
    """`onboard new-model` of a tiny Llama checkpoint (its config.json) into `root`: the workspace folder."""
    from onboard.cli.app import app

    ckpt = write_tiny_llama(root / f"{name}_ckpt", tied=tied)
    made = CliRunner().invoke(app, ["new-model", name, "--hf-config", str(ckpt / "config.json"), *flags,
                                    "--dir", str(root), "--device", "cpu"])  # fmt: skip
    assert made.exit_code == 0, made.output
    return root / "onboarding" / name


def with_lora(ws, lora: str = LORA):
    (ws / "recipe.toml").write_text((ws / "recipe.toml").read_text() + lora)
    return ws


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory):
    """(without [lora], with it): one scaffold of the tiny checkpoint, and a copy whose recipe has [lora]."""
    plain = scaffold(tmp_path_factory.mktemp("lora_parity"), "tiny")
    adapted = plain.with_name("tiny_lora")
    shutil.copytree(plain, adapted)
    return plain, with_lora(adapted)


def _failed(res) -> set[str]:
    return {c.name for c in asserted_criteria() if not c.check(res["measurements"])[0]}


def _gate(res) -> dict[str, dict]:
    """The rung's gate on what the test wrote (as the rung hands it over, pytest passed)."""
    m = ParityMeasurements.of(res["measurements"], pytest_passed=True, pytest_exit_code=0)
    return {c["name"]: c for c in gates.evaluate(gates.load_checklist("parity", checklist_path()), m)}


def test_a_recipe_with_lora_passes_parity_with_the_four_measured(workspaces):
    res = check_workspace(workspaces[1], batch=BATCH)
    m = res["measurements"]
    assert res["error"] is None and not _failed(res), (res["error"], _failed(res))
    assert m["lora"] == "rank 4 on 6 modules (q_proj, v_proj, down_proj)"
    assert m["lora_zero_b_max_abs"] == 0.0 and m["lora_grads_only_adapters"] is True
    assert m["lora_peft_rel_l2"] <= threshold("lora_peft_rel_l2")
    assert m["lora_merge_rel_l2"] <= threshold("lora_merge_rel_l2")
    assert m["lora_merge"] == "merged_copy against the unmerged model"
    record = res["lora"]
    assert record["adapter_parameters"] == 12 and record["peft_keys_unmatched"] == [] and record["problems"] == []
    assert record["adapters_change_logits_rel_l2"] > 1e-2  # the comparisons can fail by that much
    gate = _gate(res)
    assert all(c["ok"] for c in gate.values()) and not any(gate[n]["not_applicable"] for n in LORA_CRITERIA)


def test_a_recipe_without_lora_records_none_and_the_criteria_do_not_apply(workspaces):
    res = check_workspace(workspaces[0], batch=BATCH)
    m = res["measurements"]
    assert res["error"] is None and not _failed(res), _failed(res)
    assert m["lora"] == m["lora_merge"] == lora_parity.NO_LORA
    assert not any(k in m for k in ("lora_zero_b_max_abs", "lora_peft_rel_l2", "lora_merge_rel_l2"))
    lora = [c for c in asserted_criteria() if c.name in LORA_CRITERIA]
    assert len(lora) == 4 and all(c.check(m) == (True, None) for c in lora)  # the test's check ...
    gate = _gate(res)
    for name in LORA_CRITERIA:  # ... and the gate's agree: not applicable, no passing number
        assert gate[name]["ok"] and gate[name]["value"] is None and "no [lora]" in gate[name]["not_applicable"]


@pytest.mark.parametrize("path", ["port", "transformers"])
def test_the_port_and_transformers_paths_prove_their_lora_too(tmp_path, path):
    """The native model parity builds is the workspace's own: model.py's on a port, transformers' class
    run by titan_core on the transformers path; the adapters go where its adapter names them."""
    res = check_workspace(with_lora(scaffold(tmp_path, f"tiny_{path}", "--path", path)), batch=BATCH)
    assert res["error"] is None and not _failed(res), (res["error"], _failed(res))
    assert res["measurements"]["lora"].startswith("rank 4 on 6 modules") and res["lora"]["problems"] == []


def test_an_adapter_on_a_tied_embedding_proves_all_but_the_merge_which_does_not_apply(tmp_path):
    """An adapter on the embedding the head shares trains (on the input alone, as peft's on transformers'
    class) but cannot be merged: lora_merge says why and its criterion is not applicable."""
    ws = with_lora(scaffold(tmp_path, "tied", tied=True), LORA.replace('"down_proj"', '"embed_tokens"'))
    res = check_workspace(ws, batch=BATCH)
    m = res["measurements"]
    assert res["error"] is None and not _failed(res), (res["error"], _failed(res))
    assert m["lora_merge"].startswith("none: lora: cannot merge the adapter on model.embed_tokens")
    assert "lora_merge_rel_l2" not in m and m["lora_zero_b_max_abs"] == 0.0
    assert _gate(res)["lora_merge"]["not_applicable"].startswith("the recipe has no [lora] enabled, or its adapters")


def test_the_check_and_the_gate_agree_on_a_lora_metric_left_out():
    """With [lora] recorded, a lora metric missing fails both (nothing passes by being unmeasured)."""
    m = {"lora": "rank 4 on 6 modules", "lora_merge": "merged_copy against the unmerged model"}
    for c in asserted_criteria():
        if c.name in LORA_CRITERIA:
            assert c.check(m) == (False, None)
            assert not gates.evaluate(gates.Checklist("parity", "", (c,)), m)[0]["ok"]


def test_a_lora_the_model_cannot_take_is_bad_input(workspaces, tmp_path):
    ws = tmp_path / "bad"
    shutil.copytree(workspaces[0], ws)
    (ws / "recipe.toml").write_text((ws / "recipe.toml").read_text() + LORA.replace('"down_proj"', '"nope_proj"'))
    res = check_workspace(ws, batch=BATCH)
    assert res["error"]["kind"] == "bad_input"
    assert "'nope_proj' matches no module of this model" in res["error"]["message"]
    assert "logits_rel_l2" not in res["measurements"]  # refused before the passes


# ---- each metric can fail: lora_parity.measure on the tiny model, one thing broken ----------------
@pytest.fixture(scope="module")
def models(workspaces):
    """(the recipe's [lora], native, upstream, adapter, tokens, labels): both models with the same weights."""
    ws = read_workspace(workspaces[1])
    cfg = native_hf_config(ws)
    upstream = build_upstream(cfg, seed=0)
    adapter = load_adapter(ws.root)
    native = build_native(ws, native_args(ws, adapter, cfg), seed=1)
    load_converted(native, adapter.from_hf(upstream.checkpoint))
    gen = torch.Generator().manual_seed(5)
    tokens, labels = (torch.randint(0, 512, (1, 64), generator=gen) for _ in range(2))
    return ws.lora, native, upstream.model, adapter, tokens, labels


def _measure(models) -> tuple[dict, dict]:
    return lora_parity.measure(*models, seed=0)


def _apply_then(monkeypatch, change):
    """apply_lora as parity calls it, then `change(model, state)`: one thing broken on the native side."""
    real = lora_parity.apply_lora

    def broken(model, cfg, adapter, *, seed):
        state = real(model, cfg, adapter, seed=seed)
        with torch.no_grad():
            change(model, state)
        return state

    monkeypatch.setattr(lora_parity, "apply_lora", broken)


def _first(model, kind: str) -> torch.nn.Module:
    return next(m for n, m in model.named_modules() if n.endswith(f"layers.0.attention.{kind}"))


def test_the_measure_holds_on_the_models_and_consumes_no_rng(models):
    before = torch.random.get_rng_state()
    m, record = _measure(models)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert not any(p.grad is not None for p in models[1].parameters())  # the native model is untouched
    assert m["lora_zero_b_max_abs"] == 0.0 and m["lora_grads_only_adapters"]
    assert m["lora_peft_rel_l2"] <= threshold("lora_peft_rel_l2") and m["lora_merge_rel_l2"] <= threshold(
        "lora_merge_rel_l2")  # fmt: skip


def test_zero_b_fails_when_an_adapter_starts_non_zero(models, monkeypatch):
    _apply_then(monkeypatch, lambda model, _: _first(model, "wq").lora_B["default"].weight.fill_(1e-3))
    m, record = _measure(models)
    assert m["lora_zero_b_max_abs"] > 0.0 and "with B = 0 the adapters change the logits" in record["problems"][0]


def test_peft_fails_when_the_native_forward_drops_an_adapters_scaling(models, monkeypatch):
    _apply_then(monkeypatch, lambda model, _: _first(model, "wv").scaling.update(default=1.0))  # alpha / r = 4
    m, _ = _measure(models)
    assert m["lora_peft_rel_l2"] > 10 * threshold("lora_peft_rel_l2")
    assert m["lora_zero_b_max_abs"] == 0.0 and m["lora_merge_rel_l2"] <= threshold("lora_merge_rel_l2")


def test_peft_fails_when_the_comparison_sees_a_wrong_adapter_weight(models, monkeypatch):
    real = lora_parity.adapter_tensors

    def wrong(model, state):
        tensors = real(model, state)
        key = next(k for k in sorted(tensors) if "lora_B" in k)
        return {**tensors, key: tensors[key] * 2}

    monkeypatch.setattr(lora_parity, "adapter_tensors", wrong)
    m, _ = _measure(models)
    assert m["lora_peft_rel_l2"] > 10 * threshold("lora_peft_rel_l2")


def test_grads_fail_when_a_base_weight_trains_or_an_adapter_gets_none(models, monkeypatch):
    _apply_then(monkeypatch, lambda model, _: model.norm.weight.requires_grad_(True))
    m, record = _measure(models)
    assert m["lora_grads_only_adapters"] is False and record["grads_outside_adapters"] == ["norm.weight"]
    monkeypatch.undo()
    _apply_then(monkeypatch, lambda model, _: _first(model, "wq").lora_A["default"].weight.requires_grad_(False))
    m, record = _measure(models)
    assert m["lora_grads_only_adapters"] is False
    assert record["adapters_without_grads"] == ["layers.0.attention.wq.lora_A.default.weight"]


def test_merge_fails_when_the_merge_adds_another_delta(models, monkeypatch):
    from peft.tuners.lora.layer import Linear

    real = Linear.get_delta_weight
    monkeypatch.setattr(Linear, "get_delta_weight", lambda self, adapter: 2 * real(self, adapter))
    m, _ = _measure(models)
    assert m["lora_merge_rel_l2"] > 10 * threshold("lora_merge_rel_l2")
    assert m["lora_peft_rel_l2"] <= threshold("lora_peft_rel_l2")  # the unmerged model is untouched
