"""The workspace defines its model once (issue #11, items 1 and 2).

config.json -> the workspace adapter's `args_from_hf` -> model.py (port) or the family
class (native): parity, the eager rung and the HF export all build that one model. Ports
are written here the way a porting agent writes them (tests/onboard/e2e/test_parity_support.py):
a Qwen2-MoE port (q/k/v bias, no QK-norm, a gated shared expert), an OLMo-2 port (post-norms,
QK-norm over all heads) and a Granite port (four multipliers carried in `args.extra`).
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from test_parity_support import BASE, add_adapter_methods, edit_file, new_workspace

from onboard.ladder.table import default_specs
from onboard.ladder.states import ladder_states
from onboard.engine.next_step import next_step
from onboard.parity import native
from onboard.parity.check import check_workspace
from onboard.parity.criteria import asserted_criteria, threshold
from onboard.workspace.layout import Workspace
from titan_core.measure.numerics import max_abs, rel_l2

pytestmark = pytest.mark.hf

NO_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def failed(res: dict) -> set[str]:
    return {c.name for c in asserted_criteria() if not c.check(res["measurements"])[0]}


def fast_recipe(root) -> None:
    """Seconds on a shared 2-core CPU: short sequences, one thread."""
    edit_file(root, "recipe.toml", "seq_len = 128", "seq_len = 32")
    edit_file(root, "recipe.toml", 'type = "cpu"', 'type = "cpu"\nthreads = 1')


def replace_block(root, new_block: str, imports: str = "") -> None:
    """model.py's Block class replaced (an agent rewriting the decoder block), extra imports added."""
    path = root / "model.py"
    text = path.read_text()
    start, end = text.index("class Block(nn.Module):"), text.index("class Model(ModelBase):")
    text = text[:start] + new_block.strip("\n") + "\n\n\n" + text[end:]
    anchor = "from titan_core.models.common.moe import MoE, load_balancing_loss\n"
    path.write_text(text.replace(anchor, anchor + imports, 1))


def parity_side_params(root) -> int:
    """Parameters of the native model the parity check builds (onboard.parity.native)."""
    ws = native.read_workspace(root)
    adapter = native.load_adapter(root)
    model = native.build_native(ws, native.native_args(ws, adapter, native.native_hf_config(ws)), seed=0)
    return sum(p.numel() for p in model.parameters())


# ---- Qwen2-MoE: the eager rung trains the model parity verified -----------------------------
QWEN2_MOE_ADAPTER = '''
SHARED = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}

def extra_args_from_hf(self, cfg, take):
    """Qwen2-MoE: q/k/v bias (qkv_bias), no o bias, no QK-norm, a shared expert beside the routed ones."""
    kw = super().extra_args_from_hf(cfg, take)
    take("layer_types")  # every layer full attention (use_sliding_window is false)
    return {**kw, "qk_norm": False, "qkv_bias": take("qkv_bias", True), "out_bias": False,
            "shared_expert_hidden_dim": take("shared_expert_intermediate_size")}

def layer_group_to_hf(self, i, entries):
    entries, out = dict(entries), {}
    for key in [k for k in entries if k.startswith("moe.shared_expert")]:
        gate = key.startswith("moe.shared_expert_gate")
        hf = "shared_expert_gate" if gate else f"shared_expert.{self.SHARED[key.split('.')[2]]}"
        out[f"model.layers.{i}.mlp.{hf}.weight"] = entries.pop(key)
    return {**out, **super().layer_group_to_hf(i, entries)}

def layer_from_hf(self, i, entries, inverse):
    entries, out = dict(entries), {}
    names = {v: k for k, v in self.SHARED.items()}
    for key in [k for k in entries if k.startswith("mlp.shared_expert")]:
        gate = key.startswith("mlp.shared_expert_gate")
        nat = "shared_expert_gate" if gate else f"shared_expert.{names[key.split('.')[2]]}"
        out[f"layers.{i}.moe.{nat}.weight"] = entries.pop(key)
    return {**out, **super().layer_from_hf(i, entries, inverse)}
'''

QWEN2_MOE_CLASS = '''

class SharedGateMoE(MoE):
    """Qwen2-MoE's experts: the shared expert's output is scaled by sigmoid(shared_expert_gate(x))."""

    def __init__(self, dim, *a, **kw):
        super().__init__(dim, *a, **kw)
        self.shared_expert_gate = nn.Linear(dim, 1, bias=False)

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs, weights, experts = self.router(flat)
        out = self.experts(flat, weights, experts)
        out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.reshape(shape), routing_stats(probs, experts, self.n_experts)
'''


def qwen2_moe_port(tmp_path):
    import transformers as tf

    config = tf.Qwen2MoeConfig(
        **BASE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48
    )
    root = new_workspace(tmp_path, "q2moe", config, path="port")
    add_adapter_methods(root, QWEN2_MOE_ADAPTER)
    edit_file(root, "model.py", "self.moe = MoE(", "self.moe = SharedGateMoE(")
    edit_file(root, "model.py", "\n\nclass Block(nn.Module):", QWEN2_MOE_CLASS + "\n\nclass Block(nn.Module):")
    edit_file(root, "model.py", "import MoE, load_balancing_loss\n", "import MoE, load_balancing_loss, routing_stats\n")
    fast_recipe(root)
    return root, config


