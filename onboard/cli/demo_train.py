"""`onboard demo`'s last stage: the recipe the ladder proved trains "your" model on "your" data.

After the climb, in `<dir>/demo/`:

1. `pretrained/`: a stand-in for the user's checkpoint, in the layout a user brings: the recipe's
   own config.json as a transformers config, a model of it saved by `save_pretrained` in 2
   safetensors shards, and a byte-level BPE `tokenizer.json` trained on the corpus (with a
   `tokenizer_config.json` naming BOS / EOS).
2. `train.jsonl`, `val.jsonl`: a small generated corpus (deterministic) and its held-out part.
3. The workspace's recipe, unchanged, run as a user runs it (`python -m titan_core.train`, the
   entry point `onboard train` and `onboard recipe`'s commands use; `--nproc` when the recipe's
   parallelism names more than one process) with command-line overrides only: start from
   `pretrained/`, read the JSONL through its tokenizer, validate every VALIDATION_FREQ steps,
   export to `exported/` in 2 shards, keep the last step's DCP checkpoint, STEPS steps.
4. transformers reloads the export (AutoModelForCausalLM) and generates greedily from a fixed
   prompt; titan_core's model, loaded from the run's own last checkpoint, must give the same
   tokens. A loss or validation loss that is not finite, a failed run or a difference fails
   the stage (the demo then exits 1, saying which).
"""

from __future__ import annotations

import json
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import torch
from rich.markup import escape

from onboard.cli.export_cmd import find_checkpoint
from onboard.cli.recipe_view import per_rank_batch, world_of
from onboard.errors import EXIT_FAILED
from onboard.rungs.train_run import process_threads
from onboard.workspace.layout import Workspace
from titan_core.config.dtypes import DTYPES
from titan_core.config.hf_config import read_hf_config
from titan_core.config.loader import ConfigError, load_config
from titan_core.data.hf_tokenizer import HfTokenizer, locate
from titan_core.data.tokenizer import BOS_TOKEN, EOS_TOKEN, train_bpe
from titan_core.models.transformers.hf_classes import require_transformers
from titan_core.runtime.die_with_parent import with_parent_death_signal
from titan_core.training.generate import greedy, hf_greedy, model_from_checkpoint

FOLDER = "demo"
"""The stage's folder under the demo's --dir (beside onboarding/)."""
STEPS = 8
"""Training steps: enough for the loss to fall visibly (the new-model recipe of the debug model:
about a second each on one CPU core)."""
VALIDATION_FREQ = 4
VALIDATION_BATCHES = 2
TRAIN_ROWS, VAL_ROWS, MAX_VAL_ROWS = 240, 40, 600
"""Rows of train.jsonl (the stream starts over at its end), and the least and most of val.jsonl."""
BPE_VOCAB = 512
"""The demo tokenizer's vocabulary (bytes, merges, BOS, EOS); at most the model's vocab_size."""
PROMPT = "the quick fox"
NEW_TOKENS = 8
SHARDS = 2
"""Shards of the pretrained checkpoint and of the export: a user's are sharded too."""

_ADJ = "quick lazy small bright quiet old young red green happy".split()
_NOUN = "fox dog cat bird model robot river tree teacher student".split()
_VERB = ["jumps over", "runs past", "looks at", "sits near", "waits for", "talks to"]


class StageFailed(Exception):
    """A check of the stage did not hold: the message says which, with its numbers."""


def sentence(rng: random.Random) -> str:
    return f"the {rng.choice(_ADJ)} {rng.choice(_NOUN)} {rng.choice(_VERB)} the {rng.choice(_ADJ)} {rng.choice(_NOUN)}."


def corpus(rows: int, seed: int) -> list[str]:
    """`rows` documents of three templated sentences: a small grammar the loss can learn in a few steps."""
    rng = random.Random(seed)
    return [" ".join(sentence(rng) for _ in range(3)) for _ in range(rows)]


