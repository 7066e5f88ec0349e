"""[lora] applied to a built model through peft: adapters injected, the base frozen.

`apply_lora(model, cfg, adapter, seed)` turns the recipe's HF names into this model's module names
(names.py) and hands peft exactly those: peft's `LoraModel` (what `inject_adapter_in_model` runs)
replaces each target Linear or Embedding by a LoRA layer holding the original as `base_layer`,
wraps each module to save, and freezes every other parameter. The adapters are ordinary
nn.Parameters on ordinary modules, so the optimizer (titan_core/training/optim.py skips frozen
parameters), clipping, checkpoints and any sharding treat them like any parameter.

peft's wrappers rename the base weights in the model's state dict (`wq.weight` becomes
`wq.base_layer.weight`, a saved module's `output.weight` becomes `output.original_module.weight`);
`base_state_dict` gives the base under the names it had before, so anything keyed by the native
names (the HF adapter, `checkpoint.initial_hf`) still finds every base weight. The trainer loads
`checkpoint.initial_hf` before adapters exist, so that load never sees peft's names.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig
from titan_core.config.sections import Lora as LoraConfigSection
from titan_core.lora.names import LoraNames, import_peft, lora_params, require_peft, resolve
from titan_core.lora.tensor_parallel import AdapterSplit, check_lora_tp
from titan_core.models.common.tied import HF_TIE

ADAPTER = "default"
"""peft's adapter name: the one peft's saving strips and its loading puts back."""


@dataclass
class LoraState:
    """What `apply_lora` did: the names it adapted and saved, and peft's tuner (its merge)."""

    names: LoraNames
    cfg: LoraConfigSection
    tuner: Any
    """peft's LoraModel over the model (not a child of it: the model's own tree is unchanged)."""

    def trainable(self, model: nn.Module) -> int:
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    def line(self, model: nn.Module) -> str:
        """One line for the log: what trains."""
        saved = f", {len(self.names.saved)} saved whole" if self.names.saved else ""
        return (f"lora: rank {self.cfg.rank} adapters on {len(self.names.targets)} modules{saved}; "
                f"{self.trainable(model):,} trainable parameters")  # fmt: skip


def check_lora(cfg: JobConfig, world_size: int = 1) -> None:
    """Refuse, before anything is built, a [lora] run this code does not run yet (one line each)."""
    if not cfg.lora.enable:
        return
    require_peft()
    if not cfg.lora.target_modules:
        raise ConfigError("lora.target_modules is empty: name the HF modules to adapt, e.g. ['q_proj', 'v_proj']")
    par = cfg.parallelism
    if par.data_parallel == "fsdp2" and cfg.lora.modules_to_save:
        # the loss reads a head's weight without calling the module: FSDP2 gathers a unit on its forward only
        raise ConfigError('lora.modules_to_save under data_parallel = "fsdp2": the copy it trains would never be '
                          'gathered (its weight is read, not called); use data_parallel = "simple_fsdp"')  # fmt: skip
    if world_size > 1 and par.data_parallel == "none":
        raise ConfigError('lora on several processes needs parallelism.data_parallel = "simple_fsdp" or "fsdp2"')
    # pipeline stages, cp and ep build their modules otherwise: none of them is wired to the adapters yet
    other = [f"{k} = {getattr(par, k)}" for k in ("pp", "cp", "ep") if getattr(par, k) != 1]
    if other:
        raise ConfigError(f"lora composes with SimpleFSDP, FSDP2 and tp only, not parallelism.{other[0]}: set it to 1")
    if cfg.graph_trainer.enable and cfg.graph_trainer.scan_layers:  # the scan stacks what the optimizer steps
        raise ConfigError("lora under graph_trainer.scan_layers: the scan stacks each block's parameters as trained "
                          "ones, and lora freezes the base; set scan_layers = false")  # fmt: skip
    if par.tp != 1:  # the adapters split as their layers (tensor_parallel.py), with what that cannot do refused
        check_lora_tp(cfg)
    if cfg.checkpoint.export_hf and not cfg.lora.merged_export and not cfg.checkpoint.initial_hf:
        raise ConfigError("checkpoint.export_hf under [lora] writes a PEFT adapter for the base it adapts, and "
                          "checkpoint.initial_hf names none; set it, or lora.merged_export = true")  # fmt: skip


