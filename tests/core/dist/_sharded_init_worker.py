"""One rank of the sharded-init test: `python _sharded_init_worker.py all OUT PORT_FILE HF_DIR`.

Started by _world.launch (2 gloo ranks). For every case (a path and a parallelism),
builds the Trainer (on meta, parallelised there, only this rank's shards made real and
initialised: titan_core/parallel/sharded_init.py) and the one-process model of the same config
(materialised whole, `init_weights(seed)`, cast: the init every gate compares against), gathers
each sharded parameter and compares the two bit for bit. Then the memory case: the resident set a
wider model's sharded build adds, against the one-process build of the same model. Writes
OUT/rank_<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from _cases import flux_cfg, tiny_cfg  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from titan_core.config.dtypes import DTYPES  # noqa: E402
from titan_core.parallel.regather import GatheredBytes  # noqa: E402
from titan_core.runtime import devices, distributed  # noqa: E402
from titan_core.models.model_builder import build_model_from_config  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402

WIDE = ("--model.overrides={n_layers=16, dim=512, n_heads=8, n_kv_heads=4, head_dim=64, ffn_hidden_dim=1024, "
        "vocab_size=4096}")  # fmt: skip
"""About 38M parameters (152 MB in fp32), none over 8.4 MB: what a rank adds by building it shows
whether it held the whole model or its half."""


def cases(out: Path, port: str, hf_dir: Path) -> dict:
    hf = lambda name: ("--model.family=transformers", f"--model.hf_config={hf_dir / name}")  # noqa: E731
    return {
        "native_simple_fsdp": tiny_cfg("llama3", out / "a"),
        "native_fsdp2": tiny_cfg("llama3", out / "b", "--parallelism.data_parallel=fsdp2"),
        "native_tp": tiny_cfg("qwen3", out / "c", "--parallelism.tp=2", "--parallelism.sequence_parallel"),
        "native_ep": tiny_cfg("qwen3_moe", out / "d", "--parallelism.ep=2"),
        "native_cp": tiny_cfg("glimmer", out / "e", "--parallelism.cp=2"),
        "native_pp": tiny_cfg("llama3", out / "f", "--parallelism.pp=2", "--training.grad_accum=2"),
        "native_bf16": tiny_cfg("llama3", out / "g", "--training.dtype=bfloat16",
                                "--training.mixed_precision_param=bfloat16"),  # fmt: skip
        "port_simple_fsdp": tiny_cfg("llama3", out / "h", f"--model.module_file={port}"),
        "port_fsdp2": tiny_cfg("llama3", out / "i", f"--model.module_file={port}", "--parallelism.data_parallel=fsdp2"),
        "transformers_simple_fsdp": _hf(tiny_cfg("llama3", out / "j", *hf("llama_tied.json"))),
        "transformers_fsdp2": _hf(tiny_cfg("llama3", out / "k", *hf("gpt2.json"), "--parallelism.data_parallel=fsdp2")),
        "transformers_ep": _hf(tiny_cfg("llama3", out / "l", *hf("qwen3_moe.json"), "--parallelism.ep=2")),
        "flux_simple_fsdp": flux_cfg(out / "m"),
        "flux_fsdp2": flux_cfg(out / "n", "--parallelism.data_parallel=fsdp2"),
    }


def _hf(cfg):
    cfg.model.overrides = {}
    return cfg


def one_process(cfg) -> dict[str, torch.Tensor]:
    """The one-process init of `cfg`'s model: whole, initialised from the seed, cast to the training dtype."""
    _, _, model = build_model_from_config(cfg.model)
    model.to_empty(device="cpu")
    model.init_weights(seed=cfg.training.seed)
    return dict(model.to(DTYPES[cfg.training.dtype]).named_parameters())


def compare(cfg, train: bool = False) -> dict:
    """The built model's gathered parameters against the one-process init; `train`: then the 2 steps of its
    run without activation checkpointing (`curve`'s "none", from this trainer: the config is the same)."""
    trainer = Trainer(cfg, quiet=True)
    want = one_process(cfg)
    unequal, compared = [], 0
    for name, p in trainer.model.named_parameters():
        got = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        compared += 1
        if got.dtype != want[name].dtype or not torch.equal(got, want[name]):
            unequal.append(name)
    record = trainer.sharded_init
    res = {"compared": compared, "unequal": unequal, "peak_full_bytes": record.peak_full_bytes,
           "budget_bytes": record.budget_bytes, "largest_param_bytes": max(t.numel() * 4 for t in want.values()),
           "whole_bytes": sum(t.numel() * 4 for t in want.values())}  # fmt: skip
    if train:
        assert cfg.activation_checkpoint.mode == "none" and cfg.activation_checkpoint.selective == "op"
        res["ac_none"] = _train(trainer)
    trainer.close()
    return res


