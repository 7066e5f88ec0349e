"""Capture the whole training step (forward, loss, backward, clipping, AdamW) as one FX graph.

`make_fx` traces a pure function of flat tensors: parameters, buffers, AdamW moments, the
per-step optimizer scalars, the micro-batches and the step's global count of valid tokens
go in; the summed loss, the gradient norm and the new parameters and moments come out.
The count is computed outside the graph (and all-reduced over the data-parallel ranks
there): each micro-batch's loss is weighted by it exactly as in eager
(titan_core/parallel/token_mean.py), so the program holds no extra collective and no host sync.
Tracing runs on fake tensors, so no real computation happens and any data-dependent op
fails loudly instead of baking one batch's values into the program. Parameters are graph inputs, never constants: the
graph can be run again on updated values (the tests perturb them to prove it).

Every node is tagged while it is traced: `meta["gt_region"]` is `forward`, `backward` or
`optimizer`, and `meta["gt_layer"]` is the decoder block index a forward node came from.
The memory-policy and split passes act on these tags.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.fx import GraphModule
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from titan_core.compile.graph_trainer import functional_optim as fo
from titan_core.compile.graph_trainer.host_sync import HostSync, HostSyncError, HostSyncGuard, describe, subgraph_syncs
from titan_core.compile.graph_trainer.params import as_param, param_spec
from titan_core.compile.graph_trainer.scan import plan_stacking, scanned_layers
from titan_core.parallel.token_mean import micro_batch_term

if TYPE_CHECKING:
    from titan_core.models.common.protocol import TrainableModel


class CaptureError(RuntimeError):
    """The training step cannot be captured as one graph; the message says why and what to change."""


class _LossCall(nn.Module):
    """Routes functional_call to `model.loss`, the training entry point of every family."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, labels, **inputs):
        return self.model.loss(tokens, labels, **inputs)


@dataclass
class StepLayout:
    """Where each tensor sits in the flat input and output lists of the captured step."""

    param_names: list[str]
    buffer_names: list[str]
    """What the step reads and never updates (`read_only_tensors`): buffers, frozen parameters."""
    group_of: list[int]
    """AdamW param-group index of each parameter."""
    hypers: list[fo.GroupHyper]
    batch_fields: tuple[str, ...]
    """Batch fields present (`Batch.present`: tokens and labels always; positions, segment_ids when
    packed; a flow model's named inputs)."""
    grad_accum: int
    max_norm: float
    specs: list = field(default_factory=list)
    """Per parameter: None for a plain tensor, or the ParamSpec of a sharded (DTensor) one."""
    dp_world: int = 1
    """Data-parallel ranks: the loss weights of titan_core/parallel/token_mean.py use it."""
    buffer_specs: list = field(default_factory=list)
    """Per read-only tensor: None, or the ParamSpec of a sharded frozen parameter."""

    @property
    def n_params(self) -> int:
        return len(self.param_names)

    @property
    def n_scalars(self) -> int:
        return len(self.hypers) * len(fo.STEP_SCALARS)

    def split_inputs(self, flat):
        p, b = self.n_params, len(self.buffer_names)
        it = iter(flat)
        take = lambda n: [next(it) for _ in range(n)]
        params, buffers, exp_avgs, exp_avg_sqs = take(p), take(b), take(p), take(p)
        scal = take(self.n_scalars)
        k = len(fo.STEP_SCALARS)
        scalars = [tuple(scal[g * k : (g + 1) * k]) for g in range(len(self.hypers))]
        micro = [dict(zip(self.batch_fields, take(len(self.batch_fields)))) for _ in range(self.grad_accum)]
        (n_tokens,) = take(1)  # the step's valid labels over every micro-batch and dp rank (int64 scalar)
        return params, buffers, exp_avgs, exp_avg_sqs, scalars, micro, n_tokens

    def split_outputs(self, flat):
        """-> loss, grad_norm, new params, new exp_avgs, new exp_avg_sqs."""
        p = self.n_params
        return flat[0], flat[1], list(flat[2 : 2 + p]), list(flat[2 + p : 2 + 2 * p]), list(flat[2 + 2 * p : 2 + 3 * p])


@dataclass
class CapturedStep:
    gm: GraphModule
    """The whole step; call it with the flat inputs (see StepLayout)."""
    layout: StepLayout
    example_inputs: list
    """Fake tensors with the shape, dtype and device of each graph input."""
    trace_time_s: float
    host_syncs: list[HostSync] = field(default_factory=list)
    """Sync ops met while tracing (only filled when tracing with on_host_sync='record')."""
    scan_layers: bool = False


