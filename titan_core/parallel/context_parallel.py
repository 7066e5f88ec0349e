"""Context parallelism (CP): each sequence split over the `cp` ranks, attention over all of it.

The ranks of one `cp` group read the same rows of the global batch (mesh.dp_coordinates counts
data-parallel dimensions only) and each keeps its share of every row's tokens. Everything
but attention is per token, so only attention needs the other ranks' tokens.

**Load balance.** Under a causal mask a query attends to every key before it, so the later a
token, the more work. A contiguous split would give the last rank most of it. The sequence is
cut into 2 x cp equal chunks and rank i keeps chunk i and chunk 2cp-1-i (head and tail): the
causal work of chunk j grows with j, and j + (2cp-1-j) is the same for every rank, so every
rank has the same causal work (`balanced_index`).

**Attention: all-gather K and V, not a ring.** Each rank gathers the whole sequence's K and V
over the cp group (`gather_sequence`: backward reduce-scatters their gradients, the sum of
every rank's queries' contributions) and attends its own queries to all keys under a boolean
mask built from each token's true position in the row (`mask_from_positions`). Chosen over ring
attention (K/V passed around the ring, partial results merged by their log-sum-exp) because:
- exact: the same mask and one softmax per query over the same keys as cp = 1, no online-softmax
  merge to reorder the sums, so a cp run matches the cp = 1 run to rounding;
- mask-agnostic: causal, sliding-window and packed documents (segment_ids) are the same mask
  evaluated at true positions; a ring needs a case per mask type and chunk pair;
- simple: one collective per tensor forward and one backward; the bytes on the wire equal one
  full ring pass ((cp-1)/cp of K and V per rank), only not overlapped with the compute.
The cost is memory: every rank holds the full K and V. Each is seq x kv_heads x head_dim, i.e.
1/(q_heads/kv_heads) of the whole sequence's Q under GQA, or cp x kv_heads/q_heads times the
rank's own Q (Llama-3-8B, 32/8 heads, cp = 4: K and V are each the size of the rank's Q). The
scores are [seq/cp, seq]: 1/cp of cp = 1's. Past that (very long sequences at large cp) a ring
is the way; it is not implemented here.

**RoPE** uses each token's true position: the trainer hands the model `positions` sliced by the
same index (a packed batch's own positions, else the index itself), and the model computes its
cos/sin from them (models/common/decoder.py `hidden`).

**Kernels.** A core that takes an explicit mask: `naive` (as a score bias) and `sdpa` (as
`attn_mask`). tokamax, splash and flex build their own masks from square positions and are
refused under cp > 1, as is the transformers path (its upstream layers may mix tokens outside
attention: state-space and convolution layers, masks of their own) and a model whose kind says
its samples are not token rows to split (`ModelKind.context_parallel`: flux's joint image/text
attention). A port runs when its attention goes through
the naive or sdpa core; any other token-mixing code of its own is not split-aware.

**Loss and gradients.** The loss is the token mean over the global batch's valid tokens: the
valid-token count is summed over the data-parallel and cp ranks (`loss_group`) and each rank's
term is scaled by dp x cp (`loss_world`, token_mean.py). Parameters are sharded and
their gradients averaged over dp_shard x cp flattened into one dimension (`fsdp_mesh`), as
TorchTitan does, so the gradient is the cp = 1 run's.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig
from titan_core.data.base import Batch
from titan_core.models.common.attention import NaiveAttention, SDPAttention, mask_from_positions, sdpa
from titan_core.models.common.mapping_errors import KernelRefusesModel
from titan_core.models.registry import TRANSFORMERS_FAMILY, get_family
from titan_core.parallel.mesh import Degrees, dp_dim_names

KERNELS = ("naive", "sdpa")
"""kernels.attention values that run under cp > 1 (they take an explicit mask)."""
FSDP_DIM = "dp_shard_cp"
"""The flattened dp_shard x cp mesh dimension parameters are sharded over under cp > 1."""


def check_context_parallel(cfg: JobConfig, degrees: Degrees) -> None:
    """Every cp > 1 refusal that needs no process group (ConfigError, one line each)."""
    cp = degrees.cp
    if cp == 1:
        return
    seq_len = cfg.training.seq_len
    if seq_len % (2 * cp):
        raise ConfigError(
            f"training.seq_len ({seq_len}) must be divisible by 2 x parallelism.cp ({2 * cp}): "
            "context parallel cuts each sequence into 2 x cp equal chunks"
        )
    if cfg.kernels.attention not in KERNELS:
        raise ConfigError(
            f"kernels.attention = '{cfg.kernels.attention}' cannot run under parallelism.cp = {cp}: "
            f"context parallel needs a core that takes an explicit mask ({', '.join(KERNELS)})"
        )
    family = cfg.model.family
    if family == TRANSFORMERS_FAMILY:
        raise ConfigError(
            "parallelism.cp > 1 is not available on the transformers path: its upstream layers may mix tokens "
            "outside attention (state-space, convolutions, masks of their own), which a split sequence breaks"
        )
    kind = get_family(family).kind
    if not kind.context_parallel:
        raise ConfigError(
            f"parallelism.cp > 1 splits token rows of a decoder; {family} is a {kind.name} model, whose attention "
            "does not run over one"
        )


def balanced_index(seq_len: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """Positions (in the full row) of the tokens cp rank `rank` keeps, ascending: chunk `rank` and
    chunk 2cp-1-rank of 2 x cp equal chunks (module docstring). [seq_len // cp] int64."""
    chunk = seq_len // (2 * cp)
    if chunk * 2 * cp != seq_len:
        raise ConfigError(f"training.seq_len ({seq_len}) must be divisible by 2 x parallelism.cp ({2 * cp})")
    head = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    tail = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk, device=device)
    return torch.cat([head, tail])


