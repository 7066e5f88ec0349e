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
(RUNTIME_BYTES). Not counted: kernel workspaces inside one op, memory another runtime owns
(JAX buffers behind the bridge), and what an allocator keeps back: glibc leaves freed blocks
under its sliding mmap threshold (at most 32 MiB each) resident, so small models on a CPU
show a larger resident set than they need (tests/core/unit/test_memory_estimate.py); CUDA's
caching allocator fragments. Tensor parallelism (TrainSetup.tp) splits the decoder blocks'
parameters, the embedding and the output head (by vocabulary) and their gathered copies over
the TP ranks, and the activations of the split widths (heads, MLP hidden units, the loss
head's vocabulary); the final norm and the residual stream stay whole on every TP rank
(sequence parallel's split of the residual stream is not counted).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from titan_core.memory.activations import DTYPE_BYTES, activation_bytes

if TYPE_CHECKING:  # the arithmetic needs no torch: reports format sizes without loading it
    from titan_core.models.common.protocol import TrainableModel

RUNTIME_BYTES = {"cpu": 24 * 2**20}
"""The trainer's own allocations besides tensors (process group, dispatch caches, thread buffers).
CPU: measured as the peak resident set over the resident set before `Trainer(...)` for a
1-layer 30k-parameter model, 2 steps: 21-29 MiB (eager, Graph Trainer, with and without
SimpleFSDP; 2-core machine, 2026-11). Accelerators: free memory is read after their
runtime started, so it is already out of the budget; nothing is added."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs to know about one model."""

    params: int
    """Distinct parameters of the built model (a tied embedding counts once)."""
    largest_param: int
    """Elements of the largest single parameter (the fp64 norm of clipping copies one at a time)."""
    largest_block_params: int
    """Parameters of the largest decoder block (FSDP2 gathers a block at a time)."""
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    ffn_hidden_dim: int
    layer_mix: tuple[tuple[bool, bool, int], ...] = ()
    """(is an MoE layer, rotates q and k, how many layers) per kind of layer; empty: all dense with RoPE."""
    n_experts: int = 0
    top_k: int = 0
    moe_hidden_dim: int = 0
    shared_expert_hidden_dim: int = 0
    qk_norm: bool = False
    final_softcap: bool = False
    outside_blocks: int = 0
    """Parameters outside the decoder blocks (embeddings, output head, final norm): a TP plan
    splits the vocab x dim tables by vocabulary and leaves the rest whole (`tp_whole`)."""

    def __post_init__(self) -> None:
        if not self.layer_mix:
            object.__setattr__(self, "layer_mix", ((False, True, self.n_layers),))

    @property
    def moe_layers(self) -> int:
        return sum(n for moe, _, n in self.layer_mix if moe)

    @classmethod
    def from_model(cls, model: TrainableModel, args) -> ModelShape:
        """Counts from the (meta) model itself, widths from its TransformerArgs."""
        params = list(model.parameters())  # distinct: a tied weight appears once
        blocks = list(model.layers.values())
        per_block = [sum(p.numel() for p in b.parameters()) for b in blocks]
        largest_block = max(per_block, default=0)
        kinds = [(args.layer_is_moe(i), args.layer_uses_rope(i)) for i in range(args.n_layers)]
        mix = tuple((moe, rope, kinds.count((moe, rope))) for moe, rope in sorted(set(kinds)))
        return cls(
            params=sum(p.numel() for p in params),
            largest_param=max((p.numel() for p in params), default=0),
            largest_block_params=largest_block,
            outside_blocks=sum(p.numel() for p in params) - sum(per_block),
            dim=args.dim,
            n_layers=args.n_layers,
            n_heads=args.n_heads,
            n_kv_heads=args.n_kv_heads,
            head_dim=args.head_dim,
            vocab_size=args.vocab_size,
            ffn_hidden_dim=args.ffn_hidden_dim,
            layer_mix=mix,
            n_experts=args.n_experts,
            top_k=args.top_k,
            moe_hidden_dim=args.moe_hidden_dim,
            shared_expert_hidden_dim=args.shared_expert_hidden_dim,
            qk_norm=args.qk_norm,
            final_softcap=bool(args.final_softcap),
        )


@dataclass(frozen=True)
class TrainSetup:
    """How the model is trained, as far as memory is concerned (one process's view)."""

    batch_size: int
    """Sequences per micro-batch on this process."""
    seq_len: int
    grad_accum: int = 1
    param_dtype: str = "float32"
    """Dtype the parameters (and so gradients and AdamW state) are stored in."""
    compute_dtype: str = "float32"
    """Dtype the model computes in (a data-parallel mixed-precision gather casts to it)."""
    optimizer: str = "adamw"
    shard_degree: int = 1
    """How many ways parameters, gradients and optimizer state are split (dp_shard x tp)."""
    tp: int = 1
    """Tensor-parallel degree, a factor of shard_degree (see the module docstring)."""
    data_parallel: str = "none"
    """none | simple_fsdp | fsdp2: decides whether gathered parameter copies exist and how many."""
    reshard_after_forward: bool = False
    """SimpleFSDP gathers each weight again in the backward (parallelism.reshard_after_forward): one block's
    gathered weights alive at a time, not the model's."""
    memory_policy: str = "none"
    """none (eager) | default | full | offload: the Graph Trainer's policies, or what eager activation
    checkpointing keeps (`eager_policy`)."""
    loss: str = "plain"
    """plain | fused_ce (kernels.loss)."""
    ce_chunk: int = 1024
    attention: str = "sdpa"
    """sdpa and the fused kernels keep O(seq) per query; naive materialises the scores."""
    moe: str = "loop"
    device_type: str = "cpu"
    """cpu | cuda | tpu: on a CPU offloaded activations stay in the same memory, and bf16 SDPA builds scores."""
    runtime_bytes: int = 0
    """What the training process allocates besides tensors (RUNTIME_BYTES of its device type)."""
    @classmethod
    def from_config(cls, cfg, degrees=None, *, device_type: str = "cpu") -> TrainSetup:
        """From a JobConfig, the run's parallel degrees (titan_core.parallel.Degrees; None: one
        process) and the type of the device it trains on."""
        t, dp = cfg.training, cfg.parallelism.data_parallel
        shard = 1 if degrees is None or dp == "none" else max(1, degrees.dp_shard) * max(1, degrees.tp)
        gt = cfg.graph_trainer
        return cls(
            batch_size=t.batch_size,
            seq_len=t.seq_len,
            grad_accum=t.grad_accum,
            param_dtype=t.dtype,
            compute_dtype=t.mixed_precision_param if dp != "none" else t.dtype,
            shard_degree=shard,
            tp=1 if degrees is None or dp == "none" else max(1, degrees.tp),
            data_parallel=dp,
            reshard_after_forward=cfg.parallelism.reshard_after_forward,
            memory_policy=gt.memory_policy if gt.enable else eager_policy(cfg.activation_checkpoint),
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
        fb += [act, f"loss and backward workspace {format_bytes(self.backward_workspace)}"]
        if s and s.grad_accum > 1:
            fb.append(f"grads {format_bytes(self.grads)} (grad_accum {s.grad_accum})")
        opt = states + [f"grads {format_bytes(self.grads)}"]
        opt.append(f"update workspace {format_bytes(self.optimizer_workspace)}")
        parts = {"forward/backward turn": fb, "optimizer step": opt}
        sharded = f", sharded {s.shard_degree} ways" if s and s.shard_degree > 1 else ""
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
def estimate_memory(m: ModelShape, s: TrainSetup) -> MemoryEstimate:
    """Peak bytes of one training process for `m` trained as `s` (see the module docstring)."""
    if s.optimizer != "adamw":
        raise ValueError(f"unknown optimizer '{s.optimizer}' (adamw)")
    pb, cb = DTYPE_BYTES[s.param_dtype], DTYPE_BYTES[s.compute_dtype]
    shard, tp = max(1, s.shard_degree), max(1, s.tp)
    whole = tp_whole(m) if tp > 1 else 0  # replicated over TP: sharded over the dp ranks only
    stored = _ceil_div(m.params - whole, shard) + _ceil_div(whole, max(1, shard // tp))
    params = stored * pb
    grads = params  # gradients of the stored (sharded) parameters, in their dtype
    state = 2 * params  # AdamW's exp_avg and exp_avg_sq, shaped like the parameters
    gathered = 0
    if s.data_parallel == "simple_fsdp" and s.reshard_after_forward and (shard > 1 or cb != pb):
        gathered = _ceil_div(m.largest_block_params, tp) * cb  # the block whose forward or backward runs now
    elif s.data_parallel == "simple_fsdp" and (shard > 1 or cb != pb):
        # the gather (or cast) makes a new tensor per use, and the matmul keeps it for the backward;
        # under TP each rank gathers its slice of the blocks, embedding and head over the dp ranks
        gathered = (_ceil_div(m.params - whole, tp) + whole) * cb
    elif s.data_parallel == "fsdp2" and shard > 1:
        gathered = 2 * m.largest_block_params * cb  # the current block and the prefetched next one
    act, host, transient = activation_bytes(tp_local(m, tp), s)
    if s.memory_policy != "none":
        # the functional update's new params and states; the clipped gradients stay alive beside
        # them (one foreach output: the list lives until its last element's use)
        opt_work = params + state
    else:  # torch's foreach AdamW: sqrt(exp_avg_sq) as one state-sized buffer; the fp64 norm of clipping
        opt_work = max(params, _ceil_div(m.largest_param, shard) * 8)
    # one process: fp32 weights (to_empty builds in the default dtype) plus one parameter's cast; several:
    # the shards in their stored dtype plus the parameter the init draws whole (sharded_init.py)
    if s.data_parallel == "none":
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


def tp_local(m: ModelShape, tp: int) -> ModelShape:
    """The widths one TP rank computes with: 1/tp of the query and key/value heads, of the MLP
    hidden units and of the vocabulary (the dense decoder's TP plan, parallel/plans.py); the rest
    stays whole."""
    if tp <= 1:
        return m
    return replace(
        m,
        n_heads=max(1, m.n_heads // tp),
        n_kv_heads=max(1, m.n_kv_heads // tp),
        ffn_hidden_dim=max(1, m.ffn_hidden_dim // tp),
        vocab_size=_ceil_div(m.vocab_size, tp),
    )


def tp_whole(m: ModelShape) -> int:
    """Parameters outside the blocks that a TP plan leaves whole on every TP rank: all but the
    vocab x dim tables (the embedding, and the head unless tied), which it splits by vocabulary."""
    table = m.vocab_size * m.dim
    return m.outside_blocks - min(2, m.outside_blocks // table) * table if table else m.outside_blocks


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
