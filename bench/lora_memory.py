"""LoRA against full fine-tuning: what trains, what the optimizer keeps, a step's peak and a step's time.

Per shape (a 2-layer slice of Llama 3 8B's widths: dim 4096, 32 heads, 8 KV heads, MLP 14336, with an
8192-token vocabulary so that the embedding and head do not dwarf the two blocks, at seq 256, batch 1),
one process builds two Trainers from the same seed, fp32, one process: full fine-tuning, and `[lora]`
rank 16 (alpha 32) on every projection of attention and MLP (q, k, v, o, gate, up, down), and measures:

- trainable parameters (those the optimizer holds);
- optimizer-state bytes after the first step (AdamW's two moments; the step counters included);
  `state_fraction` = LoRA's over full fine-tuning's (the target: <= 0.02);
- step_peak_bytes: the tensors held before the first step (parameters) plus the most a first whole
  step allocates at once (gradients, activations, the optimizer's state as it is made: TensorPeak);
- time: whole training steps, LoRA against full, interleaved (titan_core.measure.timing.compare: the
  ratio with its 99% interval).

    nice python bench/lora_memory.py [--shapes slice8b] [--min-rounds N --max-rounds N] [--out FILE]

(`--shapes tiny`: a smoke run.) About 9 GiB and a few minutes of one CPU core for slice8b.

Prints one JSON document on stdout; progress on stderr.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import _report  # noqa: E402

SHAPES = {
    "tiny": {"overrides": "{n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, vocab_size = 256}", "seq": 64},
    "slice8b": {"overrides": _report.SLICE_8B, "seq": 256},
}
RANK = 16
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
RUNS = {
    "full": [],
    "lora": ["--lora.enable", f"--lora.rank={RANK}", f"--lora.alpha={2 * RANK}", f"--lora.target_modules={TARGETS}"],
}
STATE_TARGET = 0.02
"""The issue's bound on LoRA's optimizer state as a fraction of full fine-tuning's."""


def run_shape(shape: str, protocol, work: str) -> dict:
    from titan_core.measure.timing import compare
    from titan_core.memory.tensor_peak import TensorPeak, held_tensor_bytes
    from titan_core.training.trainer import Trainer

    spec = SHAPES[shape]

    def build(name: str) -> Trainer:
        return _report.one_process_trainer(spec["overrides"], spec["seq"], f"{work}/{shape}_{name}", *RUNS[name])

    def first_step(trainer: Trainer) -> dict:
        held = held_tensor_bytes(trainer.model)
        with TensorPeak() as step:
            trainer.step += 1
            trainer.train_step()
        state = sum(t.numel() * t.element_size() for s in trainer.optimizer.state.values() for t in s.values()
                    if hasattr(t, "numel"))  # fmt: skip
        trainable = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"])
        return {"trainable_params": trainable, "params": sum(p.numel() for p in trainer.model.parameters()),
                "optimizer_state_bytes": state, "step_peak_bytes": held + step.peak_bytes}  # fmt: skip

    def sample(trainer: Trainer):
        def one() -> float:
            trainer.step += 1
            return trainer.train_step()["step_time_s"]

        return one

    trainers, out = {}, {"shape": shape, "seq": spec["seq"], "runs": {}}
    for name in RUNS:
        _report.progress(f"{shape}: {name}")
        trainers[name] = build(name)
        out["runs"][name] = first_step(trainers[name])
    full, lora = out["runs"]["full"], out["runs"]["lora"]
    out["state_fraction"] = round(lora["optimizer_state_bytes"] / full["optimizer_state_bytes"], 6)
    out["trainable_fraction"] = round(lora["trainable_params"] / full["trainable_params"], 6)
    out["peak_fraction"] = round(lora["step_peak_bytes"] / full["step_peak_bytes"], 4)
    _report.progress(f"{shape}: timing lora against full")
    cmp = compare(sample(trainers["lora"]), sample(trainers["full"]), protocol)
    out["comparisons"] = [_report.entry(cmp, "lora", "full", shape=shape)]
    return out


def main() -> None:
    report, a = _report.by_shape("lora_memory", __doc__, "slice8b", run_shape, rank=RANK, targets=TARGETS.split(","))
    report["state_within_target"] = all(s["state_fraction"] <= STATE_TARGET for s in report["shapes"])
    _report.emit(report, a.out)


if __name__ == "__main__":
    main()