def gathered_index(seq_len: int, cp: int, device=None) -> torch.Tensor:
    """True positions of an all-gathered sequence: rank 0's tokens, then rank 1's, ... [seq_len]."""
    return torch.cat([balanced_index(seq_len, cp, r, device) for r in range(cp)])


def _wait(t: torch.Tensor) -> torch.Tensor:
    return funcol.wait_tensor(t) if isinstance(t, funcol.AsyncCollectiveTensor) else t


class _GatherSequence(torch.autograd.Function):
    """All-gather along `dim` over `group`; backward reduce-scatters (sums) the gradient back."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _wait(funcol.all_gather_single(x.contiguous(), dim, group))

    @staticmethod
    def backward(ctx, grad):
        # each rank's queries read every rank's keys: a key's gradient is the sum over the ranks
        return _wait(funcol.reduce_scatter_single(grad.contiguous(), "sum", ctx.dim, ctx.group)), None, None


def gather_sequence(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The cp group's pieces of `x` concatenated along `dim` in rank order (autograd-correct)."""
    if not x.requires_grad:
        return _wait(funcol.all_gather_single(x.contiguous(), dim, group))
    return _GatherSequence.apply(x, dim, group)


class ContextParallelAttention(nn.Module):
    """An attention core under cp: this rank's queries against the cp group's gathered K and V.

    Same call contract as the core it wraps (models/common/attention.py); `window`, `causal` and
    `segment_ids` (this rank's tokens') become one mask at true positions. The wrapped core keeps
    its module path (`inner`) but holds no parameters, so state dicts do not change.
    """

    def __init__(self, inner: nn.Module, group, cp: int, rank: int):
        super().__init__()
        if not isinstance(inner, (NaiveAttention, SDPAttention)):
            raise ConfigError(
                f"context parallel: attention core {type(inner).__name__} takes no explicit mask "
                f"(kernels.attention = {' or '.join(KERNELS)} under parallelism.cp > 1)"
            )
        self.inner = inner
        self.group, self.cp, self.rank = group, cp, rank

    def forward(self, q, k, v, *, scale, window, segment_ids, softcap=None, sinks=None, bias=None, causal=True):
        if bias is not None:
            raise KernelRefusesModel(
                "context parallel: an additive attention score bias (a relative-position bias) is not split over cp"
            )
        seq = q.shape[2] * self.cp
        k_full = gather_sequence(k, 2, self.group)
        v_full = gather_sequence(v, 2, self.group)
        k_segments = None if segment_ids is None else gather_sequence(segment_ids, 1, self.group)
        mask = mask_from_positions(
            balanced_index(seq, self.cp, self.rank, q.device), gathered_index(seq, self.cp, q.device),
            window=window, q_segments=segment_ids, k_segments=k_segments, causal=causal,
        )  # fmt: skip
        if isinstance(self.inner, NaiveAttention):
            # the mask as a score bias: the naive core adds it after any soft-cap, as it masks
            score_bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
            return self.inner(q, k_full, v_full, scale=scale, window=None, segment_ids=None, softcap=softcap,
                              sinks=sinks, bias=score_bias, causal=False)  # fmt: skip
        if sinks is not None:
            raise KernelRefusesModel("context parallel: attention sinks need kernels.attention = naive")
        if softcap:
            raise KernelRefusesModel("context parallel: a soft-capped attention needs kernels.attention = naive")
        return sdpa(q, k_full, v_full, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def apply_context_parallel(model: nn.Module, cp_mesh: DeviceMesh) -> int:
    """Wrap every attention core of `model` in ContextParallelAttention (in place); returns how many.

    A module at an `attention.core` path that is not a naive or sdpa core is refused: left
    alone it would attend within this rank's tokens only, silently wrong."""
    group, cp, rank = cp_mesh.get_group(), cp_mesh.size(), cp_mesh.get_local_rank()
    wrapped = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            path = f"{name}.{child_name}" if name else child_name
            if isinstance(child, (NaiveAttention, SDPAttention)):
                setattr(module, child_name, ContextParallelAttention(child, group, cp, rank))
                wrapped += 1
            elif path.endswith("attention.core") and not isinstance(child, ContextParallelAttention):
                raise ConfigError(
                    f"context parallel: {path} is {type(child).__name__}, which takes no explicit mask "
                    f"(kernels.attention = {' or '.join(KERNELS)} under parallelism.cp > 1)"
                )
    if not wrapped:
        raise ConfigError("parallelism.cp > 1: the model has no naive or sdpa attention core to split a sequence over")
    return wrapped


class SequenceSplit:
    """This rank's share of every row of a batch (the trainer's and the validator's batch path)."""

    def __init__(self, cp: int, rank: int):
        self.cp, self.rank = cp, rank

    def __call__(self, batch: Batch) -> Batch:
        idx = balanced_index(batch.tokens.shape[1], self.cp, self.rank, batch.tokens.device)
        # no packed positions: the true position is the index itself (RoPE must see it)
        positions = idx.expand(batch.tokens.shape[0], -1) if batch.positions is None else batch.positions[:, idx]
        if batch.inputs:
            raise ConfigError(f"parallelism.cp > 1 splits token rows only; this batch also has {sorted(batch.inputs)}")
        return Batch(
            batch.tokens[:, idx], batch.labels[:, idx], positions,
            None if batch.segment_ids is None else batch.segment_ids[:, idx],
        )  # fmt: skip


def sequence_split(mesh: DeviceMesh | None) -> SequenceSplit | None:
    """The batch split of this rank, or None when the mesh has no cp dimension."""
    if mesh is None or "cp" not in mesh.mesh_dim_names:
        return None
    return SequenceSplit(mesh.size(mesh.mesh_dim_names.index("cp")), mesh.get_local_rank("cp"))


def _dims(mesh: DeviceMesh) -> dict[str, int]:
    return {n: mesh.size(i) for i, n in enumerate(mesh.mesh_dim_names)}


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh parameters are sharded over: dp_shard and cp flattened into `dp_shard_cp` (the
    dimensions outside them kept), so a gradient is averaged over every rank that saw other tokens."""
    flat = mesh[("dp_shard", "cp")]._flatten(FSDP_DIM)
    parts = [mesh[n] if n != "dp_shard" else flat for n in mesh.mesh_dim_names if n != "cp"]
    return parts[0] if len(parts) == 1 else DeviceMesh._concatenate(parts)


def loss_group(mesh: DeviceMesh):
    """The ranks whose valid tokens make up the global batch's: data-parallel and cp peers
    (None: this rank alone). Tensor-parallel peers hold the same tokens and are not in it."""
    names = tuple(n for n in (*dp_dim_names(mesh), "cp") if _dims(mesh).get(n, 1) > 1)
    if not names:
        return None
    if len(names) == 1:
        return mesh.get_group(names[0])
    # the default name: (dp_shard, cp) is then fsdp_mesh's dimension, one group for both
    return mesh[names]._flatten().get_group()


def loss_world(mesh: DeviceMesh) -> int:
    """Ranks in `loss_group` (each holds a distinct share of the global batch's tokens)."""
    dims = _dims(mesh)
    world = dims.get("cp", 1)
    for n in dp_dim_names(mesh):
        world *= dims[n]
    return world
