"""A narrowed debug-model workspace: the preset's architecture with narrower layers (every feature
of the preset kept), so rungs that compile or capture the model stay fast on a 2-core machine; as
if new-model had been given a smaller config.json of the same model_type. For the `narrow_ws`
fixture (conftest.py) and the background climbs that are plain scripts (bf16_climb.py)."""

from __future__ import annotations

import json
from pathlib import Path

from onboard.workspace.layout import Workspace
from onboard.workspace.scaffold import plan_workspace, write_workspace

NARROW = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=128, vocab_size=256)  # fmt: skip
NARROW_EXTRA = {
    "llama3": {},
    "qwen3_moe": dict(num_experts=4, moe_intermediate_size=32),
    # one windowed and one global layer, RoPE skipped on the second: the preset's pattern in 2 layers
    "glimmer": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=16, no_rope_layer_interval=2),
}


def narrow_workspace(base: Path, family: str, name: str | None = None) -> Workspace:
    """A workspace under `base` from `--preset <family>/debugmodel` with narrowed config.json,
    seq_len 32 and one thread."""
    name = name or family
    plan = plan_workspace(name, base, preset=f"{family}/debugmodel", device="cpu", threads=(1, "tests"))
    root = write_workspace(plan)
    config = json.loads((root / "config.json").read_text())
    narrow = {**NARROW, **NARROW_EXTRA[family]}
    assert set(narrow) <= set(config), f"the preset's config.json lost {set(narrow) - set(config)}"
    (root / "config.json").write_text(json.dumps({**config, **narrow}, indent=2))
    recipe = root / "recipe.toml"
    assert "seq_len = 128" in recipe.read_text()
    recipe.write_text(recipe.read_text().replace("seq_len = 128", "seq_len = 32"))
    return Workspace.load(base, name)
