"""Loading a sharded HF checkpoint through `checkpoint.initial_hf` on 2 ranks under SimpleFSDP: wall time
against plain reading of the same bytes, and the memory each rank needs.

The bench writes a llama-shaped fp32 model (default: hidden 2048, 10 layers, vocab 32000, MLP 1024;
about 1.2 GB) with transformers' `save_pretrained` (max_shard_size 300MB) into a temp folder, then
starts 2 gloo ranks. Each rank builds the recipe's model as the Trainer does (on meta, then
materialised and sharded by SimpleFSDP; not initialised, since every value is then loaded) and
loads it with `initial_weights(cfg, meta_model)` (the header check) and `InitialWeights.load`
(titan_core/training/hf_load.py), `--rounds` times. Between rounds rank 0 alone reads every shard
with safetensors' `load_file` (the baseline: reading the bytes, one process, no conversion; as
`load_file` only maps the file, each tensor is copied out of the mapping, which is the read), while
rank 1 waits: the two are timed interleaved, in the same run.

- time: the header check (`initial_weights`, on meta) plus the load, timed from the barrier before
  it to the barrier after it (both ranks done), against the baseline's `load_file` of every shard;
  `time_ratio` = median (check + load) / median baseline (<= 2). Materialising and sharding the
  model (the Trainer's work before any load) is outside both.
- memory: each rank samples its resident set (/proc/self/statm, every 2 ms) during the first load.
  `rss_ratio` = (the rank's own shards' bytes + the load's peak over the resident set just before
  it) / the whole model's bytes: what the rank holds of the model at the load's peak (< 0.6; two
  ranks hold half the model each). Also reported: `load_delta_ratio` (the load's peak over the set
  before it alone), `since_model_ratio` (the peak over the set before the model was materialised,
  which also counts what the allocator kept from SimpleFSDP's sharding step) and `ru_maxrss_ratio`
  (the rank's lifetime peak: with the interpreter and torch, ~0.3 GB, and SimpleFSDP's sharding step).

    nice python bench/load_hf.py [--hidden 2048 --layers 10 --vocab 32000 --mlp 1024] [--rounds 3] [--out FILE]

Prints one JSON document on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _report  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Sampler:
    """The largest resident set seen while the `with` block runs."""

    def __enter__(self):
        self.peak, self.running = rss(), True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while self.running:
            self.peak = max(self.peak, rss())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, rss())


def write_checkpoint(folder: Path, a) -> int:
    """The llama-shaped fp32 checkpoint in shards of at most a.shard; returns its tensor bytes."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.hidden // 128,
        num_key_value_heads=max(1, a.hidden // 512), intermediate_size=a.mlp, vocab_size=a.vocab,
        max_position_embeddings=2048, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # random values, without transformers' slower init
            p.normal_(0.0, 0.02, generator=gen)
    model.save_pretrained(folder, max_shard_size=a.shard)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    return nbytes


def add_checkpoint_args(ap: argparse.ArgumentParser, *, hidden=2048, layers=10, vocab=32000, mlp=1024) -> None:
    """The written checkpoint's shape and shard size (`write_checkpoint` reads them), with these defaults."""
    ap.add_argument("--hidden", type=int, default=hidden)
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--vocab", type=int, default=vocab)
    ap.add_argument("--mlp", type=int, default=mlp, help="intermediate_size")
    ap.add_argument("--shard", default="300MB", help="save_pretrained's max_shard_size")


def worker(a) -> None:
    """One rank: `a.rounds` loads, with rank 0's baseline reads between them; writes rank_<r>.json."""
    import resource

    import torch
    import torch.distributed as dist

    from titan_core.config import load_config
    from titan_core.parallel import build_mesh, check_parallelism, parallelize
    from titan_core.runtime import distributed
    from titan_core.training.hf_load import initial_weights
    from titan_core.models.model_builder import build_model_from_config

    torch.set_num_threads(1)
    ckpt = Path(a.ckpt)
    cfg = load_config(None, [
        "--model.family=llama3", f"--model.hf_config={ckpt / 'config.json'}", f"--checkpoint.initial_hf={ckpt}",
        "--parallelism.data_parallel=simple_fsdp", "--device.type=cpu", "--training.dtype=float32",
        f"--metrics.output_dir={a.work}/run",
    ])  # fmt: skip
    shards = sorted(ckpt.glob("*.safetensors"))
    loads, baselines, memory = [], [], {}
    with distributed.process_group(torch.device("cpu"), timeout_s=600) as state:
        mesh = build_mesh(check_parallelism(cfg, state.world_size), "cpu")
        for k in range(a.rounds):
            before_model = rss()
            _, _, model = build_model_from_config(cfg.model)
            check_start = time.perf_counter()
            initial = initial_weights(cfg, model)  # the header check, on meta
            check_s = time.perf_counter() - check_start
            model.to_empty(device="cpu")  # as the Trainer: materialised, then sharded (each rank keeps its rows)
            parallelize(model, cfg, mesh)
            own = sum(t.to_local().numel() * t.element_size() for t in model.state_dict().values())
            before_load = rss()
            dist.barrier()
            start = time.perf_counter()
            with Sampler() as sampled:
                stats = initial.load(model)
            dist.barrier()
            load_s = time.perf_counter() - start
            loads.append({"seconds": check_s + load_s, "check_s": check_s, "load_s": load_s,
                          "bytes_read": stats.bytes_read})  # fmt: skip
            if k == 0:
                memory = {
                    "rss_before_model": before_model, "rss_before_load": before_load, "rss_peak_load": sampled.peak,
                    "own_shard_bytes": own,
                    "ru_maxrss_after_first_load": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                }  # fmt: skip
            del model, initial
            dist.barrier()
            if state.rank == 0:
                from safetensors.torch import load_file

                t0 = time.perf_counter()
                for shard in shards:
                    # load_file maps the file and reads nothing until a value is used: the copy out of
                    # the mapping is the read (what a load must do: the values end up in memory)
                    tensors = {k: v.clone() for k, v in load_file(str(shard)).items()}
                    del tensors
                baselines.append(time.perf_counter() - t0)
            dist.barrier()
            _report.progress({"rank": state.rank, "round": k, **loads[-1], "baseline_s": baselines[-1:]})
    out = {"rank": state.rank, "loads": loads, "baselines": baselines, **memory}
    (Path(a.work) / f"rank_{state.rank}.json").write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_args(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="", help="also write the JSON here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", default="", help=argparse.SUPPRESS)
    ap.add_argument("--write", default="", help=argparse.SUPPRESS)
    ap.add_argument("--work", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    if a.write:
        (Path(a.write) / "bench_bytes.json").write_text(json.dumps(write_checkpoint(Path(a.write), a)))
        return
    from titan_core.launcher import launch_command

    report = {"benchmark": "load_hf", "load_avg_1m": {"start": _report.load()}, "comparisons": []}
    with tempfile.TemporaryDirectory(prefix="load_hf_") as tmp:
        work, ckpt = Path(tmp), Path(tmp) / "ckpt"
        _report.progress(f"writing the checkpoint into {ckpt}")
        # in a process of its own: a child's ru_maxrss starts from its parent's peak (Linux keeps it across
        # fork and exec), so the ranks' would otherwise count the model this process built to write
        shape = [f"--{k}={getattr(a, k)}" for k in ("hidden", "layers", "vocab", "mlp", "shard")]
        subprocess.run([sys.executable, __file__, "--write", str(ckpt), *shape], check=True)
        model_bytes = json.loads((ckpt / "bench_bytes.json").read_text())
        files = sorted(p.name for p in ckpt.glob("*.safetensors"))
        report["checkpoint"] = {"model_bytes": model_bytes, "files": files, "max_shard_size": a.shard,
                                "shape": {k: getattr(a, k) for k in ("hidden", "layers", "vocab", "mlp")}}  # fmt: skip
        cmd = [sys.executable, __file__, "--worker", f"--ckpt={ckpt}", f"--work={work}", f"--rounds={a.rounds}"]
        launched = launch_command(cmd, 2, log_dir=work / "logs", timeout_s=1800)
        if launched.exit_code != 0:
            report["error"] = launched.failure
            _report.emit(report, a.out)
            sys.exit(1)
        ranks = [json.loads((work / f"rank_{r}.json").read_text()) for r in range(2)]
    load_s = statistics.median(x["seconds"] for x in ranks[0]["loads"])
    base_s = statistics.median(ranks[0]["baselines"])
    report["time"] = {
        "check_and_load_s": [round(x["seconds"], 3) for x in ranks[0]["loads"]],
        "header_check_s": [round(x["check_s"], 3) for x in ranks[0]["loads"]],
        "baseline_load_file_s": [round(x, 3) for x in ranks[0]["baselines"]],
        "time_ratio": round(load_s / base_s, 3),
        "time_ratio_bound": 2.0,
    }
    report["memory"] = [
        {
            "rank": r["rank"],
            "bytes_read": r["loads"][0]["bytes_read"],
            "rss_ratio": round((r["own_shard_bytes"] + r["rss_peak_load"] - r["rss_before_load"]) / model_bytes, 3),
            "load_delta_ratio": round((r["rss_peak_load"] - r["rss_before_load"]) / model_bytes, 3),
            "since_model_ratio": round((r["rss_peak_load"] - r["rss_before_model"]) / model_bytes, 3),
            "ru_maxrss_ratio": round(r["ru_maxrss_after_first_load"] / model_bytes, 3),
            **{k: r[k] for k in ("own_shard_bytes", "rss_before_model", "rss_before_load", "rss_peak_load",
                                 "ru_maxrss_after_first_load")},
        }
        for r in ranks
    ]
    report["rss_ratio_bound"] = 0.6
    report["ok"] = report["time"]["time_ratio"] <= 2.0 and all(m["rss_ratio"] < 0.6 for m in report["memory"])
    _report.emit(report, a.out)


if __name__ == "__main__":
    main()