def rss_rise(build) -> int:
    """The most the resident set rose above its level before `build()` ran, in bytes (VmHWM)."""
    before = _rss()
    devices.reset_peak_memory(torch.device("cpu"))
    kept = build()
    rise = devices.peak_memory_bytes(torch.device("cpu")) - before
    del kept
    return rise


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def memory(out: Path) -> dict:
    cfg = tiny_cfg("llama3", out / "wide", WIDE, "--training.seq_len=16", batch_size=1)

    def sharded():
        trainer = Trainer(cfg, quiet=True)
        own = sum(p.to_local().numel() * 4 for p in trainer.model.parameters())
        return trainer, own, trainer.sharded_init.budget_bytes

    def whole():
        params = one_process(cfg)
        holder["whole_bytes"] = sum(t.numel() * 4 for t in params.values())
        return params

    holder = {}
    sharded_rise = rss_rise(lambda: holder.setdefault("s", sharded()))
    trainer, own, budget = holder.pop("s")
    trainer.close()
    whole_rise = rss_rise(whole)
    whole_bytes = holder["whole_bytes"]
    return {"sharded_rise": sharded_rise, "whole_rise": whole_rise, "own_bytes": own, "budget_bytes": budget,
            "whole_bytes": whole_bytes}  # fmt: skip


AC_CASES = ("native_simple_fsdp", "native_fsdp2", "native_tp", "native_ep", "native_cp", "native_pp",
            "transformers_simple_fsdp", "transformers_fsdp2", "flux_simple_fsdp")  # fmt: skip
"""The cases also trained with [activation_checkpoint] (full and selective op) against without it (the
trainer whose init `compare` checked, trained on)."""


def curve(cfg, mode: str, selective: str = "op") -> list[list[float]]:
    cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective = mode, selective
    cfg.metrics.output_dir = f"{cfg.metrics.output_dir}_{mode}_{selective}"
    trainer = Trainer(cfg, quiet=True)
    rows = _train(trainer)
    trainer.close()
    return rows


def _train(trainer: Trainer, steps: int = 2) -> list[list[float]]:
    rows = []
    for _ in range(steps):
        trainer.step += 1
        row = trainer.train_step()
        rows.append([row["loss"], row["grad_norm"]])
    return rows


REGATHER_CASES = ("native_simple_fsdp", "native_ep", "native_bf16", "transformers_simple_fsdp",
                  "flux_simple_fsdp")  # fmt: skip
"""The cases also trained with parallelism.reshard_after_forward against without it."""
FOUR_LAYERS = {"n_layers": 4, "dim": 128, "ffn_hidden_dim": 256}


def regather(cfg, reshard: bool, steps: int = 2) -> dict:
    """2 steps with and without reshard_after_forward: each step's loss, grad norm and the most bytes of
    gathered weights alive at once (regather.GatheredBytes)."""
    cfg.parallelism.reshard_after_forward = reshard
    cfg.metrics.output_dir = f"{cfg.metrics.output_dir}_regather_{reshard}"
    if cfg.model.family != "transformers" and cfg.model.family != "flux":
        cfg.model.overrides = {**cfg.model.overrides, **FOUR_LAYERS}  # the 4-layer model of the check
    trainer = Trainer(cfg, quiet=True)
    rows, peaks = [], []
    for _ in range(steps):
        trainer.step += 1
        with GatheredBytes() as gathered:
            row = trainer.train_step()
        rows.append([row["loss"], row["grad_norm"]])
        peaks.append(gathered.peak_bytes)
    whole = sum(p.numel() * p.element_size() for p in trainer.model.parameters())  # this rank's shards
    trainer.close()
    return {"curve": rows, "peak_gathered": max(peaks), "shard_bytes": whole}


def main(out: Path, port: str, hf_dir: Path) -> None:
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        res = {name: compare(cfg, train=name in AC_CASES) for name, cfg in cases(out, port, hf_dir).items()}
        res["memory"] = memory(out) if sys.platform.startswith("linux") else {}  # /proc/self/status: Linux
        res["ac"] = {name: {"none": res[name].pop("ac_none")} for name in AC_CASES}
        for mode in ("full", "selective"):
            cfgs = cases(out / f"ac_{mode}", port, hf_dir)
            for name in AC_CASES:
                res["ac"][name][mode] = curve(cfgs[name], mode)
        res["regather"] = {name: {} for name in REGATHER_CASES}
        for flag in (False, True):
            cfgs = cases(out / f"rg_{flag}", port, hf_dir)
            for name in REGATHER_CASES:
                res["regather"][name][str(flag)] = regather(cfgs[name], flag)
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))  # argv[1]: the scenario, "all" (run_worker's form)
