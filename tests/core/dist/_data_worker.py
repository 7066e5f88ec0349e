"""One rank of the streamed-data scenario: `python _data_worker.py OUT_DIR CORPUS TOKENIZER`.

Started by _world.launch on 2 ranks (SimpleFSDP over gloo). Two runs on the
same JSONL corpus: 4 steps straight, saving checkpoints at steps 2 and 4; then a folder holding
only its step-2 checkpoint, resumed to step 4. Each rank writes what its loader handed out and
the losses to OUT_DIR/rank_<r>.json.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch
import torch.distributed as dist

from titan_core.config import load_config
from titan_core.runtime import distributed
from titan_core.training.trainer import Trainer

MODEL = (
    "--model.overrides={n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, ffn_hidden_dim = 128, vocab_size = 512}"
)


class _Recorder:
    """The trainer's loader, keeping the token ids of every micro-batch it hands out."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def __next__(self):
        b = next(self.inner)
        self.seen.append(b.tokens.tolist())
        return b

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _train(out: Path, corpus: str, tokenizer: str, steps: int, *extra: str) -> dict:
    cfg = load_config(None, [
        MODEL, "--parallelism.data_parallel=simple_fsdp", "--training.batch_size=2", "--training.seq_len=32",
        f"--training.steps={steps}", "--training.deterministic", "--device.type=cpu", "--device.threads=1",
        "--metrics.rich=false", f"--metrics.output_dir={out}", "--data.source=dataset", f"--data.path={corpus}",
        "--data.tokenizer=hf", f"--data.tokenizer_path={tokenizer}", "--checkpoint.interval=2", *extra,
    ])  # fmt: skip
    trainer = Trainer(cfg, quiet=True)
    inner = trainer.data
    trainer.data = rows = _Recorder(inner)
    result = trainer.train()
    return {"batches": rows.seen, "loss": [m["loss"] for m in result.metrics], "resumed_from": result.resumed_from,
            "report": inner.report()}  # fmt: skip


def main() -> None:
    out, corpus, tokenizer = sys.argv[1:]
    out = Path(out)
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        res = {"straight": _train(out / "straight", corpus, tokenizer, 4, "--checkpoint.enable")}
        if state.rank == 0:
            shutil.copytree(out / "straight" / "checkpoints" / "step-2", out / "resumed" / "checkpoints" / "step-2")
        dist.barrier()
        res["resumed"] = _train(out / "resumed", corpus, tokenizer, 4, "--checkpoint.enable")
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
