"""[lora] under tensor parallelism (parallelism.tp > 1): each adapter split as the layer it adapts.

TP splits a block's Linears on meta (titan_core/parallel/plans.py), before peft exists; peft then wraps
such a Linear, which keeps TP's hooks as its `base_layer`, and adds `lora_B(lora_A(x)) * scaling` to the
base's output on local tensors. peft sizes A and B by the weight it reads (a DTensor on a tp mesh: its
local shape, drawn alike on every rank); read plain while peft makes them (`AdapterSplit.drawing`), they
get the whole layer's in/out features and one process's draw from the run's seed, and each is then split
here to give the base's local layout:

- a column-wise base (q/k/v, w1/w3: input whole, output this rank's columns): B is split as the base is,
  by the base's own style (weight Shard(0); its input declared Replicate, so the backward all-reduces the
  input's partial gradient), and A is whole. A's output gradient is that all-reduce's, complete and the
  same on every rank, so A's gradient is too; the input's gradient through A is complete as well, added to
  the base's all-reduced one.
- a row-wise base (wo, w2: input this rank's slice of the features, output summed over ranks): A is split
  as the base is (weight Shard(1); its partial output all-reduced, or under sequence parallel
  reduce-scattered over the sequence as the base's is), and B is whole. Without sequence parallel B's input
  and output gradient are the same on every rank, so its gradient is complete there; under sequence
  parallel each rank holds its own positions, so B's gradient is a partial sum, which DTensor's matmul
  says (Partial) and the parameter's read turns into the sum (an all-reduce over tp).

A whole half is a DTensor Replicate on the tp mesh (`Whole`), its input taken as a DTensor in the layout
it arrives in and its output handed on local: DTensor then tracks every gradient above, and SimpleFSDP
(shard.py), clipping and DCP see a parameter replicated over tp (counted once, saved once). A Linear TP
leaves whole (a layer outside the plan: an MoE router) gets both halves whole. What is refused: an adapter
on a layer TP splits otherwise (the vocabulary-split embedding), one outside the plan under sequence
parallel (its input's layout is not known here), and dropout on the adapters (each tp rank would draw its
own mask over an input the ranks share, the row-wise slices masked alike).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig
from titan_core.lora.names import LoraNames
from titan_core.parallel.simple_fsdp import tp_reads_plain
from titan_core.parallel.tensor_parallel import plan_for


@dataclass(frozen=True)
class AdapterSplit:
    """[lora]'s adapters under tp: drawn whole, then split over `tp_mesh` as the plan's `styles` split their layers."""

    styles: dict[str, Callable[[], ParallelStyle]]
    """The TP plan's `block_styles`: path inside a block -> the style that split that layer."""
    tp_mesh: DeviceMesh
    sequence_parallel: bool

    def drawing(self) -> AbstractContextManager:
        """Open while peft makes the adapters: it sizes them by the weight it reads, and a TP layer's reads
        plain (simple_fsdp.tp_reads_plain), so they get the whole layer's shape and one process's draw."""
        return tp_reads_plain()

    def split(self, model: nn.Module, names: LoraNames) -> None:
        """Split the adapters peft made on `names`' targets (split_adapters)."""
        split_adapters(model, names, self.styles, self.tp_mesh, sequence_parallel=self.sequence_parallel)


def check_lora_tp(cfg: JobConfig) -> None:
    """Refuse, before anything is built, what [lora] does not run under parallelism.tp > 1 (one line each)."""
    if cfg.lora.dropout:
        raise ConfigError(f"lora.dropout = {cfg.lora.dropout} under parallelism.tp = {cfg.parallelism.tp}: each tp "
                          "rank would draw its own mask over the input the ranks share; set it to 0")  # fmt: skip


def adapter_split(cfg: JobConfig, mesh: DeviceMesh | None) -> AdapterSplit | None:
    """The split of peft's adapters for this run's tensor parallelism (module docstring); None without tp."""
    if mesh is None or "tp" not in mesh.mesh_dim_names:
        return None
    sp = cfg.parallelism.sequence_parallel
    return AdapterSplit(plan_for(cfg.model.family).block_styles(sp), mesh["tp"], sp)


