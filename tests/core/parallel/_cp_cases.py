"""Tiny configs of the context-parallel tests, shared by the pytest side (the cp = 1 references)
and the rank worker (_cp_worker.py): the same model, data and steps, only the parallelism differs.

Each case is fp32 on one thread, 3 steps of a global batch of 4 rows of 32 tokens, a 2-layer
dim-64 model with 4 query / 2 KV heads (GQA), so cp = 2 cuts each row into 4 chunks of 8.
"""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).parents[1]) not in sys.path:  # the rank workers start with only this folder on the path
    sys.path.insert(0, str(Path(__file__).parents[1]))
from held_out_data import write_corpus  # noqa: E402
from tiny_flags import tiny_run_flags  # noqa: E402

from titan_core.config import load_config  # noqa: E402

GLOBAL_BATCH = 4
SEQ_LEN = 32
STEPS = 3
COMMON = "n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, head_dim = 16, ffn_hidden_dim = 128"

CASES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # name: (family, model overrides beyond COMMON, extra flags)
    "causal": ("llama3", "vocab_size = 256", ()),
    # a window (8) smaller than a chunk pair's span: keys of the window sit on the other rank
    "window_sdpa": ("llama3", "vocab_size = 256, sliding_window = 8", ()),
    # layer 0 windowed with RoPE, layer 1 global without RoPE; the naive core (mask as a score bias)
    "glimmer_naive": ("glimmer", "vocab_size = 256, sliding_window = 8, global_every = 2, rope_skip_every = 2",
                      ("--kernels.attention=naive",)),
    # experts route per token; the load-balancing term (a mean per forward pass) is off: see the report
    "moe": ("qwen3_moe", "vocab_size = 256, n_experts = 4, top_k = 2, moe_hidden_dim = 64, aux_loss_coef = 0.0", ()),
    # packed documents from text: segment ids and positions restarting at each document; validation too
    "packed": ("llama3", "vocab_size = 512", ("--data.source=text", "--data.pack_documents=true",
                                            "--validation.enable", "--validation.freq=2", "--validation.steps=2")),
}


def case_cfg(name: str, corpus: Path, out: Path, *parallel: str, batch_size: int = GLOBAL_BATCH):
    """Case `name`'s config with `parallel`'s flags (none: one plain process, cp = 1)."""
    family, model, extra = CASES[name]
    text = ()
    if "--data.source=text" in extra:
        text = (f"--data.path={corpus / 'train.txt'}", f"--validation.path={corpus / 'val.txt'}")
    return load_config(
        None,
        [
            f"--model.family={family}",
            f"--model.overrides={{{COMMON}, {model}}}",
            *tiny_run_flags(out, steps=STEPS, batch_size=batch_size, seq_len=SEQ_LEN),
            *extra,
            *text,
            *(parallel or ("--parallelism.data_parallel=none",)),
        ],
    )


def corpus_at(root: Path) -> Path:
    """The text corpus of the packed case (held_out_data's paragraphs)."""
    return write_corpus(root / "corpus")
