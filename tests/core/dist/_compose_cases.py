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

COMBOS: dict[str, tuple[int, str, tuple[str, ...]]] = {
    # name: (world size, model (MODELS), flags beyond the tiny run)
    "dp2_tp2": (4, "llama3", ("--parallelism.dp_shard=2", "--parallelism.tp=2")),
    "cp2_tp2": (4, "llama3", ("--parallelism.dp_shard=1", "--parallelism.cp=2", "--parallelism.tp=2")),
    "cp2_tp2_sp": (4, "llama3", ("--parallelism.dp_shard=1", "--parallelism.cp=2", "--parallelism.tp=2",
                                 "--parallelism.sequence_parallel")),
    "dp2_cp2_compile": (4, "llama3", ("--parallelism.dp_shard=2", "--parallelism.cp=2", *COMPILE)),
    "pp2_tp2": (4, "llama3", ("--parallelism.dp_shard=1", "--parallelism.pp=2", "--parallelism.tp=2")),
    "pp2_dp2_compile": (4, "llama3", ("--parallelism.dp_shard=2", "--parallelism.pp=2", *COMPILE)),
    "dp2_ep2_compile": (4, "qwen3_moe", ("--parallelism.dp_shard=4", "--parallelism.ep=2", *COMPILE)),
    "pp2_cp2": (4, "llama3", ("--parallelism.dp_shard=1", "--parallelism.pp=2", "--parallelism.cp=2")),
    "ep2_tp2": (4, "qwen3_moe", ("--parallelism.dp_shard=2", "--parallelism.ep=2", "--parallelism.tp=2")),
    "pp2_ep2": (4, "qwen3_moe", ("--parallelism.dp_shard=2", "--parallelism.pp=2", "--parallelism.ep=2")),
    "dp2_cp2_graph": (4, "llama3", ("--parallelism.dp_shard=2", "--parallelism.cp=2", "--graph_trainer.enable")),
    "pp2_dp2_tied": (4, "tied4", ("--parallelism.dp_shard=2", "--parallelism.pp=2")),
    "pp2_ep2_tp2": (8, "qwen3_moe", ("--parallelism.dp_shard=2", "--parallelism.pp=2", "--parallelism.ep=2",
                                     "--parallelism.tp=2")),
    "pp4_dp2_tied": (8, "tied4", ("--parallelism.dp_shard=2", "--parallelism.pp=4", "--parallelism.pp_schedule=gpipe")),
    "dp2_cp2_tp2": (8, "llama3", ("--parallelism.dp_shard=2", "--parallelism.cp=2", "--parallelism.tp=2")),
    "dp2_pp2_tp2": (8, "llama3", ("--parallelism.dp_shard=2", "--parallelism.pp=2", "--parallelism.tp=2")),
}


def dp_degree(flags: tuple[str, ...]) -> int:
    """The data-parallel ranks of a combination (dp_shard x dp_replicate): the ranks reading distinct rows."""
    dp = 1
    for f in flags:
        if f.startswith(("--parallelism.dp_shard=", "--parallelism.dp_replicate=")):
            dp *= int(f.split("=")[1])
    return dp


def combo_cfg(name: str, out: Path):
    world, model, flags = COMBOS[name]
    family, shape = MODELS[model]
    return tiny_cfg(family, out, f"--model.overrides={shape}", f"--training.grad_accum={GRAD_ACCUM}", *flags,
                    batch_size=GLOBAL_BATCH // GRAD_ACCUM // dp_degree(flags), steps=STEPS)  # fmt: skip


def reference_cfg(model: str, out: Path):
    """One plain process on the same rows: the whole global batch in GRAD_ACCUM micro-batches."""
    family, shape = MODELS[model]
    return tiny_cfg(family, out, f"--model.overrides={shape}", f"--training.grad_accum={GRAD_ACCUM}",
                    "--parallelism.data_parallel=none", batch_size=GLOBAL_BATCH // GRAD_ACCUM, steps=STEPS)  # fmt: skip


__all__ = ["COMBOS", "MODELS", "SEQ_LEN", "combo_cfg", "reference_cfg"]
