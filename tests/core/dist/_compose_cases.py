"""The composition matrix: parallel degrees (and execution modes) that meet, each a tiny run on gloo
against one plain process training the same rows (shared by test_compose.py and _compose_worker.py).

Every case is fp32 on one thread, STEPS steps of a global batch of GLOBAL_BATCH rows of SEQ_LEN
tokens, 2 micro-batches a step (the pipeline's micro-batches; the same for every case so one
reference per family serves all). Each rank reads GLOBAL_BATCH / (its data-parallel degree) rows:
tp, cp and pp peers hold the same rows (cp keeps half of each row's tokens, pp a part of the layers).
Four ranks where two degrees meet, eight where three do.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).parents[1]) not in sys.path:  # the rank workers start with only this folder on the path
    sys.path.insert(0, str(Path(__file__).parents[1]))
from _cases import SEQ_LEN, tiny_cfg  # noqa: E402

from titan_core.parallel.mesh import smallest_world  # noqa: E402

GLOBAL_BATCH = 8
STEPS = 3
GRAD_ACCUM = 2
COMPILE = ("--compile.enable", "--compile.backend=aot_eager")
"""Per-block compile with the backend that traces what inductor would compile, without its minute."""
SHAPE = "dim=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_hidden_dim=128, vocab_size=256"
MODELS: dict[str, tuple[str, str]] = {
    # name: (family, model overrides)
    "llama3": ("llama3", f"{{n_layers=2, {SHAPE}}}"),
    # without the load-balancing term: a mean per forward pass, which differs by design where a rank's forward
    # sees other rows or tokens than one process's (test_expert_parallel.py proves ep with it on)
    "qwen3_moe": ("qwen3_moe", f"{{n_layers=2, {SHAPE}, n_experts=4, top_k=2, moe_hidden_dim=64, aux_loss_coef=0.0}}"),
    # tied embeddings over 4 layers: 4 pipeline stages, the first's embedding and the last's head one weight
    "tied4": ("llama3", f"{{n_layers=4, {SHAPE}, tie_embeddings=true}}"),
}

COMBOS: dict[str, tuple[str, tuple[str, ...]]] = {
    # name: (model (MODELS), flags beyond the tiny run); its world is what the degrees fill (`world_of`)
    "dp2_tp2": ("llama3", ("--parallelism.dp_shard=2", "--parallelism.tp=2")),
    "cp2_tp2": ("llama3", ("--parallelism.dp_shard=1", "--parallelism.cp=2", "--parallelism.tp=2")),
    "cp2_tp2_sp": ("llama3", ("--parallelism.dp_shard=1", "--parallelism.cp=2", "--parallelism.tp=2",
                                 "--parallelism.sequence_parallel")),
    "dp2_cp2_compile": ("llama3", ("--parallelism.dp_shard=2", "--parallelism.cp=2", *COMPILE)),
    "pp2_tp2": ("llama3", ("--parallelism.dp_shard=1", "--parallelism.pp=2", "--parallelism.tp=2")),
    "pp2_dp2_compile": ("llama3", ("--parallelism.dp_shard=2", "--parallelism.pp=2", *COMPILE)),
    "dp2_ep2_compile": ("qwen3_moe", ("--parallelism.dp_shard=4", "--parallelism.ep=2", *COMPILE)),
    "pp2_cp2": ("llama3", ("--parallelism.dp_shard=1", "--parallelism.pp=2", "--parallelism.cp=2")),
    "ep2_tp2": ("qwen3_moe", ("--parallelism.dp_shard=2", "--parallelism.ep=2", "--parallelism.tp=2")),
    "pp2_ep2": ("qwen3_moe", ("--parallelism.dp_shard=2", "--parallelism.pp=2", "--parallelism.ep=2")),
    "dp2_cp2_graph": ("llama3", ("--parallelism.dp_shard=2", "--parallelism.cp=2", "--graph_trainer.enable")),
    "pp2_dp2_tied": ("tied4", ("--parallelism.dp_shard=2", "--parallelism.pp=2")),
    "pp2_ep2_tp2": ("qwen3_moe", ("--parallelism.dp_shard=2", "--parallelism.pp=2", "--parallelism.ep=2",
                                     "--parallelism.tp=2")),
    "pp4_dp2_tied": ("tied4", ("--parallelism.dp_shard=2", "--parallelism.pp=4", "--parallelism.pp_schedule=gpipe")),
    "dp2_cp2_tp2": ("llama3", ("--parallelism.dp_shard=2", "--parallelism.cp=2", "--parallelism.tp=2")),
    "dp2_pp2_tp2": ("llama3", ("--parallelism.dp_shard=2", "--parallelism.pp=2", "--parallelism.tp=2")),
}


def combo_cfg(name: str, out: Path):
    """Combination `name`'s config: each data-parallel rank reads its share of the global batch (tp, cp and
    pp peers read the same rows)."""
    model, flags = COMBOS[name]
    family, shape = MODELS[model]
    cfg = tiny_cfg(family, out, f"--model.overrides={shape}", f"--training.grad_accum={GRAD_ACCUM}", *flags,
                   steps=STEPS)  # fmt: skip
    p = cfg.parallelism
    cfg.training.batch_size = GLOBAL_BATCH // GRAD_ACCUM // (p.dp_shard * p.dp_replicate)
    return cfg


def world_of(name: str) -> int:
    """The ranks combination `name`'s degrees fill."""
    return smallest_world(combo_cfg(name, Path("unused")).parallelism)


def reference_cfg(model: str, out: Path):
    """One plain process on the same rows: the whole global batch in GRAD_ACCUM micro-batches."""
    family, shape = MODELS[model]
    return tiny_cfg(family, out, f"--model.overrides={shape}", f"--training.grad_accum={GRAD_ACCUM}",
                    "--parallelism.data_parallel=none", batch_size=GLOBAL_BATCH // GRAD_ACCUM, steps=STEPS)  # fmt: skip


__all__ = ["COMBOS", "MODELS", "SEQ_LEN", "combo_cfg", "reference_cfg", "world_of"]