def planned_lora_params(model: nn.Module, cfg: LoraConfigSection, adapter) -> int:
    """What `cfg` will train in `model` (built; on meta, for the memory estimate), its names refused here
    as `apply_lora` would refuse them."""
    names = resolve(model, adapter, list(cfg.target_modules), list(cfg.modules_to_save))
    return lora_params(model, names, cfg.rank)


def apply_lora(model: nn.Module, cfg: LoraConfigSection, adapter, *, seed: int = 0,
               split: AdapterSplit | None = None, shard: Callable[[nn.Module], object] | None = None) -> LoraState:
    """Inject `cfg`'s adapters into the built, materialised `model` in place (module docstring). The
    adapters' A is drawn from `seed` (peft's init: A random, B zero, so the model computes what the base
    does until a step moves B). `split` (tp > 1: tensor_parallel.py's `adapter_split`): how they are drawn
    and then split to run beside a tensor-parallel base; `shard` (a run on several ranks) then shards them
    over dp. Both before the reach check's forward, which would otherwise be FSDP2's first and fix its
    units without them. ConfigError for names that select nothing, or a layer peft cannot adapt."""
    import_peft()
    from peft import LoraConfig, LoraModel  # lazy: the [hf] extra
    from peft.tuners.tuners_utils import BaseTunerLayer  # lazy: the [hf] extra
    from peft.utils.other import ModulesToSaveWrapper  # lazy: the [hf] extra

    names = resolve(model, adapter, list(cfg.target_modules), list(cfg.modules_to_save))
    if cfg.merged_export:  # refused now, not after training
        check_mergeable(model, names)
    config = LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
        target_modules=sorted(names.targets), modules_to_save=sorted(names.saved) or None,
    )  # fmt: skip
    drawing = split.drawing() if split is not None else contextlib.nullcontext()
    with torch.random.fork_rng(devices=[]), drawing:  # the adapters' draw is the seed's, not whatever ran before
        torch.manual_seed(seed)
        try:
            with _full_shapes_of_fsdp_storage():
                tuner = LoraModel(model, config, adapter_name=ADAPTER)
        except (ValueError, TypeError) as e:  # peft's refusal of a layer type it cannot wrap
            raise ConfigError(f"lora: peft cannot adapt this model: {str(e).splitlines()[0]}") from None
    adapted = {n for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)}
    wrapped = {n for n, m in model.named_modules() if isinstance(m, ModulesToSaveWrapper)}
    if adapted != set(names.targets) or wrapped != set(names.saved):  # peft matches by suffix: hold it to ours
        raise ConfigError(f"lora: peft adapted {sorted(adapted ^ set(names.targets) or wrapped ^ set(names.saved))} "
                          "otherwise than the names resolved here")  # fmt: skip
    if split is not None:
        split.split(model, names)
    if shard is not None:
        shard(model)
    # under sequence parallel each tp rank takes a part of the positions: as many parts as ranks
    check_reached(model, names, positions=2 * (split.tp_mesh.size() if split is not None else 1))
    return LoraState(names=names, cfg=cfg, tuner=tuner)


@contextlib.contextmanager
def _full_shapes_of_fsdp_storage():
    """Size each adapter by its Linear's full in/out features when the base weight is a DTensor sharded
    over data-parallel dimensions only. peft reads a DTensor weight on a mesh with any dimension not
    named "fsdp" as tensor parallel and sizes the adapter to the local shard; titan_core's FSDP2 mesh
    names its dimensions dp_shard / dp_replicate, and its Linears compute the full projection. A mesh
    with a tp dimension keeps peft's sizing. Through peft's own per-layer hook, for the injection only."""
    from peft.tuners.lora.layer import LoraLayer  # lazy: the [hf] extra
    from torch.distributed.tensor import DTensor

    peft_sizes = LoraLayer._get_in_out_features

    def sizes(layer, module: nn.Module):
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Linear) and isinstance(weight, DTensor):
            if "tp" not in (weight.device_mesh.mesh_dim_names or ()):
                return module.in_features, module.out_features
        return peft_sizes(layer, module)

    LoraLayer._get_in_out_features = sizes
    try:
        yield
    finally:
        LoraLayer._get_in_out_features = peft_sizes