def split_adapters(model: nn.Module, names: LoraNames, styles: dict[str, Callable[[], ParallelStyle]],
                   tp_mesh: DeviceMesh, *, sequence_parallel: bool = False) -> None:  # fmt: skip
    """Split each adapter `names` targets over `tp_mesh` as its base layer is split by `styles` (a TP plan's
    `block_styles`, by path inside a block); ConfigError, one line, for a target whose split none follows."""
    from peft.tuners.lora import Linear as LoraLinear  # lazy: the [hf] extra

    for native, hf in names.targets.items():
        layer = model.get_submodule(native)
        style = _base_style(native, styles)
        if not isinstance(layer, LoraLinear) or (style is None and _split_by_tp(layer.get_base_layer())):
            raise ConfigError(f"lora: {hf} is split over parallelism.tp otherwise than a block's Linear (by "
                              "vocabulary), which no adapter split follows; leave it out or set tp = 1")  # fmt: skip
        if style is not None and not isinstance(style, (ColwiseParallel, RowwiseParallel)):
            raise ConfigError(f"lora: {hf} is split by {type(style).__name__} under parallelism.tp, which no "
                              "adapter split follows; leave it out or set tp = 1")  # fmt: skip
        if style is None and sequence_parallel:  # whole halves take a whole input; it may be a sequence chunk
            raise ConfigError(f"lora: {hf} is outside the tp plan, and under sequence parallel its input's "
                              "layout is not known here; leave it out or set sequence_parallel = false")  # fmt: skip
        for key in layer.lora_A:  # peft's adapters on this layer (the one [lora] adds)
            for module, half in _halves(style, layer.lora_A[key], layer.lora_B[key]):
                # peft drew A and B alike on every rank: each keeps its own slice, nothing sent
                parallelize_module(module, tp_mesh, half, src_data_rank=None)


def _halves(style: ParallelStyle | None, a: nn.Module, b: nn.Module) -> list[tuple[nn.Module, ParallelStyle]]:
    """(module, style) of an adapter's A and B beside a base split by `style` (module docstring)."""
    if isinstance(style, ColwiseParallel):  # B split as the base; A whole, on the base's (whole) input
        return [(a, Whole(style.input_layouts[0])), (b, style)]
    if isinstance(style, RowwiseParallel):  # A split as the base; B whole, on A's summed output
        return [(a, style), (b, Whole(style.output_layouts[0]))]
    return [(a, Whole(Replicate())), (b, Whole(Replicate()))]  # a Linear TP leaves whole, on its whole input


def _base_style(native: str, styles: dict[str, Callable[[], ParallelStyle]]) -> ParallelStyle | None:
    """A fresh instance of the style the plan gave the block Linear `native` (`layers.<i>.<path>`); None
    for a module outside the plan."""
    parts = native.split(".", 2)
    if len(parts) < 3 or parts[0] != "layers" or parts[2] not in styles:
        return None
    return styles[parts[2]]()


def _split_by_tp(base: nn.Module) -> bool:
    """Whether TP split `base`'s weight (held as a DTensor with a Shard placement on the tp mesh)."""
    stored = base._parameters.get("weight")  # the stored parameter, not SimpleFSDP's gathered read of it
    if not isinstance(stored, DTensor) or "tp" not in (stored.device_mesh.mesh_dim_names or ()):
        return False
    return stored.placements[stored.device_mesh.mesh_dim_names.index("tp")].is_shard()


class Whole(ParallelStyle):
    """A Linear held whole on every tp rank: its parameters DTensors Replicate on the tp mesh, its input taken
    as a DTensor laid out as `layout` (a local tensor is this rank's part of that layout) and its output
    handed on local, in the layout DTensor gives it (the input's: Replicate, or a sequence Shard)."""

    def __init__(self, layout: Placement):
        super().__init__()
        self.layout = layout

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, self._replicate, self._input, self._output)

    def _replicate(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for pname, p in list(module.named_parameters(recurse=False)):
            whole = distribute_tensor(p.detach(), mesh, [Replicate()], src_data_rank=self.src_data_rank)
            module.register_parameter(pname, nn.Parameter(whole, requires_grad=p.requires_grad))

    def _input(self, module: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [self.layout], run_check=False)
        elif x.placements != (self.layout,):
            x = x.redistribute(placements=[self.layout])
        return (x, *inputs[1:])

    def _output(self, module: nn.Module, outputs, mesh: DeviceMesh):
        return outputs.to_local() if isinstance(outputs, DTensor) else outputs