def held_out(tok, tokens: int, seed: int = 2) -> list[str]:
    """At least VAL_ROWS documents of another seed than the training rows, holding at least `tokens`
    tokens of `tok` (BOS and EOS counted, as packing adds them): whole batches of the recipe's,
    since a held-out set with no whole batch is refused (titan_core/training/validate.py)."""
    rng, docs, count = random.Random(seed), [], 0
    while count < tokens or len(docs) < VAL_ROWS:
        if len(docs) == MAX_VAL_ROWS:
            raise StageFailed(f"{tokens} held-out tokens (the recipe's batch) need more than {MAX_VAL_ROWS} demo rows")
        docs.append(" ".join(sentence(rng) for _ in range(3)))
        count += len(tok.encode(docs[-1]).ids) + 2
    return docs


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def write_pretrained(cfg, folder: Path, texts: list[str]) -> dict:
    """The stand-in checkpoint (module docstring, 1.) for the recipe's model; returns its size in
    bytes, its tokenizer (a `tokenizers.Tokenizer`) and its files."""
    try:  # lazy: the [hf] extra, which only this stage of the demo needs (imported as titan_core imports it)
        transformers = require_transformers()
    except ConfigError:
        raise StageFailed("it needs transformers: pip install 'titan-onboard[hf]' (or run the demo with --no-train)")

    transformers.utils.logging.disable_progress_bar()  # its bars on stderr would interleave with the demo's log
    if not cfg.model.hf_config:
        raise StageFailed("the recipe names no model.hf_config: the stage writes the checkpoint from it")
    hf = read_hf_config(cfg.model.hf_config)
    config = transformers.AutoConfig.for_model(hf["model_type"], **{k: v for k, v in hf.items() if k != "model_type"})
    torch.manual_seed(cfg.training.seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    # a shard limit of 60% of the model: two files, as long as no one tensor is larger
    model.save_pretrained(folder, max_shard_size=int(size * 0.6))
    tok = train_bpe(texts, min(BPE_VOCAB, config.vocab_size))
    tok.save(str(folder / "tokenizer.json"))
    special = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "add_bos_token": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(special, indent=2), encoding="utf-8")
    return {"bytes": size, "tokenizer": tok, "files": sorted(p.name for p in folder.iterdir())}


def overrides(files: dict[str, Path], shard_mb: int) -> list[str]:
    """The command-line overrides that point the proved recipe at the user's checkpoint and data."""
    return [
        f"--checkpoint.initial_hf={files['pretrained']}",
        "--data.source=dataset",
        f"--data.path={files['train']}",
        "--data.tokenizer=hf",
        f"--data.tokenizer_path={files['pretrained']}",
        "--validation.enable=true",
        f"--validation.path={files['val']}",
        f"--validation.freq={VALIDATION_FREQ}",
        f"--validation.steps={VALIDATION_BATCHES}",
        f"--checkpoint.export_hf={files['exported']}",
        f"--checkpoint.export_shard_mb={shard_mb}",
        # the last step's DCP checkpoint: the trained model the export is compared with
        "--checkpoint.enable=true",
        "--checkpoint.interval=0",
        f"--training.steps={STEPS}",
        f"--metrics.output_dir={files['run']}",
        "--metrics.rich=false",
    ]


def train_command(ws: Workspace, extra: list[str]) -> list[str]:
    """`python -m titan_core.train --config RECIPE [--nproc N --training.batch_size=B] EXTRA`."""
    recipe = tomllib.loads(ws.recipe_path.read_text(encoding="utf-8"))
    argv = [sys.executable, "-m", "titan_core.train", "--config", str(ws.recipe_path)]
    ranks, dp = world_of(recipe) or (1, 1)  # a degree that fills from the world size: one process runs it
    if ranks > 1:  # the recipe's global batch split over its data-parallel ranks, as `onboard recipe` says
        rows, why = per_rank_batch(recipe, dp)
        if rows is None:
            raise StageFailed(why)
        argv += ["--nproc", str(ranks), f"--training.batch_size={rows}"]
    return argv + extra


