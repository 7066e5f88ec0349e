"""Tiny configs shared by the multi-process tests and their single-process references.

Each family's debugmodel, shrunk: dim 64, 2 layers, vocab 256, 4 query / 2 KV heads
(so TP = 2 leaves whole heads per rank); qwen3_moe keeps 4 experts, top 2; glimmer keeps
its pattern in 2 layers (layer 0 windowed with RoPE, layer 1 global without RoPE).
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import torch

if str(Path(__file__).parents[1]) not in sys.path:  # the rank workers put only tests/core/dist on their path
    sys.path.insert(0, str(Path(__file__).parents[1]))
from tiny_flags import tiny_run_flags  # noqa: E402

from titan_core.config import load_config  # noqa: E402
from titan_core.data import IGNORE_INDEX, Batch
from titan_core.models import FAMILY_NAMES, build_meta, resolve_args
from titan_core.measure.numerics import curve_max_rel

COMMON = "n_layers=2, dim=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_hidden_dim=128, vocab_size=256"
EXTRA = {
    "llama3": "",
    "qwen3": "",
    "qwen3_moe": ", n_experts=4, top_k=2, moe_hidden_dim=64",
    "glimmer": ", sliding_window=8, global_every=2, rope_skip_every=2",
}
FAMILIES = [f for f in FAMILY_NAMES if f in EXTRA]
DENSE = [f for f in FAMILIES if f != "qwen3_moe"]
HSDP = ("llama3", "qwen3_moe")
"""The families of the 4-rank HSDP cases: HSDP adds a replicate dimension to the sharding that the
2-rank cases check for every family, the same for every dense family; the MoE's experts are sharded too."""
CKPT = ("--checkpoint.enable", "--checkpoint.interval=2", "--checkpoint.folder=ckpt")
"""A run that saves at steps 2 and 4 (the DCP tests resume across world sizes from them)."""
GLOBAL_BATCH = 4
SEQ_LEN = 32
STEPS = 5
RUN_STEPS = 3
"""The steps of each run of the 2- and 4-rank scenarios (_worker.py) and of its one-process reference
(conftest.py): every loss and grad norm from the first, before any update, through two AdamW updates,
the second from the state the first left."""


def overrides(family: str) -> str:
    return f"--model.overrides={{{COMMON}{EXTRA[family]}}}"


def tiny_cfg(family: str, out: Path, *extra: str, batch_size: int = GLOBAL_BATCH, steps: int = STEPS):
    """fp32, synthetic data, lr high enough that 5 steps move the weights visibly."""
    return load_config(
        None,
        [
            f"--model.family={family}",
            overrides(family),
            *tiny_run_flags(out, steps=steps, batch_size=batch_size, seq_len=SEQ_LEN),
            *extra,
        ],
    )


def only_step_2(src: Path, dst: Path) -> Path:
    """A checkpoint folder holding only step-2 of `src`, so a resume starts there."""
    (dst / "ckpt").mkdir(parents=True)
    shutil.copytree(src / "ckpt" / "step-2", dst / "ckpt" / "step-2")
    return dst


FLUX_SMALL = "{n_double_layers = 1, n_single_layers = 1, latent_height = 4, latent_width = 4, text_len = 8}"
"""The flux debug model cut to one block of each kind over 16 image + 8 text tokens: a 4-rank
step of the whole debug model costs the 4-rank launch more than all the LM families together."""


def flux_cfg(out: Path, *extra: str, batch_size: int = GLOBAL_BATCH, steps: int = STEPS):
    """The small flux model (FLUX_SMALL) in tiny_cfg's settings, on one batch repeated: a flow loss
    over fresh noise and timesteps is too noisy in 5 steps to show that the model trains."""
    return load_config(
        None,
        [
            "--model.family=flux", "--model.flavor=debugmodel", f"--model.overrides={FLUX_SMALL}",
            *tiny_run_flags(out, steps=steps, batch_size=batch_size, seq_len=16), "--data.repeat_batch=true",
            *extra,
        ],
    )  # fmt: skip


def param_reads_per_forward(family: str) -> int:
    """Parameter reads in one forward pass: each is one all-gather and, in backward, one reduce-scatter.

    Every parameter is read once (the MoE expert loop reads its three weights once, up
    front), except a tied embedding, which is read again as the output head.
    """
    cfg = tiny_cfg(family, Path("unused"))
    args = resolve_args(family, "debugmodel", cfg.model.overrides)
    model = build_meta(family, args)
    reads = sum(1 for _ in model.named_parameters())
    return reads + (1 if args.tie_embeddings else 0)


def max_rel(got: list[float], want: list[float]) -> float:
    """The worst `titan_core.measure.numerics.rel` over two curves of finite values."""
    assert len(got) == len(want), (got, want)
    assert all(math.isfinite(x) for x in got)
    return curve_max_rel(got, want)[0]


VALID_PER_ROW = (2, 5, SEQ_LEN - 1, SEQ_LEN)
"""Valid labels in each row of `uneven_rows`: rank 0's two rows (of 2) are mostly ignored
labels (7 of 64 valid), rank 1's almost none (63 of 64 valid)."""


def uneven_rows(step: int, *, vocab: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, labels) [GLOBAL_BATCH, SEQ_LEN] of one global batch whose rows hold very
    different numbers of ignored labels (-100 at the row's end, like document padding)."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, vocab, (GLOBAL_BATCH, SEQ_LEN), generator=g)
    labels = torch.randint(0, vocab, (GLOBAL_BATCH, SEQ_LEN), generator=g)
    for row, valid in enumerate(VALID_PER_ROW):
        labels[row, valid:] = IGNORE_INDEX
    return tokens, labels


def uneven_batch(step: int, part: int = 0, parts: int = 1) -> Batch:
    """Rows `part` of `parts` equal slices of `uneven_rows(step)`: a rank's rows (parts = dp
    world) or a micro-batch (parts = grad_accum); parts = 1 is the whole global batch."""
    tokens, labels = uneven_rows(step)
    n = GLOBAL_BATCH // parts
    return Batch(tokens[part * n : (part + 1) * n].clone(), labels[part * n : (part + 1) * n].clone())


def curve(rows: list[dict]) -> dict:
    return {"loss": [r["loss"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows]}


def run_worker(
    scenario: str, nproc: int, out: Path, *args: str, timeout_s: float = 300, worker: str = "_worker.py"
) -> list[dict]:
    """Run `WORKER SCENARIO OUT ARGS` (default `_worker.py`) on `nproc` gloo ranks (_world.launch, its hang
    guard `timeout_s` for the load); every rank's results (each rank writes OUT/rank_<r>.json)."""
    import json

    from _world import launch  # here, not at the top: _worker.py imports this module too

    out.mkdir(parents=True, exist_ok=True)
    failure = launch(Path(__file__).with_name(worker), [scenario, str(out), *args], nproc, timeout_s,
                     f"{worker} {scenario} on {nproc} ranks", out / "logs")  # fmt: skip
    assert failure is None, failure
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(nproc)]
