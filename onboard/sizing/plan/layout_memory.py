"""Per-device memory of one training layout on a target: what a plan fits before anything runs.

    ps = ModelShape.from_model(meta_model, args)
    lay = Layout(dp_shard=64, ep=64)
    mem = device_memory(ps, lay, MemSetup(policy="none", data_parallel="fsdp2", seq_len=4096, ...), batch=2)
    mem.total, mem.phase, largest_batch(ps, lay, setup, budget)

The arithmetic is titan_core's one memory model (titan_core/memory/estimate.py, the one the trainer's
preflight refuses a run with): a layout and a MemSetup become its TrainSetup (`train_setup`), so what a
plan fits is what the trainer would let start. This module holds the search's side of it: the layout
(titan_core's mesh: world = pp x dp_replicate x dp_shard x cp x tp, ep carved from dp_shard x cp), the
data-parallel kinds a plan names, and the largest batch that fits. Every moment of the estimate is
linear in the batch, so the largest batch is solved, not searched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from titan_core.memory import estimate as est
from titan_core.memory.activations import loss_bytes
from titan_core.memory.estimate import INTERLEAVE, SCHEDULES, MemoryEstimate, ModelShape, TrainSetup, estimate_memory

__all__ = ["INTERLEAVE", "SCHEDULES", "DeviceMemory", "Layout", "MemSetup", "REGATHERING", "REGATHERS",
           "device_memory", "largest_batch", "stage_layers", "stored_elements", "in_flight", "loss_head_bytes",
           "train_setup"]  # fmt: skip

MAX_BATCH = 4096
REGATHERING = "simple_fsdp_reshard"
"""The plan's name for SimpleFSDP with `parallelism.reshard_after_forward`: each gathered weight is
dropped after its forward and gathered again for its backward (titan_core/parallel/regather.py), so a
step holds a block or two gathered, as FSDP2 does, for a second all-gather per step. Plain
`simple_fsdp` keeps every gathered copy through the backward (autograd saves it for the matmul's)."""
REGATHERS = ("fsdp2", REGATHERING)
"""The data-parallel kinds that gather a block again for its backward."""
DeviceMemory = MemoryEstimate
"""Bytes on one device (the most loaded PP stage): the parts and the three moments."""


@dataclass(frozen=True)
class Layout:
    """One way to place the model on the target's devices (titan_core's parallelism section)."""

    dp_shard: int
    dp_replicate: int = 1
    tp: int = 1
    ep: int = 1
    cp: int = 1
    pp: int = 1
    pp_schedule: str = "1F1B"

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def edp(self) -> int:
        """Ranks each expert's shard is split over: dp_shard x cp / ep."""
        return self.dp_shard * self.cp // self.ep

    @property
    def kind(self) -> str:
        if self.tp > 1:
            return "TP x FSDP"
        return "HSDP" if self.dp_replicate > 1 else "FSDP"

    @property
    def name(self) -> str:
        if self.dp_replicate > 1:
            base = f"HSDP: shard {self.dp_shard} x replicate {self.dp_replicate}"
            base = f"TP {self.tp} x {base}" if self.tp > 1 else base
        else:
            base = f"TP {self.tp} x FSDP {self.dp_shard}" if self.tp > 1 else f"FSDP {self.dp_shard}"
        extra = [f"EP {self.ep}"] * (self.ep > 1) + [f"CP {self.cp}"] * (self.cp > 1)
        extra += [f"PP {self.pp} ({self.pp_schedule})"] * (self.pp > 1)
        return " x ".join([base, *extra])

    def degrees(self) -> dict[str, int | str]:
        return {"dp_shard": self.dp_shard, "dp_replicate": self.dp_replicate, "tp": self.tp, "ep": self.ep,
                "cp": self.cp, "pp": self.pp, "pp_schedule": self.pp_schedule}  # fmt: skip


@dataclass(frozen=True)
class MemSetup:
    """How a layout trains, as far as memory is concerned."""

    policy: str
    """none | default | full | offload: what the step saves (the Graph Trainer's memory policies; under eager
    or per-block compile, activation checkpointing's: default = selective op, full = full)."""
    data_parallel: str
    """fsdp2 | simple_fsdp | simple_fsdp_reshard (REGATHERING)."""
    seq_len: int
    grad_accum: int = 1
    """Microbatches per step (PP's microbatches under pp > 1)."""
    compute_dtype: str = "bfloat16"
    loss: str = "fused_ce"
    ce_chunk: int = 1024
    attention: str = "sdpa"
    moe: str = "grouped_mm"
    device_type: str = "tpu"
    mode: str = "eager"
    """eager | compile | graph_trainer (scan and split are the Graph Trainer's)."""


def train_setup(lay: Layout, s: MemSetup, *, batch: int) -> TrainSetup:
    """titan_core's TrainSetup of a layout trained as `s` at `batch` sequences per micro-batch: fp32 master
    weights and AdamW state, computing in `s.compute_dtype`, the data-parallel kind as titan_core runs it."""
    return TrainSetup(
        batch_size=batch, seq_len=s.seq_len, grad_accum=s.grad_accum, param_dtype="float32",
        compute_dtype=s.compute_dtype, reduce_dtype="float32", data_parallel="simple_fsdp" if s.data_parallel == REGATHERING else
        s.data_parallel, dp_shard=lay.dp_shard, dp_replicate=lay.dp_replicate, tp=lay.tp, ep=lay.ep, cp=lay.cp,
        pp=lay.pp, pp_schedule=lay.pp_schedule, reshard_after_forward=s.data_parallel == REGATHERING,
        mode=s.mode, memory_policy=s.policy, loss=s.loss, ce_chunk=s.ce_chunk, attention=s.attention, moe=s.moe,
        device_type=s.device_type, runtime_bytes=est.RUNTIME_BYTES.get(s.device_type, 0),
    )  # fmt: skip


def stage_layers(ps: ModelShape, pp: int) -> int:
    """Blocks on the most loaded stage: the layers split as evenly as they go."""
    return est.stage_layers(ps.n_layers, pp)


def stored_elements(ps: ModelShape, lay: Layout) -> int:
    """Parameters this rank stores (its shard of the most loaded stage)."""
    return est.stored_elements(ps, train_setup(lay, MemSetup("none", "fsdp2", 1), batch=1))


def in_flight(lay: Layout, microbatches: int) -> float:
    """Micro-batches whose activations the first stage holds at once under the layout's PP schedule."""
    return est.in_flight(train_setup(lay, MemSetup("none", "fsdp2", 1, grad_accum=microbatches), batch=1))


def loss_head_bytes(ps: ModelShape, lay: Layout, s: MemSetup, *, batch: int) -> tuple[int, int]:
    """(saved, transient) of the final norm and loss head for `batch` sequences on one rank, at the vocabulary
    one TP rank holds: fused_ce keeps one [ce_chunk, vocab / tp] fp32 chunk, plain [tokens, vocab / tp] logits."""
    t = train_setup(lay, s, batch=batch)
    seq = max(1, s.seq_len // lay.cp)
    return loss_bytes(est.tp_local(ps, lay.tp), replace(t, seq_len=seq), batch * seq)


def device_memory(ps: ModelShape, lay: Layout, s: MemSetup, *, batch: int) -> MemoryEstimate:
    """Bytes on the most loaded device of `lay` at `batch` sequences per micro-batch: titan_core's estimate."""
    return estimate_memory(ps, train_setup(lay, s, batch=batch))


def largest_batch(ps: ModelShape, lay: Layout, s: MemSetup, budget: int) -> tuple[int, MemoryEstimate]:
    """The largest batch in [1, MAX_BATCH] whose peak fits `budget`, and its memory (at batch 1 when none
    fits: 0). Every moment is a + b x batch, so it is solved from two evaluations; where a moment is not
    quite linear (a maximum of two linear terms, the loss head's chunk, integer rounding of the parts) and the
    solution does not fit, the largest batch below it that fits is searched for: every moment only grows with
    the batch, so a bracket (one batch that fits, one that does not) closes on it."""
    one, two = device_memory(ps, lay, s, batch=1), device_memory(ps, lay, s, batch=2)
    if one.total > budget:
        return 0, one
    best = MAX_BATCH
    for k in one.moments:
        slope = two.moments[k] - one.moments[k]
        if slope > 0:
            best = min(best, 1 + (budget - one.moments[k]) // slope)
    best = max(1, best)
    mem = device_memory(ps, lay, s, batch=best)
    if mem.total <= budget:
        return best, mem
    lo, lo_mem, hi, hi_mem = 1, one, best, mem  # lo fits, hi does not
    halve = False
    while hi - lo > 1:
        if halve:  # the interpolation did not halve the bracket last time: bisect
            guess = (lo + hi) // 2
        else:  # where the line through the bracket's ends meets the budget
            guess = lo + (budget - lo_mem.total) * (hi - lo) // (hi_mem.total - lo_mem.total)
        guess = min(max(guess, lo + 1), hi - 1)
        width = hi - lo
        mem = device_memory(ps, lay, s, batch=guess)
        if mem.total <= budget:
            lo, lo_mem = guess, mem
        else:
            hi, hi_mem = guess, mem
        halve = 2 * (hi - lo) > width
    return lo, lo_mem
