"""A [lora] run's adapter in PEFT's layout: `adapter_model.safetensors` + `adapter_config.json`, which
`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), folder)` loads.

The tensors are peft's own `get_peft_model_state_dict` of the model (adapter name stripped, a saved
module under its plain name), renamed from this model's module names to the HF ones the recipe chose
(names.py) under `base_model.model.`, the prefix `PeftModel.save_pretrained` writes. adapter_config.json
is peft's `LoraConfig.save_pretrained` with the adapted HF modules named whole, so peft on the
transformers class adapts exactly the modules adapted here.

The adapter is only as good as its base: the base folder's tensors must be this model's, every name
and shape (safetensors headers), and the first adapted layer's weight the very one the adapter was
trained beside (that one tensor read), else the export is refused in one line. Written
into a dot-folder and renamed into place; an earlier export of this module in the target is kept as a
dated backup, anything else there refused (`replace`, as the HF export's).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from titan_core.config.loader import ConfigError
from titan_core.lora.inject import ADAPTER, LoraState, base_state_dict
from titan_core.lora.names import import_peft
from titan_core.models.common.tied import HF_TIE
from titan_core.weights.header_check import checkpoint_files
from titan_core.runtime.distributed import group_rank
from titan_core.weights.hf_stream import StreamPlan, meta_of, stream_plan
from titan_core.weights.export_folder import MARK, Replace, check_target, marked, publish
from titan_core.weights.st_headers import HeaderError, read_checkpoint_headers

WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
"""What PeftModel puts before the base model's own module names in its saved keys."""


def export_peft(model: nn.Module, state: LoraState, adapter, out_dir: str | Path, *, base: str | Path,
                replace: Replace = "own") -> Path:  # fmt: skip
    """Write `model`'s adapter into `out_dir` (module docstring), for the HF model folder `base`
    (`checkpoint.initial_hf`), through the recipe's HF `adapter`; returns `out_dir`."""
    import_peft()
    from peft import LoraConfig  # lazy: the [hf] extra
    from safetensors.torch import save_file  # lazy: the [hf] extra

    out = Path(out_dir)
    check_adapter_target(out, replace)
    check_base(model, state, adapter, base)
    # every rank drives the stream (a sharded adapter's gather is a collective); rank 0 alone writes
    tensors = dict(adapter_plan(model, state).weights(dst=0, device="cpu"))
    if group_rank() != 0:
        return out
    cfg = state.cfg
    config = LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, task_type="CAUSAL_LM",
        target_modules=sorted(state.names.targets.values()),
        modules_to_save=sorted(state.names.saved.values()) or None, base_model_name_or_path=str(base),
    )  # fmt: skip
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)  # debris of an interrupted export
    tmp.mkdir(parents=True)
    try:
        save_file(tensors, str(tmp / WEIGHTS), metadata=MARK)
        config.save_pretrained(str(tmp))
        publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def adapter_tensors(model: nn.Module, state: LoraState) -> dict[str, torch.Tensor]:
    """peft's adapter state dict of `model` (as held: a sharded tensor is its shard) under the PEFT export's keys."""
    from peft import get_peft_model_state_dict  # lazy: the [hf] extra

    return {hf_key(k, state): v for k, v in get_peft_model_state_dict(model, adapter_name=ADAPTER).items()}


def adapter_plan(model: nn.Module, state: LoraState) -> StreamPlan:
    """The stream of the adapter (weights/hf_stream.py): `adapter_tensors`, each gathered whole in turn."""
    return stream_plan(model, _Renamed(), tensors=adapter_tensors(model, state))


class _Renamed:
    """An adapter whose HF names are the names given: the adapter's keys are already the export's."""

    def to_hf(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(sd)


def hf_key(key: str, state: LoraState) -> str:
    """A key of peft's adapter state dict (`layers.0.attention.wq.lora_A.weight`) under the HF module
    name and PeftModel's prefix (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`)."""
    names = {**state.names.targets, **state.names.saved}
    owner = max((n for n in names if key.startswith(f"{n}.")), key=len, default=None)
    if owner is None:
        raise ConfigError(f"lora: peft's adapter holds {key}, under no module [lora] named")
    return PREFIX + names[owner] + key[len(owner) :]


def check_base(model: nn.Module, state: LoraState, adapter, base: str | Path) -> None:
    """ConfigError, one line, unless the HF folder `base` holds this model's base: every tensor the
    adapter names, in the same shape (headers; a tied head may be left out), and the first adapted
    layer's weight itself, equal to the frozen one trained under the adapter (one tensor read)."""
    if not str(base):
        raise ConfigError("a PEFT export needs the base it adapts (checkpoint.initial_hf); without one set "
                          "lora.merged_export = true to export the merged model")  # fmt: skip
    try:
        stored = read_checkpoint_headers(checkpoint_files(base)).tensors
    except HeaderError as e:
        raise ConfigError(f"the PEFT export's base {base} is unreadable: {e}") from None
    hf = adapter.to_hf(meta_of(base_state_dict(model)))
    for name, t in hf.items():
        if name == HF_TIE.head and model.args.tie_embeddings:
            continue
        have = stored.get(name)
        if have is None or tuple(have.shape) != tuple(t.shape):
            there = "holds no such tensor" if have is None else f"holds it as {list(have.shape)}"
            raise ConfigError(f"the adapter was trained on another base than {base}: {name} is {list(t.shape)} "
                              f"here, and {base} {there}")  # fmt: skip
    native = min(state.names.targets)
    name = f"{state.names.targets[native]}.weight"
    frozen = base_state_dict(model)[f"{native}.weight"].detach()
    frozen = (frozen.full_tensor() if isinstance(frozen, DTensor) else frozen).cpu()  # every rank: a collective
    if not torch.equal(_read(Path(base), stored[name]).to(frozen.dtype), frozen):
        raise ConfigError(f"the adapter was trained on another base than {base}: its {name} differs from the "
                          "frozen weight the adapter was trained on")  # fmt: skip


def _read(base: Path, header) -> torch.Tensor:
    from safetensors import safe_open  # lazy: the [hf] extra

    path = Path(header.file) if Path(header.file).is_absolute() else base / header.file
    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor(header.name)


def check_adapter_target(out: Path, replace: Replace = "own") -> None:
    """ConfigError when `out` exists and may not be replaced (weights/export_folder.py's rules; an earlier
    adapter export of this module is its adapter_model.safetensors, marked)."""
    check_target(out, replace, ours=lambda folder: marked(folder / WEIGHTS), what="the adapter",
                 earlier="adapter export")  # fmt: skip
