"""Token dispatch of expert parallelism: routed rows to the rank owning their expert and back.

An ep group of P ranks splits n_experts into P contiguous blocks of n_local = n_experts / P
(rank p owns experts p * n_local ..): the layout `Shard(0)` over `ep` gives the weights.
One MoE call on one rank, after its router chose `experts` [tokens, top_k]:

1. every (token, slot) pair is one row, ordered by expert (stable: token order within an
   expert), so the rows bound for each rank are contiguous and, inside, grouped by expert;
2. with a capacity (ep_capacity_factor > 0) each expert keeps its first `capacity` rows
   of this rank and the rest are dropped: their expert output is zero, not renormalised;
3. the per-expert row counts go to every rank first (an all-to-all of n_experts integers, read
   on the host: the row all-to-all needs its split sizes there);
4. the rows go to their owners (all-to-all), each owner runs its local experts on what it
   received with the model's experts kernel (weight 1 per row), the outputs come back by the
   reverse all-to-all, and each row's output, times its router weight, is added onto its token.

The all-to-alls are functional collectives, whose autograd is the reverse all-to-all, so the
gradient of a row reaches the rank that sent it and the router weights get theirs from step 4.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from titan_core.parallel.activation_checkpoint import in_recompute


def capacity(capacity_factor: float, tokens: int, top_k: int, n_experts: int) -> int | None:
    """Rows one expert takes from one source rank in one MoE call: ceil(cf x tokens x top_k /
    n_experts), cf times the expert's even share of the rank's routed rows; None (no limit) at cf 0."""
    if capacity_factor <= 0:
        return None
    return math.ceil(capacity_factor * tokens * top_k / n_experts)


def _all_to_all(rows: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_to_all_single(rows, out_splits, in_splits, group))


class ExpertDispatch:
    """One model's expert-parallel dispatch: its ep group, the split of the experts, the capacity,
    and the count of dropped rows (host integer, summed until `take_dropped` reads it)."""

    def __init__(self, group: dist.ProcessGroup, n_experts: int, capacity_factor: float = 0.0):
        self.group = group
        self.ep = dist.get_world_size(group)
        self.n_experts = n_experts
        self.n_local = n_experts // self.ep
        self.capacity_factor = capacity_factor
        self.dropped = 0
        """(token, expert) rows this rank dropped since the last `take_dropped`, over every MoE call."""

    def take_dropped(self) -> int:
        """Rows dropped on this rank since the last call (and reset the count)."""
        n, self.dropped = self.dropped, 0
        return n

    @torch.compiler.disable  # the split sizes are read on the host: a compiled block breaks its graph here
    def __call__(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        experts: torch.Tensor,
        run_local: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """x [tokens, dim], weights / experts [tokens, top_k] (global expert ids) -> [tokens, dim].

        `run_local(rows [R, dim], local_ids [R])` computes this rank's experts on the rows it received."""
        tokens, top_k = experts.shape
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.n_experts)
        kept = counts
        cap = capacity(self.capacity_factor, tokens, top_k, self.n_experts)
        if cap is not None:
            # a row's place among its expert's rows (in token order); those past the capacity go
            start = torch.cumsum(counts, 0) - counts
            place = torch.arange(flat.numel(), device=flat.device) - start[flat[order]]
            order = order[place < cap]
            kept = counts.clamp(max=cap)
        received = torch.empty_like(kept)
        dist.all_to_all_single(received, kept, group=self.group)
        # the one host read of the call: split sizes (and the dropped count) for the collectives
        host = torch.cat([counts.sum().reshape(1), kept, received]).tolist()
        routed, kept_h, received_h = host[0], host[1 : 1 + self.n_experts], host[1 + self.n_experts :]
        if not in_recompute():  # activation checkpointing runs this forward again in the backward: count once
            self.dropped += routed - sum(kept_h)
        send = [sum(kept_h[r * self.n_local : (r + 1) * self.n_local]) for r in range(self.ep)]
        recv = [sum(received_h[r * self.n_local : (r + 1) * self.n_local]) for r in range(self.ep)]

        token = order // top_k
        rows = _all_to_all(x[token], recv, send, self.group)
        # received rows: by source rank, then by local expert (the sender's order)
        local_ids = torch.arange(self.n_local, device=x.device).repeat(self.ep)
        local_ids = torch.repeat_interleave(local_ids, received.to(x.device), output_size=sum(recv))
        out_rows = _all_to_all(run_local(rows, local_ids), send, recv, self.group)
        combine = weights.reshape(-1)[order, None].to(out_rows.dtype)
        return torch.zeros_like(x).index_add(0, token, out_rows * combine)
