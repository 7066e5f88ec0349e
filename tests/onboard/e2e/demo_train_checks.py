"""What `onboard demo`'s train stage (onboard/cli/demo_train.py) leaves behind, checked from its
files and its printed summary: a 2-shard pretrained checkpoint with its tokenizer, a run whose
metrics file has every step's loss and the validation losses (finite), an export in the
save_pretrained layout (config.json, the index and its 2 shards, the tokenizer) whose weights
training moved, and "generation equal: yes".

Used by test_demo.py (the background demo) and tests/onboard/cli/test_demo_train.py (the stage alone).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from safetensors import safe_open

from onboard.cli.demo_train import FOLDER, SHARDS, STEPS, VALIDATION_FREQ

TOKENIZER = {"tokenizer.json", "tokenizer_config.json"}


def shards_of(folder: Path) -> list[str]:
    """The safetensors files `folder`'s index names; each must be there."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == SHARDS, (folder, shards)
    assert all((folder / s).is_file() for s in shards), (folder, shards)
    return shards


def check_train_stage(base: Path, stdout: str) -> dict:
    """Assert the stage ran whole under the demo's --dir `base`; returns the run's metrics rows."""
    folder = base / FOLDER
    pretrained, exported = folder / "pretrained", folder / "exported"
    assert {"config.json", "model.safetensors.index.json", *TOKENIZER} <= {p.name for p in pretrained.iterdir()}
    shards_of(pretrained)
    names = {p.name for p in exported.iterdir()}
    assert names == {"config.json", "model.safetensors.index.json", *shards_of(exported), *TOKENIZER}, names
    assert (exported / "tokenizer.json").read_bytes() == (pretrained / "tokenizer.json").read_bytes()
    rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) for r in rows)
    val = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in val] == list(range(VALIDATION_FREQ, STEPS + 1, VALIDATION_FREQ))
    assert all(math.isfinite(r["val_loss"]) and r["val_tokens"] > 0 for r in val), val
    assert_training_moved_the_weights(pretrained, exported)
    assert "generation equal:  yes" in stdout, stdout[-3000:]
    assert f"step-1 loss:       {rows[0]['loss']:.4f}" in stdout
    assert f"validation loss:   step {VALIDATION_FREQ} {val[0]['val_loss']:.4f}" in stdout
    assert "onboard recipe NAME --dir DIR" in stdout
    return {"rows": rows, "val": val}


def assert_training_moved_the_weights(pretrained: Path, exported: Path) -> None:
    """The export is the trained model, not a copy of the checkpoint it started from (so that the
    generation comparison compares trained weights): a layer's weight differs."""
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors = []
    for folder in (pretrained, exported):
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        with safe_open(folder / index["weight_map"][name], framework="pt") as f:
            tensors.append(f.get_tensor(name).float())
    assert tensors[0].shape == tensors[1].shape and not tensors[0].equal(tensors[1])
