"""Every upstream parameter and persistent buffer the family adapter has no name for is listed by
new-model --path port: built on meta from transformers' own config classes (tiny: seconds), each
with its module class, its layer-folded name, the config keys that drive it, and the concrete
change for the patterns known (sinks, router and expert biases, interleaved gate/up, shared
experts, DeepSeek-V3's score-correction buffer, NoPE layers, the clamped SwiGLU)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch
from torch import nn

from onboard.upstream.tensors import fold, state_tensors
from onboard.workspace.arch_diff import architecture_differences
from onboard.workspace.arch_semantics import key_change
from onboard.workspace.arch_tensors import tensor_differences
from onboard.workspace.scaffold import plan_workspace
from titan_core.models import resolve_args

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=256, bos_token_id=1, eos_token_id=2, pad_token_id=None)  # fmt: skip
MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
           first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5)  # fmt: skip


def config(cls_name: str, **kw) -> dict:
    """config.json of a tiny model, as transformers' own config class writes it."""
    import transformers

    return getattr(transformers, cls_name)(**{**TINY, **kw}).to_dict()


def port_plan(tmp_path: Path, cfg: dict, name: str = "p"):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return plan_workspace(name, tmp_path, hf_config=path, path="port", device="cpu")


def listed(tensors) -> dict[str, tuple]:
    """{layer-folded name: (status, layers, module class, buffer, pattern)} of the tensors a diff lists."""
    as_dicts = [t if isinstance(t, dict) else t.__dict__ for t in tensors]
    return {t["name"]: (t["status"], tuple(t["layers"]), t["owner_class"], t["buffer"], t["pattern"]) for t in as_dicts}


