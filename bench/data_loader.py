"""The streamed dataset loader alone vs the trainer it feeds: does data loading ever stall a step?

Writes a JSONL corpus (--docs documents of a few hundred words, a few broken lines among
them) and a byte-level BPE tokenizer trained on it (tokenizer.json + tokenizer_config.json,
vocabulary 2048: the debug model's), then measures, in this process:

- the loader alone: `data.source = "dataset"` with `data.tokenizer = "hf"`, the trainer's
  batch shape, micro-batches drawn for --loader-seconds (reading, JSON parsing, tokenizing,
  packing), after one warm-up batch; its tokens/s is rows x seq_len / time;
- the trainer: titan_core's llama3 debugmodel on the same data config, --steps steps (eager,
  fp32, CPU), tokens/s the median over RunStats' steady window (the steps after its warm-up).

Prints JSON: both rates, their ratio (loader / trainer; the target is >= 10), the loader's
build time (file listing, the probe of the first rows, the tokenizer) and report (bad rows
counted), the machine's load at start and end. Progress goes to stderr.

    python bench/data_loader.py [--docs 20000 --batch 8 --seq 256 --steps 10 --loader-seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _report  # noqa: E402

TARGET = 10.0
"""The loader must be at least this many times faster than the trainer (issue 34)."""
WORDS = (
    "the of and to in is was for on that with as by at from his her an were are which this be or has had "
    "not but one their its first new after also who they two been more other year time can may all into "
    "during only over state city when most three some about would there university world people used "
    "school under these between known such american national both team later many where united history "
    "well made part "
).split()


def write_corpus(folder: Path, docs: int) -> Path:
    rng = random.Random(0)
    path = folder / "corpus.jsonl"
    with open(path, "w") as f:
        for i in range(docs):
            if i % 997 == 13:
                f.write('{"text": "a broken line\n')  # counted and skipped, never fatal
                continue
            n = rng.randint(80, 600)
            words = [rng.choice(WORDS) for _ in range(n)]
            f.write(json.dumps({"id": i, "text": " ".join(words).capitalize() + "."}) + "\n")
    return path


def write_tokenizer(folder: Path, corpus: Path, vocab: int) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with open(corpus) as f:
        sample = [json.loads(line)["text"] for _, line in zip(range(2000), f) if line.endswith("}\n")]
    tok.train_from_iterator(sample, trainer=trainer)
    out = folder / "tokenizer"
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "add_bos_token": True}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def job_args(corpus: Path, tokenizer: Path, out: Path, a) -> list[str]:
    return [
        "--model.family=llama3", "--model.flavor=debugmodel", f"--training.batch_size={a.batch}",
        f"--training.seq_len={a.seq}", f"--training.steps={a.steps}", "--device.type=cpu", "--metrics.rich=false",
        f"--metrics.output_dir={out}", "--data.source=dataset", f"--data.path={corpus}", "--data.tokenizer=hf",
        f"--data.tokenizer_path={tokenizer}",
    ]  # fmt: skip


def measure_loader(cfg, seconds: float) -> dict:
    from titan_core.data import build_data_loader

    t0 = time.perf_counter()
    loader = build_data_loader(cfg, vocab_size=2048)
    build_s = time.perf_counter() - t0
    next(loader)  # the first read opens the files
    batches, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        next(loader)
        batches += 1
    tokens = batches * cfg.training.batch_size * cfg.training.seq_len
    return {"tokens_per_s": tokens / elapsed, "batches": batches, "seconds": elapsed, "build_s": build_s,
            "report": loader.report()}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--loader-seconds", type=float, default=5.0)
    a = ap.parse_args()
    load_start = _report.load()
    from titan_core.config import load_config
    from titan_core.train import run

    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        folder = Path(tmp)
        print(f"writing {a.docs} documents and a BPE tokenizer", file=sys.stderr)
        corpus = write_corpus(folder, a.docs)
        tokenizer = write_tokenizer(folder, corpus, 2048)
        cfg = load_config(None, job_args(corpus, tokenizer, folder / "run", a))
        print("timing the loader alone", file=sys.stderr)
        loader = measure_loader(cfg, a.loader_seconds)
        print(f"training the debug model {a.steps} steps", file=sys.stderr)
        result = run(cfg, quiet=True)
        stats = result.stats
        corpus_mb = corpus.stat().st_size / 2**20
    trainer_tps = stats.tokens_per_s
    ratio = loader["tokens_per_s"] / trainer_tps
    report = {
        "corpus_mb": round(corpus_mb, 2),
        "batch": [a.batch, a.seq],
        "loader": loader,
        "trainer": {"tokens_per_s": trainer_tps, "steps": a.steps, "model": "llama3 debugmodel"},
        "ratio": ratio,
        "target": TARGET,
        "ok": ratio >= TARGET,
        "load": {"start": load_start, "end": _report.load()},
    }
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
