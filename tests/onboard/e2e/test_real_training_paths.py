"""A workspace's recipe trains the user's model on the port and transformers paths (issue 34, "the same
on the port and transformers paths").

`onboard new-model NAME --hf-config config.json --path port|transformers` on a tiny Llama that
transformers' `save_pretrained` wrote in 2 shards; then the workspace's recipe through titan_core's
entry point (`titan_core.train.main`, what `python -m titan_core.train` runs) on 2 gloo ranks under
SimpleFSDP, starting from that checkpoint (`checkpoint.initial_hf`), reading a JSONL corpus through
the model's own tokenizer (`data.source = "dataset"`, `data.tokenizer = "hf"`) and validating on a
held-out one. The port's model.py and adapter.py and the transformers path's own class both:

- give transformers' step-1 loss on the run's global batch (both ranks' rows), within the parity bound;
- log a validation loss every `validation.freq` steps (and at the last);
- export a sharded folder that AutoModelForCausalLM reloads and that generates, greedily, the tokens
  the trained model (its last checkpoint) generates;
- resumed from the step-2 checkpoint, continue every rank's token stream and reach the same weights,
  bit for bit.

tests/core/dist/test_hf_weights_two_ranks.py and test_dataset_ranks.py prove the same for the native
family piece by piece; this is the user's whole run, once per path.
"""

from __future__ import annotations

import io
import json
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
from hang_guard import guarded_launch
from safetensors.torch import load_file
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "core"))  # the tiny checkpoint and data helpers
from hf_data import doc_text, write_jsonl, write_tokenizer  # noqa: E402
from hf_tiny import hf_greedy, hf_loss, titan_greedy, write_tiny_llama  # noqa: E402
from tiny_flags import tiny_run_flags  # noqa: E402

from onboard.cli.app import app  # noqa: E402
from onboard.parity.criteria import threshold  # noqa: E402
from titan_core.config import load_config  # noqa: E402
from titan_core.data import build_data_loader  # noqa: E402
from titan_core.training.checkpoint import load_model_weights  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402

pytestmark = [pytest.mark.whole_machine, pytest.mark.hf, pytest.mark.slow]  # ranks meet at every collective

STEPS, FREQ, RESUME_AT = 4, 2, 2
VOCAB = 512
"""The tiny Llama's vocabulary (hf_tiny.SIZES): the WordLevel tokenizer of hf_data fits in it."""

WORKER = """
import json, shutil, sys
import torch, torch.distributed as dist
from titan_core.runtime import distributed
from titan_core.train import main

runs = json.loads(sys.argv[1])
# one process group for both runs (main joins a group that exists): each launch costs every rank seconds
with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
    if main(runs["straight"]) != 0:
        sys.exit(1)
    if state.rank == 0:  # a folder holding only the step-2 checkpoint, so the second run resumes there
        shutil.copytree(*runs["copy"])
    dist.barrier()
    if main(runs["resumed"]) != 0:
        sys.exit(1)
"""


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The user's checkpoint (2 shards), its tokenizer, a training corpus and a held-out one."""
    root = tmp_path_factory.mktemp("real_run")
    ckpt = write_tiny_llama(root / "llama")
    write_tokenizer(ckpt)  # tokenizer.json and tokenizer_config.json beside the weights, as a hub folder has them
    train = write_jsonl(root / "train.jsonl", [{"text": doc_text(i)} for i in range(40)])
    val = write_jsonl(root / "val.jsonl", [{"text": doc_text(i)} for i in range(200, 212)])
    return root, ckpt, train, val


def _flags(ckpt: Path, train: Path, val: Path, out: Path) -> list[str]:
    return [
        f"--checkpoint.initial_hf={ckpt}",
        "--data.source=dataset", f"--data.path={train}", "--data.tokenizer=hf", f"--data.tokenizer_path={ckpt}",
        "--validation.enable", f"--validation.path={val}", f"--validation.freq={FREQ}", "--validation.steps=2",
        "--parallelism.data_parallel=simple_fsdp",
        "--checkpoint.enable", f"--checkpoint.interval={RESUME_AT}", "--checkpoint.export_hf=export",
        "--checkpoint.export_shard_mb=1",
        *tiny_run_flags(out, steps=STEPS, batch_size=1),  # 1 row per rank: a global batch of 2
    ]  # fmt: skip


@pytest.fixture(scope="module", params=["port", "transformers"])
def run(request, sources):
    """The workspace of one path, its recipe trained straight and resumed (one launch of 2 ranks)."""
    root, ckpt, train, val = sources
    name = f"user_{request.param}"
    made = CliRunner().invoke(app, ["new-model", name, "--hf-config", str(ckpt / "config.json"),
                                    "--path", request.param, "--dir", str(root), "--device", "cpu"])  # fmt: skip
    assert made.exit_code == 0, made.output
    ws = root / "onboarding" / name
    if request.param == "port":  # the port is its own model.py, read by its own adapter.py
        assert 'module_file = "model.py"' in (ws / "recipe.toml").read_text() and (ws / "model.py").is_file()
    out = root / f"{request.param}_runs"
    straight, resumed = out / "straight", out / "resumed"
    recipe, step = ["--config", str(ws / "recipe.toml")], f"checkpoints/step-{RESUME_AT}"
    runs = {
        "straight": [*recipe, *_flags(ckpt, train, val, straight)],
        "resumed": [*recipe, *_flags(ckpt, train, val, resumed)],
        "copy": [str(straight / step), str(resumed / step)],
    }
    result = guarded_launch([sys.executable, "-c", WORKER, json.dumps(runs)], 2, 300,
                            f"the {request.param} workspace's recipe on 2 ranks", log_dir=out / "logs")  # fmt: skip
    assert result.exit_code == 0, result.failure
    logs = [(out / "logs" / f"rank_{r}.log").read_text() for r in range(2)]
    return {"path": request.param, "ws": ws, "ckpt": ckpt, "straight": straight, "resumed": resumed,
            "argv": runs["straight"], "log": logs}  # fmt: skip


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _cfg(argv: list[str], *extra: str):
    """The run's config as the entry point read it (`--config RECIPE FLAGS...`), `extra` last."""
    return load_config(argv[1], [*argv[2:], *extra])


