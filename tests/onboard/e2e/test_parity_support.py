"""Helpers for the parity tests: tiny HF configs and workspaces made the way a user makes them.

(No tests here; the name keeps it among the parity test files.) Workspaces are scaffolded
by `onboard.workspace.scaffold` (what `onboard new-model --hf-config` runs) from a config.json that
transformers' own config class wrote, then edited the way a porting agent edits them.
"""

from __future__ import annotations

import re
from pathlib import Path

BASE = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128, vocab_size=256,
)  # fmt: skip
LLAMA3_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
}  # fmt: skip


def tiny_config(model_type: str, **extra):
    """A tiny transformers config of `model_type` with the feature its case is about."""
    import transformers as tf

    if model_type == "llama":  # llama3 rope scaling (max positions above the original context)
        kw = dict(rope_parameters=LLAMA3_ROPE, max_position_embeddings=131072)
        return tf.LlamaConfig(**{**BASE, **kw, **extra})
    if model_type == "mistral":  # a window well inside the 512-token parity sequence
        return tf.MistralConfig(**{**BASE, "sliding_window": 128, **extra})
    if model_type == "qwen2":  # q/k/v biases are built into Qwen2
        return tf.Qwen2Config(**{**BASE, **extra})
    if model_type == "qwen3":  # QK-norm, and a head_dim that is not hidden // heads
        return tf.Qwen3Config(**{**BASE, "head_dim": 32, **extra})
    if model_type == "qwen3_moe":  # 4 experts top-2, layer 1 dense
        kw = dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[1])
        return tf.Qwen3MoeConfig(**{**BASE, **kw, **extra})
    raise ValueError(model_type)


def new_workspace(base: Path, name: str, config, *, path: str | None = None) -> Path:
    """`onboard new-model NAME --hf-config config.json [--path port]` under `base`."""
    from onboard.workspace.scaffold import plan_workspace, write_workspace

    cfg_path = base / f"{name}.config.json"
    config.to_json_file(cfg_path)
    return write_workspace(plan_workspace(name, base, hf_config=cfg_path, path=path, device="cpu"))


def port_workspace(base: Path, name: str, config_class: str, config: dict, model: str, adapter_methods: str) -> Path:
    """`new-model NAME --hf-config <transformers' `config_class`(**config)> --path port`, then the agent's
    port: model.py replaced by `model`, `adapter_methods` added to adapter.py's Adapter."""
    import transformers

    root = new_workspace(base, name, getattr(transformers, config_class)(**config), path="port")
    (root / "model.py").write_text(model)
    add_adapter_methods(root, adapter_methods)
    return root


def add_adapter_methods(root: Path, methods: str) -> None:
    """Add methods to the workspace's `class Adapter` (as an agent edits adapter.py)."""
    path = root / "adapter.py"
    text = path.read_text()
    anchor = "\n\nADAPTER = Adapter()"
    assert anchor in text, "adapter.py template changed: no 'ADAPTER = Adapter()' to insert before"
    body = "\n".join(("    " + line if line.strip() else "") for line in methods.strip("\n").splitlines())
    path.write_text(text.replace(anchor, "\n" + body + "\n" + anchor, 1))


def set_model_overrides(root: Path, **overrides) -> None:
    """Add `[model.overrides]` to recipe.toml."""
    import tomli_w

    path = root / "recipe.toml"
    assert "[model.overrides]" not in path.read_text()
    with path.open("a") as f:
        f.write("\n" + tomli_w.dumps({"model": {"overrides": overrides}}))


def edit_file(root: Path, name: str, old: str, new: str) -> None:
    """Replace one exact snippet in a workspace file (fails loudly if the template moved on)."""
    path = root / name
    text = path.read_text()
    assert len(re.findall(re.escape(old), text)) >= 1, f"{name} no longer contains {old!r}"
    path.write_text(text.replace(old, new))