def test_eager_trains_exactly_the_model_parity_verified_and_adapter_edits_make_it_stale(tmp_path):
    import transformers as tf

    root, config = qwen2_moe_port(tmp_path)
    res = check_workspace(root)
    assert res["error"] is None and failed(res) == set(), json.dumps(res["measurements"], indent=1)
    hf_params = sum(p.numel() for p in tf.AutoModelForCausalLM.from_config(config).parameters())
    assert parity_side_params(root) == hf_params

    ws = Workspace.load(tmp_path, "q2moe")
    outcome = next_step(ws)
    assert (outcome.rung, outcome.status) == ("eager", "passed"), outcome.to_json()
    entry = Workspace.load(tmp_path, "q2moe").ledger.entries("eager")[-1]
    assert entry["measurements"]["num_params"] == hf_params  # the family's args gave another model
    assert {"recipe.toml", "config.json", "adapter.py", "model.py"} <= set(entry["files_read"])

    def eager_state():
        return next(s for s in ladder_states(Workspace.load(tmp_path, "q2moe"), default_specs()) if s.rung == "eager")

    assert eager_state().status == "passed"
    (root / "adapter.py").write_text((root / "adapter.py").read_text() + "\n# an agent's edit\n")
    state = eager_state()
    assert state.status == "stale" and "adapter.py" in state.reason