def test_step1_loss_is_transformers_on_the_global_batch(run):
    cfg = _cfg(run["argv"])
    assert cfg.model.family == ("llama3" if run["path"] == "port" else "transformers")
    assert cfg.model.adapter_file == str(run["ws"] / "adapter.py")
    assert cfg.model.module_file == (str(run["ws"] / "model.py") if run["path"] == "port" else "")
    # the rows each rank drew at step 1: its own shard of the corpus through the checkpoint's tokenizer
    batches = [next(build_data_loader(cfg, vocab_size=VOCAB, dp_rank=r, dp_world=2)) for r in range(2)]
    tokens, labels, segments = (
        torch.cat([getattr(b, k) for b in batches]) for k in ("tokens", "labels", "segment_ids")
    )
    assert not torch.equal(batches[0].tokens, batches[1].tokens)
    assert segments.amax() > 0  # packed documents: transformers runs each on its own, as the packed step attends
    want = hf_loss(run["ckpt"], tokens, labels, segments)
    got = _rows(run["straight"])[0]["loss"]
    assert abs(got - want) <= threshold("loss_abs_diff"), (run["path"], got, want)
    assert f"loaded initial weights from {run['ckpt']} (" in run["log"][0]


def test_validation_loss_every_freq_steps(run):
    rows = _rows(run["straight"])
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    validated = [r["step"] for r in rows if r.get("val_loss") is not None]
    assert validated == [s for s in range(1, STEPS + 1) if s % FREQ == 0 or s == STEPS] == [2, 4]
    for r in rows:
        if r["step"] in validated:
            assert 0 < r["val_loss"] < 10 and r["val_tokens"] > 0, r
    assert rows[-1]["val_loss"] < rows[1]["val_loss"]  # lr 3e-3 on the held-out words the corpus shares


def test_sharded_export_reloads_and_generates_as_the_trained_model(run):
    export = run["straight"] / "export"
    stored = sorted(p.name for p in export.glob("*.safetensors"))
    assert stored == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert {"config.json", "model.safetensors.index.json", "tokenizer.json"} <= {p.name for p in export.iterdir()}
    # the trained model: the workspace's model in one process, holding the run's last checkpoint
    one = _cfg(run["argv"], "--parallelism.data_parallel=none", "--checkpoint.enable=false",
               f"--metrics.output_dir={run['straight'].parent / 'one'}")  # fmt: skip
    trained = Trainer(one, quiet=True).model
    initial = titan_greedy(trained)
    load_model_weights(run["straight"] / "checkpoints" / f"step-{STEPS}", trained)
    greedy = titan_greedy(trained)
    assert greedy != initial  # 4 steps at lr 3e-3 changed what it generates: the export is the trained model
    assert hf_greedy(export) == greedy


def _loader_state(step_dir: Path, rank: int):
    """The data loader position rank `rank` saved in a checkpoint, tensors (its packing buffer) as lists."""
    import torch.distributed.checkpoint as dcp

    key = f"rank_{rank}"
    state = {"ranks": {key: b""}}
    with warnings.catch_warnings():  # one process reading a 2-rank checkpoint is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=step_dir)
    saved = torch.load(io.BytesIO(state["ranks"][key]), weights_only=True)["data_loader"]
    return json.loads(json.dumps(saved, default=lambda t: t.tolist()))


def test_a_resumed_run_continues_the_same_token_stream(run):
    straight, resumed = _rows(run["straight"]), _rows(run["resumed"])
    assert [r["step"] for r in resumed] == list(range(RESUME_AT + 1, STEPS + 1))
    for got, want in zip(resumed, straight[RESUME_AT:]):
        assert (got["loss_repr"], got["grad_norm_repr"]) == (want["loss_repr"], want["grad_norm_repr"])
        assert got.get("val_loss") == want.get("val_loss")
    assert re.search(rf"resumed from step {RESUME_AT} \(checkpoint.initial_hf .* not loaded", run["log"][0])
    last = f"checkpoints/step-{STEPS}"
    data = [[_loader_state(out / last, r) for r in range(2)] for out in (run["straight"], run["resumed"])]
    assert data[0] == data[1]  # each rank stopped at the same place in its stream
    assert data[0][0]["rows_read"] > 0 and data[0][0] != data[0][1]
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        a, b = (load_file(out / "export" / name) for out in (run["straight"], run["resumed"]))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