def todo_lines(text: str) -> list[str]:
    """The TODO(port) comments of a rendered file, each joined back into one line."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("# TODO(port): "):
            out.append(line[len("# TODO(port): ") :])
        elif line.startswith("#   ") and out:
            out[-1] += " " + line[4:]
    return out


def one(lines: list[str], *needles: str) -> str:
    [line] = [line for line in lines if all(n in line for n in needles)]
    return line


# ---- GPT-OSS: sinks, router bias, expert biases, interleaved gate/up ----------------------------
@pytest.mark.hf
def test_gpt_oss_on_the_family_new_model_picks(tmp_path):
    plan = port_plan(tmp_path, config("GptOssConfig", num_local_experts=4, num_experts_per_tok=2, head_dim=16))
    assert plan.family == "llama3"  # no family reads yarn RoPE: the first one, by its key table
    every = (0, 1)
    assert listed(plan.upstream_tensors) == {
        "model.layers.{i}.self_attn.sinks": ("unmapped", every, "GptOssAttention", False, "sinks"),
        "model.layers.{i}.mlp.router.weight": ("unmapped", every, "GptOssTopKRouter", False, "router"),
        "model.layers.{i}.mlp.router.bias": ("unmapped", every, "GptOssTopKRouter", False, "router_bias"),
        "model.layers.{i}.mlp.experts.gate_up_proj": ("unmapped", every, "GptOssExperts", False, "gate_up_interleaved"),
        "model.layers.{i}.mlp.experts.gate_up_proj_bias": ("unmapped", every, "GptOssExperts", False, "expert_bias"),
        "model.layers.{i}.mlp.experts.down_proj": ("unmapped", every, "GptOssExperts", False, "experts"),
        "model.layers.{i}.mlp.experts.down_proj_bias": ("unmapped", every, "GptOssExperts", False, "expert_bias"),
    }  # fmt: skip
    # q/k/v/o biases are in llama3's key table: mapped (the bias lines say args.qkv_bias / out_bias)
    assert not any("q_proj.bias" in t["name"] for t in plan.upstream_tensors)
    model, adapter = todo_lines(plan.files["model.py"]), todo_lines(plan.files["adapter.py"])
    sinks = one(model, "architecture: upstream tensor", "self_attn.sinks")
    assert "`model.layers.{i}.self_attn.sinks` [4] (GptOssAttention, every layer); config keys: none found" in sinks
    assert "call the core with `sinks=self.sinks`" in sinks and "NaiveAttention" in sinks
    assert "map `attention.sinks` <-> `self_attn.sinks` in adapter.py's layer_keys" in sinks
    gate_up = one(model, "architecture: upstream tensor", "experts.gate_up_proj` [4, 64, 256]")
    assert "config keys: num_local_experts = 4, swiglu_limit = 7.0, swiglu_alpha = 1.702" in gate_up
    assert "gate = gate_up[..., ::2], up = gate_up[..., 1::2]" in gate_up
    router_bias = one(model, "mlp.router.bias")
    assert "build the port's router gate with bias=True" in router_bias
    biases = one(model, "gate_up_proj_bias")
    assert "`model.layers.{i}.mlp.experts.down_proj_bias` [4, 64]" in biases  # one line for the module's biases
    assert "gate bias = b[..., ::2], up bias = b[..., 1::2]" in biases
    # the same lines are adapter.py's TODOs: it is the file that must name them
    assert sinks.removeprefix("architecture: ") in adapter and biases.removeprefix("architecture: ") in adapter
    limit = one(model, "`swiglu_limit` = 7.0")
    assert "clamped SwiGLU: upstream clamps the gate to at most 7.0 and up to [-7.0, 7.0]" in limit
    assert "(up + 1) * glu" in limit
    # ladder.json records them as data; README lists them among the architecture differences
    ledger = plan.meta()["upstream_tensors"]
    assert {t["name"] for t in ledger} == set(listed(plan.upstream_tensors))
    assert "self_attn.sinks` [4] (GptOssAttention" in plan.files["README.md"]


@pytest.mark.hf
def test_gpt_oss_on_qwen3_moe_names_the_layouts_the_adapter_gets_wrong():
    cfg = config("GptOssConfig", num_local_experts=4, num_experts_per_tok=2, head_dim=16)
    diff = architecture_differences(cfg, "qwen3_moe")
    every = (0, 1)
    assert listed(diff.tensors) == {
        "model.layers.{i}.self_attn.sinks": ("unmapped", every, "GptOssAttention", False, "sinks"),
        "model.layers.{i}.mlp.router.weight": ("unmapped", every, "GptOssTopKRouter", False, "router"),
        "model.layers.{i}.mlp.router.bias": ("unmapped", every, "GptOssTopKRouter", False, "router_bias"),
        "model.layers.{i}.mlp.experts.gate_up_proj": ("layout", every, "GptOssExperts", False, "gate_up_interleaved"),
        "model.layers.{i}.mlp.experts.gate_up_proj_bias": ("unmapped", every, "GptOssExperts", False, "expert_bias"),
        "model.layers.{i}.mlp.experts.down_proj": ("layout", every, "GptOssExperts", False, "experts"),
        "model.layers.{i}.mlp.experts.down_proj_bias": ("unmapped", every, "GptOssExperts", False, "expert_bias"),
    }  # fmt: skip
    gate_up = one(diff.differences, "names in another layout", "experts.gate_up_proj`")
    assert "the hidden width (64) on axis 1" in gate_up and "upstream interleaves gate and up" in gate_up
    down = one(diff.differences, "names in another layout", "experts.down_proj`")
    assert "upstream stores [4, 128, 64], the hidden width (64) on axis 2" in down
    refusal = one(diff.differences, "the qwen3_moe adapter refuses")
    assert "(every layer): layer {i}: gate_up_proj (4, 64, 256) and down_proj (4, 128, 64) disagree" in refusal
    assert set(diff.adapter_lines) <= set(diff.differences) and refusal in diff.adapter_lines


# ---- DeepSeek-V3 style: shared experts, the persistent score-correction buffer, dense first layers ----
@pytest.mark.hf
def test_deepseek_v3_shared_expert_and_score_correction_buffer():
    cfg = config("DeepseekV3Config", **MOE, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                 qk_nope_head_dim=8, v_head_dim=16)  # fmt: skip
    diff = architecture_differences(cfg, "qwen3_moe")
    every, moe = (0, 1), (1,)
    attn, mlp = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
    assert listed(diff.tensors) == {
        f"{attn}kv_a_proj_with_mqa.weight": ("unmapped", every, "DeepseekV3Attention", False, "mla"),
        f"{attn}kv_a_layernorm.weight": ("unmapped", every, "DeepseekV3RMSNorm", False, "mla"),
        f"{attn}kv_b_proj.weight": ("unmapped", every, "DeepseekV3Attention", False, "mla"),
        f"{mlp}shared_experts.gate_proj.weight": ("unmapped", moe, "DeepseekV3MLP", False, "shared_expert"),
        f"{mlp}shared_experts.up_proj.weight": ("unmapped", moe, "DeepseekV3MLP", False, "shared_expert"),
        f"{mlp}shared_experts.down_proj.weight": ("unmapped", moe, "DeepseekV3MLP", False, "shared_expert"),
        f"{mlp}gate.e_score_correction_bias": ("unmapped", moe, "DeepseekV3TopkRouter", True, "score_correction"),
    }
    [bias] = [t for t in diff.tensors if t.pattern == "score_correction"]
    assert bias.config_keys == ("n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "n_routed_experts")
    line = one(diff.differences, "e_score_correction_bias` [4] (persistent buffer)")
    assert "(DeepseekV3TopkRouter, layer 1)" in line
    assert "scores = sigmoid(router logits)" in line and "chosen by scores + this bias" in line
    assert "weighted by the uncorrected scores" in line and "register_buffer(..., persistent=True)" in line
    shared = one(diff.differences, "shared_experts.gate_proj.weight")
    assert "config keys: n_shared_experts = 1, moe_intermediate_size = 16" in shared
    assert "added to the routed experts' output" in shared and "`moe.shared_expert.w1` / `w3` / `w2`" in shared
    # the dense first layer is no unmapped tensor (the key table names a dense MLP): the structure says it
    assert any(d.startswith("MLP kind: DeepseekV3DecoderLayer is dense here") and d.endswith("(layers 0)")
               for d in diff.differences)  # fmt: skip


@pytest.mark.hf
def test_deepseek_v3_key_todos_name_the_change(tmp_path):
    cfg = config("DeepseekV3Config", **MOE, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                 qk_nope_head_dim=8, v_head_dim=16)  # fmt: skip
    todos = todo_lines(port_plan(tmp_path, cfg).files["model.py"])
    assert "TransformerArgs.dense_layers = list(range(1))" in one(todos, "`first_k_dense_replace` = 1")
    assert "args.shared_expert_hidden_dim = 16" in one(todos, "`n_shared_experts` = 1")
    groups = one(todos, "`n_group` = 2")
    assert "experts fall in 2 groups and each token keeps the 1 groups" in groups
    assert "multiplied by 2.5 after the top-k" in one(todos, "`routed_scaling_factor` = 2.5")
    assert "TransformerArgs.norm_topk_prob = True" in one(todos, "`norm_topk_prob` = true")


@pytest.mark.hf
def test_glm4_moe_fused_experts_in_the_adapter_layout_are_not_listed():
    """Glm4Moe keeps its experts as qwen3_moe's adapter writes them ([E, 2I, dim]) and its router
    as `mlp.gate.weight`: only the shared expert and the correction buffer are unmapped."""
    cfg = config("Glm4MoeConfig", **MOE, head_dim=16)
    diff = architecture_differences(cfg, "qwen3_moe")
    moe = (1,)
    assert listed(diff.tensors) == {
        "model.layers.{i}.mlp.shared_experts.gate_proj.weight": ("unmapped", moe, "Glm4MoeMLP", False, "shared_expert"),
        "model.layers.{i}.mlp.shared_experts.up_proj.weight": ("unmapped", moe, "Glm4MoeMLP", False, "shared_expert"),
        "model.layers.{i}.mlp.shared_experts.down_proj.weight": ("unmapped", moe, "Glm4MoeMLP", False, "shared_expert"),
        "model.layers.{i}.mlp.gate.e_score_correction_bias": ("unmapped", moe, "Glm4MoeTopkRouter", True,
                                                              "score_correction"),
    }  # fmt: skip
    assert not any("refuses" in d for d in diff.differences)  # its layer_from_hf takes the experts as they are


@pytest.mark.hf
def test_dots1_on_the_family_new_model_picks(tmp_path):
    plan = port_plan(tmp_path, config("Dots1Config", **MOE, head_dim=16))
    assert plan.family == "qwen3"
    moe = (1,)
    assert listed(plan.upstream_tensors) == {
        "model.layers.{i}.mlp.experts.gate_up_proj": ("unmapped", moe, "Dots1Experts", False, "experts"),
        "model.layers.{i}.mlp.experts.down_proj": ("unmapped", moe, "Dots1Experts", False, "experts"),
        "model.layers.{i}.mlp.gate.weight": ("unmapped", moe, "Dots1TopkRouter", False, "router"),
        "model.layers.{i}.mlp.shared_experts.gate_proj.weight": ("unmapped", moe, "Dots1MLP", False, "shared_expert"),
        "model.layers.{i}.mlp.shared_experts.up_proj.weight": ("unmapped", moe, "Dots1MLP", False, "shared_expert"),
        "model.layers.{i}.mlp.shared_experts.down_proj.weight": ("unmapped", moe, "Dots1MLP", False, "shared_expert"),
        "model.layers.{i}.mlp.gate.e_score_correction_bias": ("unmapped", moe, "Dots1TopkRouter", True,
                                                              "score_correction"),
    }  # fmt: skip


# ---- NoPE layers: a config key, no tensor --------------------------------------------------------
@pytest.mark.hf
def test_smollm3_no_rope_layers_name_rope_skip_every(tmp_path):
    plan = port_plan(tmp_path, config("SmolLM3Config", num_hidden_layers=4))
    assert plan.upstream_tensors == []  # NoPE holds no weight: nothing for the adapter to name
    todos = todo_lines(plan.files["model.py"])
    nope = one(todos, "`no_rope_layers` = [1, 1, 1, 0]")
    assert "layers [3] skip RoPE (NoPE), one in every 4: set TransformerArgs.rope_skip_every = 4" in nope
    assert "use_rope=args.layer_uses_rope(i)" in nope
    assert "no_rope_layers decides" in one(todos, "`no_rope_layer_interval` = 4")
    irregular = port_plan(tmp_path, config("SmolLM3Config", num_hidden_layers=4, no_rope_layers=[1, 0, 1, 1]), "q")
    line = one(todo_lines(irregular.files["model.py"]), "`no_rope_layers` = [1, 0, 1, 1]")
    assert "layers [1] skip RoPE (NoPE) at no fixed interval" in line
    assert "Attention(use_rope=bool(args.extra['no_rope_layers'][i]))" in line


def test_no_rope_interval_alone_is_rope_skip_every():
    """Llama-4 / SmolLM3 without a list: transformers makes layers i with (i + 1) % k == 0 NoPE,
    which is rope_skip_every = k exactly."""
    line = key_change({"num_hidden_layers": 8, "no_rope_layer_interval": 4}, "no_rope_layer_interval")
    assert line.startswith("a NoPE layer every 4: layers [3, 7] skip RoPE") and "rope_skip_every = 4" in line
    assert "nothing to change" in key_change({"num_hidden_layers": 2, "no_rope_layers": [1, 1]}, "no_rope_layers")
    assert key_change({"some_key": 1}, "some_key") is None  # no known pattern: the generic hint applies


# ---- nothing to say ---------------------------------------------------------------------------
@pytest.mark.hf
@pytest.mark.parametrize(
    "cls_name, extra, family",
    [("LlamaConfig", {}, "llama3"), ("Qwen3Config", dict(head_dim=16), "qwen3"),
     ("Qwen3MoeConfig", dict(num_experts=4, moe_intermediate_size=32), "qwen3_moe")],
)  # fmt: skip
def test_the_familys_own_upstream_lists_no_tensor(cls_name, extra, family):
    diff = architecture_differences(config(cls_name, **extra), family)
    assert diff.tensors == [] and diff.adapter_lines == []
    assert not any("upstream tensor" in d or "refuses" in d for d in diff.differences)


# ---- the walk itself ------------------------------------------------------------------------------
def test_state_tensors_keep_persistent_buffers_and_name_the_computing_module():
    class Router(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 2)  # torch's own class: reported as its parent's
            self.register_buffer("correction", torch.zeros(2))
            self.register_buffer("cache", torch.zeros(2), persistent=False)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Router(), Router()])
            self.emb = nn.Embedding(3, 4)
            self.head = nn.Linear(4, 3, bias=False)
            self.head.weight = self.emb.weight  # tied: listed once

    with torch.device("meta"):
        net = Net()
    got = {(t.key, t.buffer, t.owner, t.owner_class) for t in state_tensors(net)}
    assert got == {
        ("layers.0.proj.weight", False, "layers.0", "Router"), ("layers.0.proj.bias", False, "layers.0", "Router"),
        ("layers.1.proj.weight", False, "layers.1", "Router"), ("layers.1.proj.bias", False, "layers.1", "Router"),
        ("layers.0.correction", True, "layers.0", "Router"), ("layers.1.correction", True, "layers.1", "Router"),
        ("emb.weight", False, "", "Net"),
    }  # fmt: skip
    assert fold("model.layers.3.mlp.experts.7.w1.weight") == ("model.layers.{i}.mlp.experts.{j}.w1.weight", 3,
                                                              "mlp.experts.7.w1.weight")  # fmt: skip
    assert fold("model.norm.weight") == ("model.norm.weight", None, "model.norm.weight")


@pytest.mark.hf
def test_config_strings_in_the_lines_are_made_visible():
    """A config key is someone else's text: one that shares a word with a tensor is listed, escaped."""
    cfg = {**config("GptOssConfig", num_local_experts=4, num_experts_per_tok=2, head_dim=16), "sinks\x1b[2J": 1}
    line = one(architecture_differences(cfg, "llama3").differences, "self_attn.sinks`")
    assert "config keys: sinks\\x1b[2J = 1" in line and "\x1b" not in line


