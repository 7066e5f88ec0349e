"""Activation checkpointing's policies side by side: what the forward keeps for the backward, the step's
peak, the step time against no checkpointing, and the numerics.

Per shape (the demo's llama3 debugmodel at seq 1024; a 2-layer slice of Llama 3 8B's widths: dim 4096,
32 heads, 8 KV heads, MLP 14336, at seq 1024 with an 8192-token vocabulary so that its embedding does not
dwarf the two blocks), one process builds a Trainer per policy (`[activation_checkpoint]`: none, full,
selective op, selective layer with period 2), fp32, one process, batch 1, and measures:

- kept_after_forward: the bytes of tensors the forward leaves alive for the backward (titan_core's
  TensorPeak over `model.loss`: what it allocated and still holds at its end), the loss included;
  `saved_fraction` = 1 - kept / kept under none (full: >= 0.6 expected);
- step_peak: the most tensor bytes alive at once during forward + backward (TensorPeak);
- numerics: each policy's loss and every gradient of the same batch against none, bit for bit;
- time: one forward + backward per sample, each policy against none, interleaved
  (titan_core.measure.timing.compare: ratio with its 99% interval).

    nice python bench/activation_checkpoint.py [--shapes demo,slice8b] [--min-rounds N --max-rounds N] [--out FILE]

(`--shapes tiny`: a smoke run.)

Prints one JSON document on stdout; progress on stderr.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import _report  # noqa: E402

SHAPES = {
    "tiny": {"overrides": "{n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, vocab_size = 256}", "seq": 128},
    "demo": {"overrides": "{}", "seq": 1024},
    "slice8b": {"overrides": _report.SLICE_8B, "seq": 1024},
}
POLICIES = {
    "none": [],
    "full": ["--activation_checkpoint.mode=full"],
    "selective_op": ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective=op"],
    "selective_layer_2": ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective=layer",
                          "--activation_checkpoint.layer_period=2"],
}  # fmt: skip


def run_shape(shape: str, protocol, work: str) -> dict:
    import torch

    from titan_core.measure.timing import compare
    from titan_core.memory.tensor_peak import TensorPeak
    from titan_core.training.trainer import Trainer

    spec = SHAPES[shape]

    def build(name: str) -> Trainer:
        return _report.one_process_trainer(spec["overrides"], spec["seq"], f"{work}/{shape}_{name}", *POLICIES[name])

    def forward_backward(trainer: Trainer) -> dict:
        model = trainer.model
        model.zero_grad(set_to_none=True)
        with TensorPeak() as fwd:
            loss, _ = model.loss(batch.tokens, batch.labels, **batch.loss_kwargs())
        kept = fwd.live_bytes
        with TensorPeak() as bwd:
            loss.backward()
        return {"loss": loss.item(), "kept": kept, "backward_peak": bwd.peak_bytes}

    def sample(trainer: Trainer):
        def one() -> float:
            model = trainer.model
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            loss, _ = model.loss(batch.tokens, batch.labels, **batch.loss_kwargs())
            loss.backward()
            return time.perf_counter() - start

        return one

    # one policy beside none at a time (every model built from the same seed: the same weights)
    none = build("none")
    batch = next(none.data)
    _report.progress(f"{shape}: none")
    base = forward_backward(none)
    want = {n: p.grad.clone() for n, p in none.model.named_parameters()}
    out = {"shape": shape, "seq": spec["seq"], "policies": {}, "comparisons": []}
    for name in POLICIES:
        trainer = none if name == "none" else build(name)
        _report.progress(f"{shape}: {name}")
        r = base if name == "none" else forward_backward(trainer)
        out["policies"][name] = {
            "checkpointed_blocks": trainer.checkpointed,
            "kept_after_forward": r["kept"],
            "saved_fraction": round(1 - r["kept"] / base["kept"], 4),
            "step_peak": r["kept"] + r["backward_peak"],
            "loss_bit_identical": r["loss"] == base["loss"],
            "grads_bit_identical": all(torch.equal(p.grad, want[n]) for n, p in trainer.model.named_parameters()),
        }
        if name != "none":
            _report.progress(f"{shape}: timing {name} against none")
            cmp = compare(sample(trainer), sample(none), protocol)
            out["comparisons"].append(_report.entry(cmp, name, "none", shape=shape))
            del trainer
    return out


def main() -> None:
    report, a = _report.by_shape("activation_checkpoint", __doc__, "demo,slice8b", run_shape)
    report["full_saves_at_least_60_percent"] = all(s["policies"]["full"]["saved_fraction"] >= 0.6
                                                   for s in report["shapes"])  # fmt: skip
    report["bit_identical"] = all(p["loss_bit_identical"] and p["grads_bit_identical"]
                                  for s in report["shapes"] for p in s["policies"].values())  # fmt: skip
    _report.emit(report, a.out)


if __name__ == "__main__":
    main()