class _RegionTagger:
    """Tags nodes with the region and block they were traced in, by walking back from the newest node."""

    def __init__(self):
        self.region, self.layer = "forward", None

    def _flush(self) -> None:
        mode = get_proxy_mode()
        if mode is None:
            return
        for node in reversed(mode.tracer.graph.nodes):
            if "gt_region" in node.meta:
                break
            node.meta["gt_region"] = "input" if node.op == "placeholder" else self.region
            node.meta["gt_layer"] = None if node.op == "placeholder" else self.layer

    def enter(self, region: str | None = None, layer: int | None = None) -> None:
        self._flush()
        if region is not None:
            self.region = region
        self.layer = layer

    def finish(self) -> None:
        self._flush()

    @contextlib.contextmanager
    def block_hooks(self, model: TrainableModel):
        handles = []
        # a model with no repeated block (`layers` empty) gets no block tags: every node is outside a block
        for name, block in model.layers.items():
            i = int(name)
            handles.append(block.register_forward_pre_hook(lambda mod, args, i=i: self.enter(layer=i)))
            handles.append(block.register_forward_hook(lambda mod, args, out: self.enter(layer=None)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def read_only_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of what the step reads and never updates, in the order the graph takes them:
    the buffers, then the parameters that do not require grad (AFMoE's router `expert_bias`).
    They are graph inputs like the parameters: a tensor left out would be baked into the capture as
    a constant (a real tensor inside fake tracing, which make_fx refuses)."""
    frozen = [(n, p) for n, p in model.named_parameters() if not p.requires_grad]
    return [*model.named_buffers(), *frozen]


def step_layout(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch, grad_accum: int, max_norm: float, *, dp_world: int = 1
) -> StepLayout:
    hypers = fo.group_hypers(optimizer)
    group_index = {id(p): gi for gi, g in enumerate(optimizer.param_groups) for p in g["params"]}
    names, group_of, specs = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) not in group_index:
            raise CaptureError(f"parameter {name} requires grad but is in no optimizer param group")
        names.append(name)
        group_of.append(group_index[id(p)])
        specs.append(param_spec(p))
    fields = tuple(batch.present())
    read_only = read_only_tensors(model)
    if fields[:2] != ("tokens", "labels"):
        raise CaptureError("a batch needs tokens and labels")
    return StepLayout(
        param_names=names,
        buffer_names=[n for n, _ in read_only],
        buffer_specs=[param_spec(t) for _, t in read_only],
        group_of=group_of,
        hypers=hypers,
        batch_fields=fields,
        grad_accum=grad_accum,
        max_norm=max_norm,
        specs=specs,
        dp_world=dp_world,
    )


class _Packing:
    """The tensors the step differentiates and updates: one per parameter, or under scan the
    parameters outside the blocks followed by one stack per block parameter name."""

    def __init__(self, layout: StepLayout, stacking=None):
        self.layout, self.stacking = layout, stacking

    def pack(self, per_param: list) -> list:
        st = self.stacking
        if st is None:
            return list(per_param)
        return [per_param[i] for i in st.others] + [torch.stack([per_param[i] for i in row]) for row in st.index]

    def unpack(self, packed: list) -> list:
        """Back to one tensor per parameter, in layout order (a stack comes back as views)."""
        st = self.stacking
        if st is None:
            return list(packed)
        out: list = [None] * self.layout.n_params
        for i, t in zip(st.others, packed):
            out[i] = t
        for row, t in zip(st.index, packed[len(st.others) :]):
            for i, piece in zip(row, t.unbind(0)):
                out[i] = piece
        return out

    def pick(self, per_param: list) -> list:
        """A per-parameter attribute (group, spec) for each packed tensor (a stack takes its layer 0's)."""
        st = self.stacking
        return (
            list(per_param)
            if st is None
            else [per_param[i] for i in st.others] + [per_param[row[0]] for row in st.index]
        )


def _add(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """Two micro-batches' gradients of one parameter (None: it had none in that micro-batch)."""
    return b if a is None else a if b is None else a + b


def _scatter(old: list, used: list[int], new: list) -> list:
    """`old` with `new[k]` at index `used[k]`: the updated tensors back among those passed through."""
    out = list(old)
    for i, t in zip(used, new):
        out[i] = t
    return out


def make_step_fn(model: nn.Module, layout: StepLayout, *, scan_layers: bool = False, guard=None, tagger=None):
    """The pure step function over flat tensors that `capture_train_step` traces (and eager can run)."""
    call = _LossCall(model)
    stacking = plan_stacking(model, layout.param_names, layout.group_of, layout.hypers) if scan_layers else None
    packing = _Packing(layout, stacking)
    outside = stacking.others if stacking else range(layout.n_params)
    pnames = [f"model.{layout.param_names[i]}" for i in outside]
    bnames = [f"model.{n}" for n in layout.buffer_names]
    tagger = tagger or _RegionTagger()

    def step(*flat):
        params, buffers, exp_avgs, exp_avg_sqs, scalars, micro, n_tokens = layout.split_inputs(flat)
        guard_ctx = guard if guard is not None else contextlib.nullcontext()
        with guard_ctx, torch.enable_grad():
            leaves = [p.detach().requires_grad_(True) for p in packing.pack(params)]
            n_out = len(pnames)
            values = [as_param(leaf, spec) for leaf, spec in zip(leaves[:n_out], packing.pick(layout.specs))]
            read_only = [as_param(b, spec) for b, spec in zip(buffers, layout.buffer_specs or [None] * len(buffers))]
            state = dict(zip(pnames, values)) | dict(zip(bnames, read_only))
            total, grads = None, None
            for mb in micro:
                tagger.enter(region="forward")
                if stacking is not None:
                    block_specs = packing.pick(layout.specs)[n_out:]
                    layers = scanned_layers(model, leaves[n_out:], stacking.block_names, block_specs)
                else:
                    layers = tagger.block_hooks(model)
                with layers:
                    loss, ce = torch.func.functional_call(call, state, (), mb)
                # eager's arithmetic exactly (Trainer._eager_update): the global token mean's share
                loss = micro_batch_term(
                    loss, ce, mb["labels"], n_tokens, dp_world=layout.dp_world, grad_accum=layout.grad_accum
                )
                total = (torch.zeros((), device=loss.device) if total is None else total) + loss.detach().float()
                tagger.enter(region="backward")
                g = torch.autograd.grad(loss, leaves, allow_unused=True)
                if stacking is not None and any(gi is None for gi in g):
                    missing = [n for n, gi in zip(layout.param_names, packing.unpack(g)) if gi is None]
                    raise CaptureError(
                        f"parameters receive no gradient: {missing[:5]}; under scan every block parameter must be "
                        "used by the loss"
                    )
                grads = list(g) if grads is None else [_add(a, b) for a, b in zip(grads, g)]
            tagger.enter(region="optimizer")
            # a parameter the loss does not use (a causal LM's unused cross-attention, a pooler) has no
            # gradient: eager's AdamW and norm skip it, so the step passes it and its state through
            used = [i for i, gi in enumerate(grads) if gi is not None]
            grads = [grads[i].detach() for i in used]
            pick = lambda xs: [xs[i] for i in used]  # noqa: E731
            # the norm sees one gradient per parameter, in eager's order; the rest is elementwise
            if stacking is not None:  # every gradient is there (refused above otherwise)
                norm = fo.global_norm(packing.unpack(grads), layout.specs)
            else:
                norm = fo.global_norm(grads, pick(layout.specs))
            if layout.max_norm > 0:
                grads = fo.clip_by_norm(grads, norm, layout.max_norm)
            moved = fo.adamw_update(
                pick([leaf.detach() for leaf in leaves]),
                grads,
                pick(packing.pack(exp_avgs)),
                pick(packing.pack(exp_avg_sqs)),
                pick(packing.pick(layout.group_of)),
                layout.hypers,
                scalars,
            )
            before = ([leaf.detach() for leaf in leaves], packing.pack(exp_avgs), packing.pack(exp_avg_sqs))
            new_p, new_m, new_v = (_scatter(old, used, new) for old, new in zip(before, moved))
            tagger.finish()
        return [total, norm, *packing.unpack(new_p), *packing.unpack(new_m), *packing.unpack(new_v)]

    return step


def capture_train_step(
    model: nn.Module,
    layout: StepLayout,
    example_inputs: list[torch.Tensor],
    *,
    scan_layers: bool = False,
    on_host_sync: str = "raise",
) -> CapturedStep:
    """Trace the step over `example_inputs` (real tensors, only their metadata is used).

    on_host_sync: `raise` fails at the first op that would sync the host (HostSyncError);
    `record` traces on and lists them in `CapturedStep.host_syncs`.
    """
    guard = HostSyncGuard(record=on_host_sync == "record")
    tagger = _RegionTagger()
    fn = make_step_fn(model, layout, scan_layers=scan_layers, guard=guard, tagger=tagger)
    t0 = time.perf_counter()
    try:
        gm = make_fx(fn, tracing_mode="fake")(*example_inputs)
    except HostSyncError:
        raise
    except Exception as e:
        if guard.found:
            # in record mode the trace goes on past a sync until the value is branched on;
            # the syncs met so far are the answer, and the cause of the failure
            raise HostSyncError(describe(guard.found[0]), guard.found) from e
        raise
    dt = time.perf_counter() - t0
    nested = subgraph_syncs(gm)
    if nested and on_host_sync == "raise":
        raise HostSyncError(f"host sync inside the captured step: {nested[0].op} at {nested[0].where}")
    gm.graph.eliminate_dead_code()
    gm.recompile()
    fakes = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    return CapturedStep(gm, layout, fakes, dt, host_syncs=list(guard.found) + nested, scan_layers=scan_layers)