# ---- export: through the workspace, loadable as the upstream class -----------------------------
def export_and_compare(tmp_path, root, upstream_class: str) -> None:
    """Train the workspace recipe 2 steps with checkpoint.export_hf; transformers must load the
    export as `upstream_class`, with no missing or unexpected key, and give the native logits."""
    from transformers import AutoModelForCausalLM

    from titan_core.config import load_config
    from titan_core.training.trainer import Trainer

    cfg = load_config(root / "recipe.toml")
    cfg.training.steps, cfg.training.batch_size = 2, 2
    cfg.parallelism.data_parallel = "none"  # the native model stays usable after training
    cfg.metrics.output_dir, cfg.metrics.rich = str(tmp_path / "run"), False
    cfg.checkpoint.export_hf = str(tmp_path / "hf")
    trainer = Trainer(cfg, quiet=True)
    trainer.train()
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    written = json.loads((root / "config.json").read_text())
    assert {k: v for k, v in exported.items() if k != "dtype"} == {k: v for k, v in written.items() if k != "dtype"}
    assert exported["dtype"] == "float32"

    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True, dtype=torch.float32)
    assert type(hf).__name__ == upstream_class
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    tokens = torch.randint(0, exported["vocab_size"], (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = trainer.model.eval()(tokens).float()
        theirs = hf.eval()(tokens).logits.float()
    assert rel_l2(ours, theirs) <= threshold("logits_rel_l2")
    assert max_abs(ours, theirs) <= threshold("logits_max_abs")


def test_export_of_a_native_workspace_keeps_its_config(tmp_path):
    import transformers as tf

    # qwen2 runs on the qwen3 family, whose own export would say Qwen3ForCausalLM
    root = new_workspace(tmp_path, "q2", tf.Qwen2Config(**BASE, **NO_TOKENS))
    fast_recipe(root)
    export_and_compare(tmp_path, root, "Qwen2ForCausalLM")


def test_export_writes_the_recipe_overrides_into_config_json_or_refuses(tmp_path):
    import transformers as tf

    from titan_core.training.hf_export import export_hf
    from titan_core.config import ConfigError, load_config
    from titan_core.models.model_builder import build_model_from_config

    root = new_workspace(tmp_path, "q2", tf.Qwen2Config(**BASE, **NO_TOKENS))
    recipe = load_config(root / "recipe.toml").model
    recipe.overrides = {"n_layers": 1, "init_std": 0.01}
    family, args, model = build_model_from_config(recipe)
    model.to_empty(device="cpu").init_weights(seed=0)
    export_hf(model, family, args, tmp_path / "hf", model_cfg=recipe)
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    written = json.loads((root / "config.json").read_text())
    assert (exported["num_hidden_layers"], exported["layer_types"]) == (1, ["full_attention"])
    # the family's hf_config(args); initializer_range is the init_std override (the std the weights were drawn with)
    rewritten = ("num_hidden_layers", "layer_types", "max_window_layers", "dtype", "initializer_range")
    assert exported["initializer_range"] == 0.01
    assert {k: v for k, v in exported.items() if k not in rewritten} == {
        k: v for k, v in written.items() if k not in rewritten
    }
    _, info = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    recipe.overrides = {"qk_norm": True}  # Qwen2 has no QK-norm: no config.json says this model
    family, args, model = build_model_from_config(recipe)
    model.to_empty(device="cpu").init_weights(seed=0)
    with pytest.raises(ConfigError, match=re.escape("[model.overrides] ['qk_norm']")):
        export_hf(model, family, args, tmp_path / "hf2", model_cfg=recipe)


OLMO2_BLOCK = '''
class Olmo2Attention(Attention):
    """OLMo-2's attention: RMSNorm over all heads' queries (and keys) before the head split."""

    def __init__(self, args: TransformerArgs):
        super().__init__(args.dim, args.n_heads, args.n_kv_heads, args.head_dim, qkv_bias=args.qkv_bias,
                         out_bias=args.out_bias, norm_eps=args.norm_eps)
        self.q_norm = RMSNorm(args.n_heads * args.head_dim, args.norm_eps)
        self.k_norm = RMSNorm(args.n_kv_heads * args.head_dim, args.norm_eps)

    def forward(self, x, cos, sin, segment_ids=None):
        b, s, _ = x.shape
        q = self.q_norm(self.wq(x)).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_norm(self.wk(x)).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self.core(q, k, v, scale=self.scale, window=None, segment_ids=segment_ids)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    """OLMo-2's post-norm block: x + norm(attention(x)), then x + norm(mlp(x))."""

    def __init__(self, args: TransformerArgs, i: int):
        super().__init__()
        self.attention = Olmo2Attention(args)
        self.post_attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        self.post_ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x, cos, sin, segment_ids=None):
        x = x + self.post_attention_norm(self.attention(x, cos, sin, segment_ids))
        return x + self.post_ffn_norm(self.feed_forward(x)), x.new_zeros(())
'''

OLMO2_ADAPTER = '''
def layer_keys(self):
    """No pre-norms; post-attention and post-feed-forward norms; q/k norms keep their HF names."""
    keys = {k: v for k, v in super().layer_keys().items() if k not in ("attention_norm.weight", "ffn_norm.weight")}
    return {**keys, "post_attention_norm.weight": "post_attention_layernorm.weight",
            "post_ffn_norm.weight": "post_feedforward_layernorm.weight"}
'''


def test_export_of_a_post_norm_port_goes_through_its_adapter(tmp_path):
    import transformers as tf

    root = new_workspace(tmp_path, "olmo2", tf.Olmo2Config(**BASE, **NO_TOKENS), path="port")
    replace_block(root, OLMO2_BLOCK, "from titan_core.models.common.layers import apply_rope\n")
    add_adapter_methods(root, OLMO2_ADAPTER)
    fast_recipe(root)
    export_and_compare(tmp_path, root, "Olmo2ForCausalLM")


# ---- a port's own config fields: args.extra ------------------------------------------------------
GRANITE_ADAPTER = '''
def extra_args_from_hf(self, cfg, take):
    """Granite's four multipliers, which no TransformerArgs field holds, travel in args.extra."""
    kw = super().extra_args_from_hf(cfg, take)
    names = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")
    return {**kw, "extra": {name: take(name) for name in names}}
'''

GRANITE_EDITS = (  # model.py reads them from args.extra, never from config.json
    (
        "h = self.tok_embeddings(tokens)\n",
        'h = self.tok_embeddings(tokens) * self.args.extra["embedding_multiplier"]\n',
    ),
    ("x = x + self.attention(", "x = x + self.residual * self.attention("),
    ("return x + out, aux", "return x + self.residual * out, aux"),
    (
        "        self.ffn_norm = RMSNorm",
        '        self.residual = args.extra["residual_multiplier"]\n'
        '        self.attention.scale = args.extra["attention_multiplier"]\n        self.ffn_norm = RMSNorm',
    ),
    (
        "return softcap(F.linear(h, self.output_weight)",
        'return softcap(F.linear(h, self.output_weight) / self.args.extra["logits_scaling"]',
    ),
)


def test_a_port_carries_its_own_config_fields_to_parity_training_and_export(tmp_path):
    import transformers as tf

    config = tf.GraniteConfig(
        **BASE, **NO_TOKENS, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
        logits_scaling=8.0,
    )  # fmt: skip
    root = new_workspace(tmp_path, "granite", config, path="port")
    add_adapter_methods(root, GRANITE_ADAPTER)
    for old, new in GRANITE_EDITS:
        edit_file(root, "model.py", old, new)
    edit_file(root, "model.py", "self.loss_head(h, ", 'self.loss_head(h / self.args.extra["logits_scaling"], ')
    fast_recipe(root)
    res = check_workspace(root)
    assert res["error"] is None and failed(res) == set(), json.dumps(res["measurements"], indent=1)
    assert not any(re.search("multiplier|logits_scaling", k) for k in res.get("unconsumed_hf_keys", []))
    export_and_compare(tmp_path, root, "GraniteForCausalLM")

    from titan_core.config import load_config
    from titan_core.models.model_builder import resolve_model_args

    recipe = load_config(root / "recipe.toml").model
    recipe.overrides = {"extra": {"logits_scaling": 4.0}}  # an override changes one port field, keeps the rest
    assert resolve_model_args(recipe).extra == {
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125,
        "logits_scaling": 4.0,
    }
