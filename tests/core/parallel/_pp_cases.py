"""The tiny runs of the pipeline-parallel test, shared by the pytest side (the pp = 1 references)
and the rank worker (_pp_worker.py): the same model, data and steps, only the parallelism differs.

A 4-layer decoder (dim 64, 4 query / 2 KV heads), fp32 on one thread, grad_accum = 4
micro-batches of 2 rows of 32 tokens per data-parallel rank, 3 steps. The reference is one
plain process over the same global rows with the same grad_accum.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).parents[1]) not in sys.path:  # the rank workers start with only this folder on the path
    sys.path.insert(0, str(Path(__file__).parents[1]))
from held_out_data import write_corpus  # noqa: E402
from tiny_flags import tiny_run_flags  # noqa: E402

from titan_core.config import load_config  # noqa: E402

COMMON = "n_layers = 4, dim = 64, n_heads = 4, n_kv_heads = 2, head_dim = 16, ffn_hidden_dim = 128"
GRAD_ACCUM = 4
BATCH = 2
STEPS = 3

CASES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # name: (family, model overrides beyond COMMON, flags of the pp = 2 run)
    "gpipe": ("llama3", "vocab_size = 256", ("--parallelism.pp_schedule=gpipe",)),
    "1F1B": ("llama3", "vocab_size = 256", ("--parallelism.pp_schedule=1F1B",)),
    # 4 stages of one layer, two per rank (0 and 2 on rank 0)
    "interleaved1F1B": ("llama3", "vocab_size = 256", ("--parallelism.pp_schedule=interleaved1F1B",)),
    "layers_1_3": ("llama3", "vocab_size = 256", ("--parallelism.pp_layers=1,3",)),
    # packed documents: positions and segment ids reach every stage; the held-out loss through the stages
    # (3 micro-batches: one group of the schedule's 4, filled with a blank one), at steps 2 and 3
    "packed": ("llama3", "vocab_size = 512", ("--data.source=text", "--data.pack_documents=true",
                                            "--validation.enable", "--validation.freq=2", "--validation.steps=3")),
    # tied embeddings: the first stage's embedding and the last stage's head are copies of one weight
    "tied": ("llama3", "vocab_size = 256, tie_embeddings = true", ("--parallelism.pp_schedule=1F1B",)),
    # experts without the load-balancing term
    "moe": ("qwen3_moe", "vocab_size = 256, n_experts = 4, top_k = 2, moe_hidden_dim = 64, aux_loss_coef = 0.0",
            ("--parallelism.pp_schedule=gpipe",)),
    # with it: every layer's routing statistics passed from stage to stage (4 stages, two per rank), one loss
    "moe_aux": ("qwen3_moe", "vocab_size = 256, n_experts = 4, top_k = 2, moe_hidden_dim = 64, aux_loss_coef = 0.1",
                ("--parallelism.pp_schedule=interleaved1F1B",)),
}
TWO_RANKS = ("gpipe", "1F1B", "interleaved1F1B", "layers_1_3", "packed", "tied", "moe", "moe_aux")
"""pp = 2 on 2 ranks."""
FOUR_RANKS: dict[str, tuple[str, tuple[str, ...]]] = {
    # run: (case, data-parallel flags): pp = 2 on 4 ranks, each stage on 2 data-parallel ranks
    "dp_shard2": ("1F1B", ("--parallelism.dp_shard=2",)),
    "dp_replicate2": ("1F1B", ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=1")),
}


def case_cfg(name: str, corpus: Path, out: Path, *parallel: str, batch_size: int = BATCH):
    """Case `name`'s config with `parallel`'s flags (none: one plain process, pp = 1)."""
    family, model, flags = CASES[name]
    if not parallel:
        flags = tuple(f for f in flags if not f.startswith("--parallelism."))
    text = ()
    if "--data.source=text" in flags:
        text = (f"--data.path={corpus / 'train.txt'}", f"--validation.path={corpus / 'val.txt'}")
    return load_config(
        None,
        [
            f"--model.family={family}",
            f"--model.overrides={{{COMMON}, {model}}}",
            *tiny_run_flags(out, steps=STEPS, batch_size=batch_size),
            f"--training.grad_accum={GRAD_ACCUM}",
            *flags,
            *text,
            *(parallel or ("--parallelism.data_parallel=none",)),
        ],
    )


def corpus_at(root: Path) -> Path:
    """The text corpus of the packed case (held_out_data's paragraphs)."""
    return write_corpus(root / "corpus")
