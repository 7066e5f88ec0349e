"""[activation_checkpoint] in one process: every mode trains bit for bit as without it (fp32), on every
path, and keeps less after the forward; what cannot be checkpointed is refused. The modes under each
parallelism: tests/core/dist/test_sharded_init.py (the same 2-rank launch)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parents[1] / "dist"))
from _cases import SEQ_LEN, flux_cfg, tiny_cfg  # noqa: E402

from titan_core.config.loader import ConfigError  # noqa: E402
from titan_core.memory.tensor_peak import TensorPeak  # noqa: E402
from titan_core.models.common.protocol import ModelBase  # noqa: E402
from titan_core.parallel.activation_checkpoint import apply_activation_checkpoint  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402

MODES = {
    "full": ["--activation_checkpoint.mode=full"],
    "selective_op": ["--activation_checkpoint.mode=selective"],
    "selective_layer": ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective=layer"],
}


def _cfg(family: str, out: Path, *extra: str):
    if family == "flux":
        return flux_cfg(out, "--parallelism.data_parallel=none", *extra)
    return tiny_cfg(family, out, "--parallelism.data_parallel=none", "--training.seq_len=64", *extra)


def _trained(cfg, steps: int = 3):
    trainer = Trainer(cfg, quiet=True)
    rows = []
    for _ in range(steps):
        trainer.step += 1
        rows.append(trainer.train_step())
    return trainer, [(r["loss"], r["grad_norm"]) for r in rows]


@pytest.mark.parametrize("family", ["llama3", "qwen3_moe", "glimmer", "flux"])
def test_every_mode_trains_bit_for_bit_as_without_it(tmp_path, family):
    plain, want = _trained(_cfg(family, tmp_path / "none"))
    params = dict(plain.model.named_parameters())
    for mode, flags in MODES.items():
        trainer, got = _trained(_cfg(family, tmp_path / mode, *flags))
        assert trainer.checkpointed == (["layers.0"] if mode == "selective_layer" else ["layers.0", "layers.1"])
        assert got == want, mode  # losses and grad norms, every step
        for name, p in trainer.model.named_parameters():
            assert torch.equal(p, params[name]), (mode, name)  # so every gradient was the same too


def _kept_after_forward(cfg) -> int:
    """Bytes the forward leaves alive for the backward (the loss included)."""
    trainer = Trainer(cfg, quiet=True)
    batch = next(trainer.data)
    with TensorPeak() as peak:
        loss, _ = trainer.model.loss(batch.tokens, batch.labels, **batch.loss_kwargs())
    kept = peak.live_bytes
    loss.backward()
    return kept


def test_full_keeps_a_fraction_of_the_activations_selective_between(tmp_path):
    wide = ("--model.overrides={n_layers=4, dim=128, n_heads=4, n_kv_heads=2, head_dim=32, ffn_hidden_dim=512, "
            "vocab_size=256}")  # fmt: skip
    none = _kept_after_forward(_cfg("llama3", tmp_path / "none", wide, "--training.seq_len=256"))
    full = _kept_after_forward(_cfg("llama3", tmp_path / "full", wide, "--training.seq_len=256", *MODES["full"]))
    op = _kept_after_forward(_cfg("llama3", tmp_path / "op", wide, "--training.seq_len=256", *MODES["selective_op"]))
    assert full <= 0.4 * none, (full, none)  # full saves >= 60% of what the forward keeps
    assert full < op < none, (full, op, none)


def test_the_transformers_path_checkpoints_transformers_own_layers(tmp_path):
    transformers = pytest.importorskip("transformers", reason="the transformers path needs the [hf] extra")
    config = tmp_path / "config.json"
    transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2).to_json_file(config)  # fmt: skip

    def cfg(out, *extra):
        c = _cfg("llama3", out, "--model.family=transformers", f"--model.hf_config={config}", *extra)
        c.model.overrides = {}
        return c

    _, want = _trained(cfg(tmp_path / "none"))
    trainer, got = _trained(cfg(tmp_path / "full", *MODES["full"]))
    assert got == want
    assert type(trainer.model.layers["0"]).__name__ == "CheckpointedLlamaDecoderLayer"
    assert "model.layers.0.self_attn.q_proj.weight" in dict(trainer.model.named_parameters())  # names unchanged


def test_with_the_graph_trainer_it_is_refused_before_anything_is_built(tmp_path):
    with pytest.raises(ConfigError, match=r"activation_checkpoint\.mode = full with the Graph Trainer.*memory_policy"):
        Trainer(_cfg("llama3", tmp_path, "--graph_trainer.enable", *MODES["full"]), quiet=True)


def test_a_model_without_blocks_is_refused(tmp_path):
    class NoBlocks(ModelBase):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleDict()

    cfg = _cfg("llama3", tmp_path, *MODES["selective_layer"])
    with pytest.raises(ConfigError, match=r"no decoder blocks \(model\.layers is empty\)"):
        apply_activation_checkpoint(NoBlocks(), cfg)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.whole_machine)])
def test_per_block_compile_compiles_the_checkpointed_blocks(tmp_path, backend):
    """Compiled blocks (each backend) under full and per-op checkpointing train as the compiled blocks
    without it. At seq 32 the unchecked blocks are the graphs tests/core/compile/test_per_block.py's
    inductor test compiles (one thread, the default path being plain parameters at one process), so in
    a session inductor's FX graph cache serves them and only the checkpointed graphs are compiled cold."""
    compiled = ["--compile.enable", f"--compile.backend={backend}", f"--training.seq_len={SEQ_LEN}"]
    _, want = _trained(_cfg("llama3", tmp_path / "none", *compiled), steps=2)
    for mode in ("full", "selective_op"):
        trainer, got = _trained(_cfg("llama3", tmp_path / mode, *compiled, *MODES[mode]), steps=2)
        assert trainer.compiled_modules and trainer.checkpointed == ["layers.0", "layers.1"]
        assert max(abs(g - w) / abs(w) for gw, ww in zip(got, want) for g, w in zip(gw, ww)) <= 1e-5, (mode, got, want)
