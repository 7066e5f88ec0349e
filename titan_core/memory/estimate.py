"""How much memory one training process needs, before anything is materialised.

    shape = ModelShape.from_model(meta_model, args)                 # exact counts from the meta build
    setup = TrainSetup.from_config(cfg, degrees, device_type="cpu")  # batch, dtypes, sharding, policy
    est = estimate_memory(shape, setup)                  # bytes per device, broken down
    est.total, est.describe()

Pure arithmetic: nothing is allocated, so a 70B model is estimated in the time its meta
build takes. Parameter counts come from the meta model (so ports and swaps are counted as
built); activations are derived from the widths in the args, tensor by tensor, following
what autograd saves in the eager step (policy `none`) or what the Graph Trainer's memory
policy keeps (`default`, `full`, `offload`): titan_core/memory/activations.py.

The peak is the largest of three moments of a step, each the sum of what is alive then:

- forward/backward turn: parameters, optimizer state, gathered parameter copies, the
  saved activations of one micro-batch, gradients of earlier micro-batches (grad_accum),
  and the largest transient on top (the loss head's [tokens, vocab] buffers, or one
  layer's backward temporaries and recomputed values);
- optimizer step: parameters, optimizer state, gradients and the update's temporaries
  (torch's foreach AdamW: one state-sized buffer; the Graph Trainer's functional update:
  new parameters and states before they are copied back);
- materialisation: one process builds the whole model in fp32, then casts it; several processes
  make only their shards real (in the stored dtype) and hold one module's parameters whole, in
  fp32, while the init draws them (titan_core/parallel/sharded_init.py).

The process's own allocations besides tensors are a measured constant per device type
(RUNTIME_BYTES). Not counted: an op's own scratch memory, memory another runtime owns
(JAX buffers behind the bridge), and what an allocator keeps back: glibc leaves freed blocks
under its sliding mmap threshold (at most 32 MiB each) resident, so small models on a CPU
show a larger resident set than they need (tests/core/unit/test_memory_estimate.py); CUDA's
caching allocator fragments.

The layout is titan_core's mesh (world = pp x dp_replicate x dp_shard x cp x tp, ep carved from
dp_shard x cp), and the estimate is of the most loaded rank: the stage with the most blocks (and
the embedding or the head), the blocks' dense part split over tp and the routed experts over ep,
both sharded over dp_shard x cp; activations on TP's widths for seq / cp tokens of each sequence,
times the micro-batches the pipeline schedule holds; CP adds one layer's all-gathered K and V. The
final norm and the residual stream stay whole on every TP rank (sequence parallel's split of the
residual stream is not counted). One model for both callers: the trainer's preflight
(preflight.py, from the run's config and degrees) and a planner searching layouts with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache

from titan_core.config.execution_modes import execution_mode
from titan_core.memory.activations import DTYPE_BYTES, activation_bytes, loss_bytes
from titan_core.memory.shape import ModelShape, tp_local, tp_whole

__all__ = ["ModelShape", "TrainSetup", "MemoryEstimate", "estimate_memory", "format_bytes", "tp_local", "tp_whole"]

RUNTIME_BYTES = {"cpu": 24 * 2**20}
"""The trainer's own allocations besides tensors (process group, dispatch caches, thread buffers).
CPU: measured as the peak resident set over the resident set before `Trainer(...)` for a
1-layer 30k-parameter model, 2 steps: 21-29 MiB (eager, Graph Trainer, with and without
SimpleFSDP; 2-core machine, 2026-11). Accelerators: free memory is read after their
runtime started, so it is already out of the budget; nothing is added."""


@dataclass(frozen=True)
class TrainSetup:
    """How the model is trained, as far as memory is concerned (one process's view)."""

    batch_size: int
    """Sequences per micro-batch on this process."""
    seq_len: int
    grad_accum: int = 1
    """Micro-batches per step (a pipeline's micro-batches under pp > 1)."""
    param_dtype: str = "float32"
    """Dtype the parameters (and so gradients and AdamW state) are stored in."""
    compute_dtype: str = "float32"
    """Dtype the model computes in (a data-parallel mixed-precision gather casts to it)."""
    reduce_dtype: str = "float32"
    """Dtype gradients are reduced in (training.mixed_precision_reduce)."""
    optimizer: str = "adamw"
    data_parallel: str = "none"
    """none | simple_fsdp | fsdp2: decides whether gathered parameter copies exist and how many."""
    dp_shard: int = 1
    """Ranks the parameters are sharded over (with cp: dp_shard x cp, TorchTitan's dp_shard_cp)."""
    dp_replicate: int = 1
    """Replicas of the shard group (HSDP): each holds the same shard."""
    tp: int = 1
    """Tensor-parallel degree: the blocks' widths, the embedding and the head (by vocabulary) split over it."""
    ep: int = 1
    """Expert-parallel degree, carved from dp_shard x cp: each rank holds 1/ep of every layer's experts."""
    cp: int = 1
    """Context-parallel degree: each sequence's tokens split over cp ranks, the weights sharded over them too."""
    pp: int = 1
    """Pipeline stages: a rank holds ceil(layers / pp) blocks, the first stage the embedding, the last the head."""
    pp_schedule: str = "1F1B"
    """1F1B | interleaved1F1B | gpipe: how many micro-batches' activations the first stage holds at once."""
    reshard_after_forward: bool = False
    """SimpleFSDP gathers each weight again in the backward (parallelism.reshard_after_forward): a block or
    two gathered at a time, not the stage's."""
    mode: str = "eager"
    """eager | compile | graph_trainer: the Graph Trainer's functional update holds new parameters and states
    beside the old ones; an eager or per-block compiled step runs torch's foreach AdamW."""
    memory_policy: str = "none"
    """none | default | full | offload: what the step saves for its backward (the Graph Trainer's policies,
    or what eager activation checkpointing keeps: `eager_policy`)."""
    loss: str = "plain"
    """plain | fused_ce (kernels.loss)."""
    ce_chunk: int = 1024
    attention: str = "sdpa"
    """sdpa and the fused kernels keep O(seq) per query; naive materialises the scores."""
    moe: str = "loop"
    device_type: str = "cpu"
    """cpu | cuda | tpu: on a CPU offloaded activations stay in the same memory, and bf16 SDPA attends on fp32 copies."""
    runtime_bytes: int = 0
    """What the training process allocates besides tensors (RUNTIME_BYTES of its device type)."""

    @property
    def shards(self) -> int:
        """Ranks one parameter's shard is split over: dp_shard x cp (1 without data parallelism)."""
        return 1 if self.data_parallel == "none" else max(1, self.dp_shard) * max(1, self.cp)

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * max(1, self.dp_shard) * self.cp * self.tp

    @classmethod
    def from_config(cls, cfg, degrees=None, *, device_type: str = "cpu") -> TrainSetup:
        """From a JobConfig, the run's parallel degrees (titan_core.parallel.Degrees; None: one
        process) and the type of the device it trains on."""
        t, p = cfg.training, cfg.parallelism
        dp = p.data_parallel
        gt = cfg.graph_trainer
        mode = execution_mode(cfg)
        d = degrees
        return cls(
            batch_size=t.batch_size,
            seq_len=t.seq_len,
            grad_accum=t.grad_accum,
            param_dtype=t.dtype,
            compute_dtype=t.mixed_precision_param if dp != "none" else t.dtype,
            reduce_dtype=t.mixed_precision_reduce if dp != "none" else t.dtype,
            data_parallel=dp,
            dp_shard=1 if d is None else max(1, d.dp_shard),
            dp_replicate=1 if d is None else max(1, d.dp_replicate),
            tp=1 if d is None else max(1, d.tp),
            ep=1 if d is None else max(1, d.ep),
            cp=1 if d is None else max(1, d.cp),
            pp=1 if d is None else max(1, d.pp),
            pp_schedule=p.pp_schedule,
            reshard_after_forward=p.reshard_after_forward,
            mode=mode,
            memory_policy=gt.memory_policy if mode == "graph_trainer" else eager_policy(cfg.activation_checkpoint),
            loss=cfg.kernels.loss,
            ce_chunk=cfg.kernels.ce_chunk,
            attention=cfg.kernels.attention,
            moe=cfg.kernels.moe,
            device_type=device_type,
            runtime_bytes=RUNTIME_BYTES.get(device_type, 0),
        )


def eager_policy(ac) -> str:
    """The memory policy whose saved activations eager activation checkpointing keeps: full keeps block
    inputs (the Graph Trainer's `full`), selective op the matmul and attention outputs (`default`);
    selective layer is counted as `none` (an over-estimate by the blocks it recomputes)."""
    if ac.mode == "full":
        return "full"
    return "default" if ac.mode == "selective" and ac.selective == "op" else "none"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per process: the parts, and the three moments they add up to (module docstring)."""

    params: int
    """Stored parameters (this process's shard)."""
    grads: int
    optimizer_state: int
    gathered_params: int
    """Unsharded or cast working copies of parameters alive through forward and backward (data parallelism)."""
    activations: int
    """Saved activations of one micro-batch in device memory."""
    backward_workspace: int
    """The transient on top of the saved activations: loss buffers, one layer's backward temporaries."""
    optimizer_workspace: int
    """The update's temporaries (and clipping's), on top of parameters, gradients and state."""
    overhead: int
    """What the process allocates besides tensors (TrainSetup.runtime_bytes)."""
    forward_backward: int
    """Peak at the turn from forward to backward."""
    optimizer_step: int
    """Peak during clipping and the optimizer update."""
    materialise: int
    """Peak while the model is materialised (one process: the whole fp32 model; several: the shards
    and one parameter whole)."""
    activations_host: int = 0
    """Activations parked in host memory (offload policy on an accelerator); on no device's total."""
    setup: TrainSetup | None = None

    @property
    def moments(self) -> dict[str, int]:
        return {
            "forward/backward turn": self.forward_backward,
            "optimizer step": self.optimizer_step,
            "materialise": self.materialise,
        }

    @property
    def phase(self) -> str:
        """The moment of the peak (ties: the earlier one)."""
        m = self.moments
        return max(m, key=m.get)

    @property
    def total(self) -> int:
        """The peak: what the device must hold at once."""
        return max(self.moments.values())

    def describe(self) -> str:
        """One line: the peak, the moment it happens, what it is made of; the other training moment beside it."""
        s = self.setup
        dtype = f" {s.param_dtype}" if s else ""
        states = [f"params {format_bytes(self.params)}{dtype}", f"optimizer state {format_bytes(self.optimizer_state)}"]
        act = f"activations {format_bytes(self.activations)}"
        if s:
            act += f" (batch {s.batch_size} x seq {s.seq_len}, memory policy {s.memory_policy})"
        fb = states + ([f"gathered params {format_bytes(self.gathered_params)}"] if self.gathered_params else [])
        fb += [act, f"loss and backward temporaries {format_bytes(self.backward_workspace)}"]
        if s and s.grad_accum > 1:
            fb.append(f"grads {format_bytes(self.grads)} (grad_accum {s.grad_accum})")
        opt = states + [f"grads {format_bytes(self.grads)}"]
        opt.append(f"update temporaries {format_bytes(self.optimizer_workspace)}")
        parts = {"forward/backward turn": fb, "optimizer step": opt}
        ways = s.shards * s.tp if s else 1
        sharded = f", sharded {ways} ways" if ways > 1 else ""
        phase = self.phase
        text = f"estimated peak {format_bytes(self.total)} per process{sharded} at the {phase}"
        if phase == "materialise":
            one = s is not None and s.data_parallel == "none"
            text += (" (one process builds the whole model in fp32 before casting it)" if one
                     else " (the shards, and the largest parameter whole in fp32 while the init draws it)")
        else:
            runtime = [f"runtime {format_bytes(self.overhead)}"] if self.overhead else []
            text += f" ({', '.join(parts[phase] + runtime)})"
        for other in parts:
            if other != phase:
                beyond_states = ", ".join(parts[other][len(states) :])
                text += f"; at the {other} {format_bytes(self.moments[other])} ({beyond_states})"
        if self.activations_host:
            text += f"; {format_bytes(self.activations_host)} of activations offloaded to host memory"
        return text


BYTE_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(n: float | None, *, missing: str = "n/a") -> str:
    """Bytes for a person, the one style every message and report uses: the largest binary unit
    the amount fills, three significant digits (`553 MiB`, `30.5 GiB`, `1.50 GiB`, `512 B`);
    `missing` for None (a size nobody measured)."""
    if n is None:
        return missing
    for unit, size in BYTE_UNITS:
        if abs(n) >= size:
            value = n / size
            decimals = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
            return f"{value:.{decimals}f} {unit}"
    return f"{int(n)} B"


# ---- the estimate ------------------------------------------------------------------------
SCHEDULES = ("1F1B", "interleaved1F1B", "gpipe")
INTERLEAVE = 2
"""Stages per rank under interleaved1F1B (titan_core/parallel/pipeline.py's STAGES_PER_RANK)."""
REGATHERING_HOLDS = {"fsdp2": 2, "simple_fsdp": 1}
"""Blocks whose gathered weights are alive at once when each is gathered again for its backward: FSDP2's
current block and the one it prefetches; SimpleFSDP's re-gathering (regather.py) gathers inline, one."""


def stage_layers(n_layers: int, pp: int) -> int:
    """Blocks on the most loaded pipeline stage: the layers split as evenly as they go."""
    return -(-n_layers // max(1, pp))


def in_flight(s: TrainSetup) -> float:
    """Micro-batches whose activations the first stage holds at once under its schedule: 1F1B warms up pp of
    them; interleaved1F1B (v = INTERLEAVE stages per rank) (v-1) x pp + 2 x (pp-1) chunks of 1/v of the
    rank's layers; GPipe runs every forward before any backward."""
    if s.pp == 1:
        return 1.0
    if s.pp_schedule == "gpipe":
        return float(s.grad_accum)
    if s.pp_schedule == "interleaved1F1B":
        return min(float(s.grad_accum), ((INTERLEAVE - 1) * s.pp + 2 * (s.pp - 1)) / INTERLEAVE)
    return float(min(s.pp, s.grad_accum))


# The parts of the estimate that do not depend on the batch are computed once per model and the degrees they
# read (a planner asks for thousands of layouts, each at several batches): exact fractions are slow.
CACHED = 4096


def _ends(m: ModelShape, tp: int, pp: int) -> Fraction:
    """Elements of the embedding, head and final norm on the stage holding the most of them, on one TP rank
    (the tables split by vocabulary, the norm whole); a tied head is the embedding, on the last stage too."""
    first = Fraction(m.embed_params, tp)
    last = Fraction(m.head_params or m.embed_params, tp) + m.other_params
    if pp == 1:
        return Fraction(m.embed_params + m.head_params, tp) + m.other_params
    return max(first, last)


def stored_elements(m: ModelShape, s: TrainSetup) -> int:
    """Parameters this rank stores (its shard of the most loaded stage): the blocks' dense part split over tp,
    the routed experts over ep, and both sharded over dp_shard x cp (an expert's over the edp = dp_shard x cp
    / ep ranks that share it); exact up to one rounding."""
    return _stored_elements(m, max(1, s.tp), s.pp, s.shards)


@lru_cache(maxsize=CACHED)
def _stored_elements(m: ModelShape, tp: int, pp: int, shards: int) -> int:
    frac = Fraction(stage_layers(m.n_layers, pp), m.n_layers)
    dense = m.block_params * frac / tp + _ends(m, tp, pp)
    return math.ceil((dense + m.expert_params * frac) / shards)


def gathered_elements(m: ModelShape, s: TrainSetup) -> int:
    """Compute-dtype copies of parameters alive through forward and backward: a data-parallel gather (or cast)
    makes a new tensor per use. FSDP2 and SimpleFSDP re-gathering hold REGATHERING_HOLDS blocks; SimpleFSDP
    keeping its gathers holds the stage's (autograd saves each for its matmul's backward), as does any stage
    of a pipeline (torch.distributed.pipelining defers the reshard to the last micro-batch); the root's
    embedding and head stay gathered; experts are gathered over their edp ranks only (1/ep of them)."""
    cast = DTYPE_BYTES[s.compute_dtype] != DTYPE_BYTES[s.param_dtype]
    if s.data_parallel == "none" or (s.shards == 1 and not cast):
        return 0
    regathers = (s.data_parallel == "fsdp2" or s.reshard_after_forward) and s.pp == 1
    return _gathered_elements(m, max(1, s.tp), max(1, s.ep), s.pp,
                              REGATHERING_HOLDS[s.data_parallel] if regathers else None)  # fmt: skip


@lru_cache(maxsize=CACHED)
def _gathered_elements(m: ModelShape, tp: int, ep: int, pp: int, holds: int | None) -> int:
    """`holds`: the blocks a re-gathering kind holds at once; None: the stage's."""
    layers = stage_layers(m.n_layers, pp)
    held = Fraction(min(holds, layers) if holds is not None else layers, m.n_layers)
    return math.ceil(m.block_params * held / tp + m.expert_params * held / ep + _ends(m, tp, pp))


def _stage_shape(m: ModelShape, s: TrainSetup) -> ModelShape:
    """One rank's model as its activations see it: TP's widths and vocab / tp, the stage's layers."""
    return _stage_shape_of(m, max(1, s.tp), s.pp)


@lru_cache(maxsize=CACHED)
def _stage_shape_of(m: ModelShape, tp: int, pp: int) -> ModelShape:
    local = tp_local(m, tp)
    layers = stage_layers(m.n_layers, pp)
    if layers == m.n_layers:
        return local
    mix = tuple((moe, rope, -(-n * layers // m.n_layers)) for moe, rope, n in m.layer_mix)
    return replace(local, n_layers=layers, layer_mix=mix)


def rank_activations(m: ModelShape, s: TrainSetup) -> tuple[int, int, int]:
    """(saved on the device, saved on the host, transient) of one rank: the stage's layers at seq / cp tokens
    per sequence on TP's widths, times the micro-batches its schedule holds (the first stage; the last holds
    one and the loss head); under CP attention saves the all-gathered K and V of every layer (the rest of the
    sequence's, beyond the seq / cp counted), and one layer's gather sits on the backward's transient."""
    local = _stage_shape(m, s)
    seq = max(1, s.seq_len // max(1, s.cp))
    per = s if seq == s.seq_len else replace(s, seq_len=seq)
    saved, host, transient = activation_bytes(local, per)
    loss_saved = loss_bytes(local, per, s.batch_size * seq)[0]
    device = saved
    if s.pp > 1:  # the first stage holds `held` micro-batches of its layers; the last one and the loss head
        held = in_flight(s)
        layers = saved - loss_saved
        device, host = max(layers * held, layers + loss_saved), host * held
    kv = 0
    if s.cp > 1:  # attention reads K and V gathered from every cp rank: the whole sequence's, per layer
        kv = 2 * s.batch_size * s.seq_len * local.n_kv_heads * local.head_dim * DTYPE_BYTES[s.compute_dtype]
        if s.memory_policy != "full":  # saved for attention's backward (full keeps the block inputs only)
            device += kv * (s.cp - 1) / s.cp * local.n_layers * (in_flight(s) if s.pp > 1 else 1)
    return int(device), int(host), int(transient + kv)


def estimate_memory(m: ModelShape, s: TrainSetup) -> MemoryEstimate:
    """Peak bytes of one training process for `m` trained as `s` (see the module docstring)."""
    if s.optimizer != "adamw":
        raise ValueError(f"unknown optimizer '{s.optimizer}' (adamw)")
    if s.pp_schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule '{s.pp_schedule}' ({' | '.join(SCHEDULES)})")
    pb, cb = DTYPE_BYTES[s.param_dtype], DTYPE_BYTES[s.compute_dtype]
    stored = stored_elements(m, s)
    params = stored * pb
    grads = params  # gradients of the stored (sharded) parameters, in their dtype
    if m.lora_params >= 0:  # [lora]: the base is frozen; the adapters, sharded as it is (SimpleFSDP), alone train
        adapters = math.ceil(m.lora_params / s.shards) * pb
        params += adapters
        grads = adapters
    state = 2 * grads  # AdamW's exp_avg and exp_avg_sq, shaped like the parameters that train
    gathered = gathered_elements(m, s) * cb
    act, host, transient = rank_activations(m, s)
    if s.data_parallel != "none":
        # a layer's backward makes its weights' gradients whole (the gathered weight's, in the compute dtype)
        # before each is cast to the reduce dtype and reduce-scattered to this rank's shard, one at a time
        layer = m.block_params / m.n_layers / max(1, s.tp) + m.expert_params / m.n_layers / max(1, s.ep)
        if m.lora_params >= 0:  # [lora]: only the adapters' gradients are made, the frozen base has none
            layer = m.lora_params / m.n_layers
        transient += math.ceil(layer) * cb
    if s.mode == "graph_trainer":
        # the functional update's new params and states (of what trains); the clipped gradients stay alive
        # beside them (one foreach output: the list lives until its last element's use)
        opt_work = grads + state
    else:  # torch's foreach AdamW: sqrt(exp_avg_sq) as one state-sized buffer; the fp64 norm of clipping
        opt_work = max(params, _ceil_div(m.largest_param, s.shards) * 8)
    # one process: fp32 weights (to_empty builds in the default dtype) plus one parameter's cast; several:
    # the shards in their stored dtype plus the parameter the init draws whole (sharded_init.py)
    if s.world == 1 and s.data_parallel == "none":
        materialise = (m.params + m.largest_param) * 4
    else:
        materialise = params + m.largest_param * 4
    return MemoryEstimate(
        params=params, grads=grads, optimizer_state=state, gathered_params=gathered, activations=act,
        backward_workspace=transient, optimizer_workspace=opt_work, overhead=s.runtime_bytes,
        forward_backward=params + state + gathered + act + transient + (grads if s.grad_accum > 1 else 0)
        + s.runtime_bytes,
        optimizer_step=params + state + grads + opt_work + s.runtime_bytes,
        materialise=materialise + s.runtime_bytes,
        activations_host=host, setup=s,
    )  # fmt: skip


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
