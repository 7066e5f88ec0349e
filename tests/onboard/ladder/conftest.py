"""Fixtures for the ladder tests: a fresh llama3 debugmodel workspace (new-model's own output)."""

import pytest

from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.workspace.layout import Workspace


@pytest.fixture
def debug_ws(tmp_path):
    """A workspace from `--preset llama3/debugmodel` under tmp_path; returns the loaded Workspace."""
    plan = plan_workspace("dbg", tmp_path, preset="llama3/debugmodel", device="cpu")
    write_workspace(plan)
    return Workspace.load(tmp_path, "dbg")


# Narrower layers of the same architecture (every feature of the preset kept), so rungs that
# compile or capture the model stay fast on a 2-core machine; as if new-model had been given a
# smaller config.json of the same model_type.
NARROW = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=128, vocab_size=256)  # fmt: skip
NARROW_EXTRA = {
    "llama3": {},
    "qwen3_moe": dict(num_experts=4, moe_intermediate_size=32),
    # one windowed and one global layer, RoPE skipped on the second: the preset's pattern in 2 layers
    "glimmer": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=16, no_rope_layer_interval=2),
}


@pytest.fixture
def narrow_ws(tmp_path):
    """Factory: a workspace from `--preset <family>/debugmodel` with narrowed config.json,
    seq_len 32 and one thread; returns the loaded Workspace."""
    import json

    def make(family: str, name: str | None = None) -> Workspace:
        name = name or family
        plan = plan_workspace(name, tmp_path, preset=f"{family}/debugmodel", device="cpu", threads=(1, "tests"))
        root = write_workspace(plan)
        config = json.loads((root / "config.json").read_text())
        narrow = {**NARROW, **NARROW_EXTRA[family]}
        assert set(narrow) <= set(config), f"the preset's config.json lost {set(narrow) - set(config)}"
        (root / "config.json").write_text(json.dumps({**config, **narrow}, indent=2))
        recipe = root / "recipe.toml"
        assert "seq_len = 128" in recipe.read_text()
        recipe.write_text(recipe.read_text().replace("seq_len = 128", "seq_len = 32"))
        return Workspace.load(tmp_path, name)

    return make