@pytest.mark.parametrize("family, listed_too", [("qwen3_moe", False), ("llama3", True)])
def test_per_expert_modules_are_mapped_when_the_adapter_reads_them_together(family, listed_too):
    """Experts kept one module each (`mlp.experts.<e>.gate_proj.weight`, as published checkpoints
    store them): qwen3_moe's layer_from_hf stacks them, so they have a name; llama3's has none."""
    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(8, 4, bias=False), nn.Linear(8, 4, bias=False)
            self.down_proj = nn.Linear(4, 8, bias=False)

    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(8, 2, bias=False)
            self.experts = nn.ModuleList([Expert(), Expert()])

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = Moe()

    class Upstream(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(hidden_size=8)
            self.model = nn.Module()
            self.model.layers = nn.ModuleList([Layer()])

    with torch.device("meta"):
        up = Upstream()
    tensors, refusals = tensor_differences(up, {}, family, resolve_args(family, "debugmodel"))
    names = {t.name for t in tensors}
    experts = {f"model.layers.{{i}}.mlp.experts.{{j}}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
    assert names == (experts | {"model.layers.{i}.mlp.gate.weight"} if listed_too else set())
    assert all(t.layers == (0,) for t in tensors)  # two experts, one layer: listed once
    assert refusals == {}


@pytest.mark.hf
def test_new_model_json_carries_the_upstream_tensors(tmp_path):
    from typer.testing import CliRunner

    from onboard.cli.app import app

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config("GptOssConfig", num_local_experts=4, num_experts_per_tok=2, head_dim=16)))
    out = CliRunner().invoke(app, ["new-model", "oss", "--hf-config", str(path), "--path", "port",
                                   "--dir", str(tmp_path / "onboarding"), "--json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert "model.layers.{i}.self_attn.sinks" in {t["name"] for t in doc["upstream_tensors"]}