def run_training(argv: list[str], cwd: Path, log_path: Path, out) -> int:
    """Run the trainer, its metrics rows shown as they come (the whole output in `log_path`)."""
    # unbuffered: the rows arrive as the steps end; wide: rich does not wrap a row at 80 columns
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "240", "HF_HUB_OFFLINE": "1"}
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(with_parent_death_signal(argv), cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if line.startswith(("step=", "error", "loaded initial weights", "exported")):
                out.log("  " + line.rstrip())
        return proc.wait()


def read_metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """(training rows, validation rows) of the run's metrics.jsonl; StageFailed when a loss is not finite."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    train = [{"step": r["step"], "loss": r["loss"]} for r in rows if "loss" in r]
    val = [{"step": r["step"], "loss": r["val_loss"], "ppl": r.get("val_ppl")} for r in rows if "val_loss" in r]
    bad = [(kind, r["step"], r["loss"]) for kind, rs in (("loss", train), ("validation loss", val)) for r in rs
           if not math.isfinite(r["loss"])]  # fmt: skip
    if bad:
        raise StageFailed("not finite: " + ", ".join(f"{k} {v} at step {s}" for k, s, v in bad))
    if len(train) != STEPS or [r["step"] for r in val] != list(range(VALIDATION_FREQ, STEPS + 1, VALIDATION_FREQ)):
        raise StageFailed(
            f"{path}: {len(train)} training rows (want {STEPS}) and validation at steps "
            f"{[r['step'] for r in val]} (want every {VALIDATION_FREQ})"
        )
    return train, val


def check_generation(cfg, files: dict[str, Path]) -> dict:
    """Greedy tokens of the export (transformers) and of the run's last checkpoint (titan_core)."""
    checkpoint = find_checkpoint(cfg, None)
    if checkpoint is None:
        raise StageFailed(f"the run left no checkpoint under {files['run']}: nothing to compare the export with")
    tok = HfTokenizer(*locate(str(files["pretrained"])))  # the trainer's reading of it: the same BOS
    prompt = ([tok.bos_id] if tok.add_bos else []) + tok.encode(PROMPT)  # as the trainer starts a document
    ours = greedy(model_from_checkpoint(cfg, checkpoint), prompt, NEW_TOKENS)
    theirs = hf_greedy(files["exported"], prompt, NEW_TOKENS)
    return {
        "prompt": PROMPT,
        "checkpoint": str(checkpoint),
        "titan_tokens": ours,
        "hf_tokens": theirs,
        "text": tok.decode(theirs),
        "equal": ours == theirs,
    }


def run_train_stage(ws: Workspace, base: Path, *, out) -> dict:
    """The stage (module docstring); returns its numbers, `exit_code` 1 when a check failed."""
    t0 = time.perf_counter()
    folder = (Path(base) / FOLDER).resolve()
    shutil.rmtree(folder, ignore_errors=True)  # an earlier demo's run would resume instead of training
    folder.mkdir(parents=True)
    files = {k: folder / n for k, n in (("pretrained", "pretrained"), ("train", "train.jsonl"), ("val", "val.jsonl"),
                                        ("run", "run"), ("exported", "exported"), ("log", "train.log"))}  # fmt: skip
    result: dict = {"folder": str(folder), **{k: str(v) for k, v in files.items()}, "steps": STEPS}
    out.print("\n[bold]train your model[/]: the proved recipe from a pretrained checkpoint on JSONL data")
    try:
        texts = corpus(TRAIN_ROWS, seed=1)
        write_jsonl(files["train"], texts)
        cfg = load_config(ws.recipe_path, [])
        # one intra-op thread for the stage's own work (writing the checkpoint, generating): on a small CPU
        # shared with other work, a greedy generation of the debug model took 14 s with two threads, 0.3 s with one
        with process_threads(1):
            written = write_pretrained(cfg, files["pretrained"], texts)
        # VALIDATION_BATCHES global batches of the recipe (its batch_size: one process's, or the
        # global batch split over the ranks, train_command), a quarter more for uneven rank shards
        need = VALIDATION_BATCHES * cfg.training.batch_size * (cfg.training.seq_len + 1) * 5 // 4
        val = write_jsonl(files["val"], held_out(written["tokenizer"], need))
        result["rows"] = {"train": TRAIN_ROWS, "val": len(val.read_text(encoding="utf-8").splitlines())}
        out.log(f"demo: wrote {files['pretrained']} ({', '.join(written['files'])}), {files['train']} and "
                f"{files['val']} ({result['rows']['train']} and {result['rows']['val']} rows)")  # fmt: skip
        # the export holds the run's dtype (a bf16 recipe's is half the fp32 checkpoint): 2 shards of it
        exported_bytes = written["bytes"] * DTYPES[cfg.training.dtype].itemsize // 4
        shard_mb = max(1, math.ceil(exported_bytes * 0.6 / 1e6))
        extra = overrides(files, shard_mb)
        argv = train_command(ws, extra)
        result["command"] = shlex.join(["python", *argv[1:]])
        out.log(f"demo: {result['command']}")
        code = run_training(argv, ws.root, files["log"], out)
        if code != 0:
            tail = files["log"].read_text(encoding="utf-8").splitlines()[-15:]
            raise StageFailed(f"the training run exited {code}; the end of {files['log']}:\n" + "\n".join(tail))
        train, val = read_metrics(files["run"] / "metrics.jsonl")
        result.update(step1_loss=train[0]["loss"], final_loss=train[-1]["loss"], losses=train, val_losses=val)
        result["export_files"] = sorted(p.name for p in files["exported"].iterdir())
        with process_threads(1):
            result["generation"] = generation = check_generation(load_config(ws.recipe_path, extra), files)
        if not generation["equal"]:
            raise StageFailed(
                f"greedy generation differs: titan_core's last checkpoint {generation['titan_tokens']}, "
                f"transformers' reload of {files['exported']} {generation['hf_tokens']}"
            )
    except StageFailed as e:
        result.update(error=str(e), exit_code=EXIT_FAILED, wall_s=round(time.perf_counter() - t0, 1))
        out.print(f"[bold red]demo train stage failed[/]: {escape(str(e))}")
        return result
    result.update(exit_code=0, wall_s=round(time.perf_counter() - t0, 1), next=next_commands(ws, base))
    for line in summary_lines(result):
        out.print(line, markup=False, soft_wrap=True)  # paths and commands stay whole, to copy
    return result


def next_commands(ws: Workspace, base: Path) -> list[str]:
    """What a user runs for their own model."""
    d = shlex.quote(str(base))
    return [
        "onboard new-model NAME --hf-config YOUR_MODEL/config.json --weights YOUR_MODEL --dir DIR",
        "onboard next-step NAME --dir DIR   # until the ladder is complete",
        "onboard recipe NAME --dir DIR      # prints the command that continues training from your checkpoint "
        "on your data",
        f"onboard recipe {ws.name} --dir {d}   # the demo's",
    ]


def summary_lines(r: dict) -> list[str]:
    g = r["generation"]
    val = ", ".join(f"step {v['step']} {v['loss']:.4f}" for v in r["val_losses"])
    return [
        f"step-1 loss:       {r['step1_loss']:.4f}  (from {r['pretrained']})",
        f"final train loss:  {r['final_loss']:.4f}  (step {r['steps']})",
        f"validation loss:   {val}",
        f"metrics:           {Path(r['run']) / 'metrics.jsonl'}",
        f"export:            {r['exported']}  ({', '.join(r['export_files'])})",
        f"generation equal:  {'yes' if g['equal'] else 'no'}  (greedy after {g['prompt']!r}: {g['text']!r}; "
        f"transformers' reload = titan_core's checkpoint)",
        f"train stage wall time: {r['wall_s']:.1f} s",
        "for your own model:",
        *(f"  {c}" for c in r["next"]),
    ]
