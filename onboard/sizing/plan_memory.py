"""Per-device memory of one training layout on a target: what a plan fits before anything runs.

    ps = PlanShape.from_model(meta_model, args)
    lay = Layout(dp_shard=64, ep=64)
    mem = device_memory(ps, lay, MemSetup(policy="none", data_parallel="fsdp2", seq_len=4096, ...), batch=2)
    mem.total, mem.phase, largest_batch(ps, lay, setup, budget)

The layout is titan_core's mesh (titan_core/parallel/mesh.py): world = pp x dp_replicate x
dp_shard x cp x tp, and expert parallelism carved from dp_shard x cp (`ep` divides it). Per device:

- stored: fp32 master weights, fp32 gradients and AdamW's two fp32 moments of this rank's shard.
  Decoder blocks outside the routed experts are split over tp and sharded over dp_shard x cp (CP
  ranks hold the same weights, so FSDP shards over both, as TorchTitan's dp_shard_cp mesh does);
  routed experts are split over ep and each expert sharded over the rest, dp_shard x cp / ep;
  under TP the embedding and output head are vocab-sharded over tp (titan_core's plan,
  titan_core/parallel/plans.py); PP keeps ceil(layers / pp) blocks on a stage, the
  embedding on the first and the head on the last;
- gathered: the bf16 copies a data-parallel step computes with. FSDP2 (one unit per block, the
  root unit kept through the step) holds about two blocks in flight, the one computing and the
  prefetched next, plus the root's embedding and head; experts gathered over their edp ranks
  only (1/ep of them). titan_core's SimpleFSDP keeps every gathered copy through the backward unless
  it re-gathers (`REGATHERING`: then as FSDP2); under PP a stage keeps its weights gathered across its microbatches
  (torch.distributed.pipelining turns FSDP's reshard and gradient sync off until the last one);
- activations: titan_core/memory/activations.py per token (the memory policy's saved tensors),
  on one TP rank's widths, for batch x seq/cp tokens (CP splits each sequence), over the stage's
  layers, times the microbatches its PP schedule holds in flight; the loss head at vocab/tp:
  fused_ce keeps one [ce_chunk, vocab/tp] fp32 chunk instead of [tokens, vocab/tp] logits; CP
  adds one layer's all-gathered K and V to the backward's transient.

The peak is the largest of three moments (as titan_core/memory/estimate.py): the forward/
backward turn, the optimizer step and the sharded materialisation. Every moment is linear in
the batch, so the largest batch that fits is solved, not searched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache

from torch import nn

from titan_core.memory.activations import DTYPE_BYTES, activation_bytes, loss_bytes
from titan_core.memory.estimate import ModelShape, TrainSetup, tp_local
from titan_core.models.common.param_counts import EXPERTS_CHILD

MAX_BATCH = 4096
REGATHERING = "simple_fsdp_reshard"
"""The plan's name for SimpleFSDP with `parallelism.reshard_after_forward`: each gathered weight is
dropped after its forward and gathered again for its backward (titan_core/parallel/regather.py), so a
step holds a block or two gathered, as FSDP2 does, for a second all-gather per step. Plain
`simple_fsdp` keeps every gathered copy through the backward (autograd saves it for the matmul's)."""
REGATHERS = ("fsdp2", REGATHERING)
"""The data-parallel kinds that gather a block again for its backward."""
SCHEDULES = ("1F1B", "interleaved1F1B", "gpipe")
INTERLEAVE = 2
"""Stages per rank under interleaved1F1B (titan_core: "interleaved1F1B puts 2 stages on each rank")."""


@dataclass(frozen=True)
class PlanShape:
    """The model as the planner splits it: titan_core's ModelShape plus where its parameters live."""

    base: ModelShape
    block_params: int
    """Parameters of every decoder block outside the routed experts (attention, norms, router, dense or shared MLP)."""
    expert_params: int
    """Parameters of every block's routed experts (0 for a dense model)."""
    embed_params: int
    head_params: int
    """The output head's parameters (0 when tied to the embedding)."""
    other_params: int
    """Outside the blocks, neither embedding nor head (the final norm)."""

    @property
    def n_layers(self) -> int:
        return self.base.n_layers

    @property
    def is_moe(self) -> bool:
        return self.expert_params > 0

    @classmethod
    def from_model(cls, model, args, shape: ModelShape | None = None) -> PlanShape:
        """Counts from the (meta) model: each block's routed experts are its modules' `experts` children
        (titan_core/models/common/param_counts.py's rule)."""
        shape = shape or ModelShape.from_model(model, args)
        routed: dict[int, int] = {}  # by identity: a container nested in another is counted once
        for block in model.layers.values():
            for module in block.modules():
                child = getattr(module, EXPERTS_CHILD, None)
                if isinstance(child, nn.Module):
                    routed.update((id(p), p.numel()) for p in child.parameters())
        experts = sum(routed.values())
        return cls._split(shape, experts, tied=args.tie_embeddings)

    @classmethod
    def from_shape(cls, shape: ModelShape) -> PlanShape:
        """From titan_core's ModelShape alone: the routed experts as the common MoE block builds them (w1, w2,
        w3 of dim x moe_hidden_dim per expert in each MoE layer), the head tied when the parameters outside
        the blocks hold one vocab x dim table only."""
        experts = shape.moe_layers * shape.n_experts * 3 * shape.dim * shape.moe_hidden_dim
        return cls._split(shape, experts, tied=shape.outside_blocks < 2 * shape.vocab_size * shape.dim)

    @classmethod
    def _split(cls, shape: ModelShape, experts: int, *, tied: bool) -> PlanShape:
        blocks = shape.params - shape.outside_blocks
        table = shape.vocab_size * shape.dim
        embed = min(shape.outside_blocks, table)
        head = 0 if tied else min(shape.outside_blocks - embed, table)
        return cls(shape, blocks - experts, experts, embed, head, shape.outside_blocks - embed - head)


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
    """none (the eager step) | default | full | offload (the Graph Trainer's memory policies)."""
    data_parallel: str
    """fsdp2 | simple_fsdp."""
    seq_len: int
    grad_accum: int = 1
    """Microbatches per step (PP's microbatches under pp > 1)."""
    compute_dtype: str = "bfloat16"
    loss: str = "fused_ce"
    ce_chunk: int = 1024
    attention: str = "sdpa"
    moe: str = "grouped_mm"
    device_type: str = "tpu"


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes on one device (the most loaded PP stage): the parts and the three moments."""

    params: int
    grads: int
    optimizer_state: int
    gathered_params: int
    activations: int
    activations_host: int
    backward_workspace: int
    optimizer_workspace: int
    forward_backward: int
    optimizer_step: int
    materialise: int

    @property
    def moments(self) -> dict[str, int]:
        return {"forward/backward turn": self.forward_backward, "optimizer step": self.optimizer_step,
                "materialise": self.materialise}  # fmt: skip

    @property
    def total(self) -> int:
        return max(self.moments.values())

    @property
    def phase(self) -> str:
        m = self.moments
        return max(m, key=m.get)


def stage_layers(ps: PlanShape, pp: int) -> int:
    """Blocks on the most loaded stage: the layers split as evenly as they go."""
    return math.ceil(ps.n_layers / pp)


def stored_elements(ps: PlanShape, lay: Layout) -> int:
    """Parameters this rank stores (its shard), on the most loaded stage (exact: one FSDP shard of everything
    it holds, rounded up once)."""
    frac = Fraction(stage_layers(ps, lay.pp), ps.n_layers)
    shard = lay.dp_shard * lay.cp
    return math.ceil((ps.block_params * frac + _ends(ps, lay.pp)) / (lay.tp * shard) + ps.expert_params * frac / shard)


def _ends(ps: PlanShape, pp: int) -> int:
    """Embedding, head and final norm on the stage that holds the most of them."""
    head = ps.head_params or ps.embed_params  # a tied head is the embedding, on the last stage too
    if pp == 1:
        return ps.embed_params + ps.head_params + ps.other_params
    return max(ps.embed_params, head + ps.other_params)


def gathered_bytes(ps: PlanShape, lay: Layout, data_parallel: str, compute_dtype: str) -> int:
    """The bf16 copies alive at once (module docstring): ~two blocks in flight or, under SimpleFSDP as
    titan_core runs it, every block of the stage; and the root's embedding and head, vocab-sharded over tp."""
    c = DTYPE_BYTES[compute_dtype]
    regathers = data_parallel in REGATHERS and lay.pp == 1
    held = Fraction(min(2, stage_layers(ps, lay.pp)) if regathers else stage_layers(ps, lay.pp), ps.n_layers)
    return c * math.ceil(ps.block_params * held / lay.tp + ps.expert_params * held / lay.ep + Fraction(
        _ends(ps, lay.pp), lay.tp))  # fmt: skip


def in_flight(lay: Layout, microbatches: int) -> float:
    """Microbatches whose activations the first stage holds at once under the PP schedule: 1F1B warms up
    pp of them; interleaved1F1B's warm-up of (v-1) x pp + 2 x (pp-1) chunks of 1/v of the rank's layers;
    GPipe runs every forward before any backward."""
    if lay.pp == 1:
        return 1.0
    if lay.pp_schedule == "gpipe":
        return float(microbatches)
    if lay.pp_schedule == "interleaved1F1B":
        return min(float(microbatches), ((INTERLEAVE - 1) * lay.pp + 2 * (lay.pp - 1)) / INTERLEAVE)
    return float(min(lay.pp, microbatches))


def loss_head_bytes(ps: PlanShape, lay: Layout, s: MemSetup, *, batch: int) -> tuple[int, int]:
    """(saved, transient) of the final norm and loss head for `batch` sequences on one rank: titan_core's
    arithmetic (activations.loss_bytes) at the vocabulary one TP rank holds, vocab / tp. fused_ce keeps one
    [ce_chunk, vocab / tp] fp32 chunk in flight (and its dW); plain keeps [tokens, vocab / tp] logits."""
    m, t = _rank_view(ps.base, lay.tp, lay.cp, ps.n_layers, s)
    return loss_bytes(m, replace(t, batch_size=batch), batch * t.seq_len)


def _rank_view(base: ModelShape, tp: int, cp: int, layers: int, s: MemSetup) -> tuple[ModelShape, TrainSetup]:
    """One rank's model (TP's widths, a vocab/tp head, the stage's layers) and one sequence's setup (seq/cp)."""
    m = tp_local(base, tp)  # its widths and vocab / tp
    scale = layers / base.n_layers
    mix = tuple((moe, rope, math.ceil(n * scale)) for moe, rope, n in base.layer_mix)
    m = replace(m, n_layers=layers, layer_mix=mix)
    t = TrainSetup(batch_size=1, seq_len=max(1, s.seq_len // cp), compute_dtype=s.compute_dtype,
                   memory_policy=s.policy, loss=s.loss, ce_chunk=s.ce_chunk, attention=s.attention, moe=s.moe,
                   device_type=s.device_type)  # fmt: skip
    return m, t


@lru_cache(maxsize=4096)
def _per_batch(base: ModelShape, tp: int, cp: int, layers: int, s: MemSetup) -> tuple[tuple[int, int], ...]:
    """(fixed, per sequence) bytes of: the layers' saved activations, the loss head's, the host's, the backward's
    transient, CP's gathered K/V; from titan_core's activation arithmetic at batches 1 and 2 (the loss head's
    dW and one fused chunk do not grow with the batch)."""
    m, t = _rank_view(base, tp, cp, layers, s)

    def parts(b: int) -> tuple[int, ...]:
        tb = replace(t, batch_size=b)
        saved, host, transient = activation_bytes(m, tb)
        loss_saved, _ = loss_bytes(m, tb, b * tb.seq_len)
        kv = 2 * b * s.seq_len * m.n_kv_heads * m.head_dim * DTYPE_BYTES[s.compute_dtype] if cp > 1 else 0
        return saved - loss_saved, loss_saved, host, transient, kv

    one, two = parts(1), parts(2)
    return tuple((a - (b - a), b - a) for a, b in zip(one, two))


def device_memory(ps: PlanShape, lay: Layout, s: MemSetup, *, batch: int) -> DeviceMemory:
    """Bytes on the most loaded device of `lay` at `batch` sequences per microbatch (module docstring)."""
    stored = stored_elements(ps, lay)
    params = stored * 4  # fp32 master weights
    grads, state = params, 2 * params
    gathered = gathered_bytes(ps, lay, s.data_parallel, s.compute_dtype)
    layers_saved, loss_saved, host, transient, kv = (
        f + batch * per for f, per in _per_batch(ps.base, lay.tp, lay.cp, stage_layers(ps, lay.pp), s))
    held = in_flight(lay, s.grad_accum)
    # the first stage holds `held` microbatches of its layers; the last one microbatch and the loss head
    act = max(layers_saved * held, layers_saved + loss_saved) if lay.pp > 1 else layers_saved + loss_saved
    act, host_bytes, work = int(act), int(host * held), int(transient + kv)
    opt_work = params + state if s.policy != "none" else params
    return DeviceMemory(
        params=params, grads=grads, optimizer_state=state, gathered_params=gathered, activations=act,
        activations_host=host_bytes, backward_workspace=work, optimizer_workspace=opt_work,
        forward_backward=params + state + gathered + act + work + (grads if s.grad_accum > 1 else 0),
        optimizer_step=params + state + grads + opt_work, materialise=(stored + ps.base.largest_param) * 4,
    )  # fmt: skip


def largest_batch(ps: PlanShape, lay: Layout, s: MemSetup, budget: int) -> tuple[int, DeviceMemory]:
    """The largest batch in [1, MAX_BATCH] whose peak fits `budget`, and its memory (at batch 1 when none
    fits: 0). Every moment is a + b x batch, so it is solved from two evaluations."""
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
    while best > 1 and mem.total > budget:  # integer rounding of the parts
        best -= 1
        mem = device_memory(ps, lay, s, batch=best)
    return best, mem