def check_reached(model: nn.Module, names: LoraNames, positions: int = 2) -> None:
    """ConfigError unless every trainable parameter takes part in the loss: peft swaps a module where
    the model's tree holds it, and a model that also reaches the original another way (the loss reading
    a head's weight through a reference of its own) would train a module that changes nothing. One
    loss of `positions` tokens and its backward, every .grad cleared after it, no RNG state consumed. A backward, not
    `autograd.grad` of the parameters: FSDP2 computes with gathered copies outside autograd's view of its
    sharded parameters, and only its backward hooks give those a gradient (on every rank: a collective)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    device = trainable[0][1].device
    tokens = torch.zeros(1, positions, dtype=torch.long, device=device)
    forked = [] if device.type == "cpu" else [device]  # dropout's draws here leave the run's RNG as it was
    with torch.random.fork_rng(devices=forked, device_type=device.type), torch.enable_grad():
        loss, _ = model.loss(tokens, tokens)
        loss.backward()
    unreached = [n for n, p in trainable if p.grad is None]
    model.zero_grad(set_to_none=True)
    if unreached:
        hf = {**names.targets, **names.saved}
        owner = max((m for m in hf if unreached[0].startswith(f"{m}.")), key=len, default=None)
        what = hf[owner] if owner is not None else unreached[0]
        raise ConfigError(f"lora: {what} would train without changing the loss: the model reaches the original "
                          "module by another path than the one peft replaced; leave it out of [lora]")  # fmt: skip


def base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The base model's tensors under their names before peft (module docstring): adapters and the
    trainable copies of saved modules left out, `.base_layer` and `.original_module` dropped."""
    from peft.tuners.tuners_utils import BaseTunerLayer  # lazy: the [hf] extra
    from peft.utils.other import ModulesToSaveWrapper  # lazy: the [hf] extra

    # each wrapper's own child holding the base: a LoRA layer's `base_layer`, a saved module's `original_module`
    base_of = {n: "base_layer" for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)}
    base_of |= {n: "original_module" for n, m in model.named_modules() if isinstance(m, ModulesToSaveWrapper)}
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        parts = name.split(".")
        wrapper = next((".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in base_of), None)
        if wrapper is not None:
            rest = name[len(wrapper) + 1 :]
            if not rest.startswith(base_of[wrapper] + "."):
                continue  # an adapter, or a saved module's trainable copy
            name = f"{wrapper}.{rest.removeprefix(base_of[wrapper] + '.')}"
        out[name] = t
    return out


def check_mergeable(model: nn.Module, names: LoraNames) -> None:
    """ConfigError when merging would change what the model computes: an adapter on an embedding the
    head shares (tied) acts on the input only, but merged into the one shared weight it moves the head too."""
    embedding = HF_TIE.embedding.removesuffix(".weight")
    if model.args.tie_embeddings and embedding in names.targets.values():
        raise ConfigError(f"lora: cannot merge the adapter on {embedding}: this model ties it to its head, which "
                          "the merge would change too; export the PEFT adapter (lora.merged_export = false)")  # fmt: skip


def merged_copy(state: LoraState) -> nn.Module:
    """A copy of the model with every adapter merged into its base weight and every saved module's
    trained copy in place of the original: peft's `merge_and_unload`, on a deep copy, so the trained
    model keeps its adapters. Its state dict has the native names again. The reference the merged weight
    stream (stream.py), which the merged export writes, is held to: a whole second model, for tests."""
    check_mergeable(state.tuner.model, state.names)
    return copy.deepcopy(state.tuner).merge_and_unload()
