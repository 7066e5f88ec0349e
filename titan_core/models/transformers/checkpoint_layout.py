"""A checkpoint as the Hub ships it, read into the names a transformers class holds in memory.

transformers 5 keeps some weights in memory in another layout than its checkpoints: Mixtral's
experts are one `mlp.experts.gate_up_proj` [E, 2I, D] and one `mlp.experts.down_proj` [E, D, I]
in the model, and `block_sparse_moe.experts.{e}.w1/w3.weight` [I, D] and `.w2.weight` [D, I] per
expert on the Hub. `from_pretrained` converts one into the other with the class's conversion
mapping (`transformers.conversion_mapping.get_model_conversion_mapping`: renamings, then at most
one converter per key that stacks or concatenates), leaves out checkpoint keys the class says
it does not expect (`_adjust_missing_and_unexpected_keys`: `_keys_to_ignore_on_load_unexpected`,
an old checkpoint's `rotary_emb.inv_freq`, `position_ids`), and fills a tied weight from the one
it is tied to (`all_tied_weights_keys`).

`CheckpointLayout(hf_model)` does the same to a state dict with transformers' own pieces, so a
checkpoint maps exactly as loading it would; the tensors may be meta tensors (a checkpoint read
from its headers alone: stacking and concatenating work on shapes). It is the transformers
path's adapter bound to one model (`TransformersAdapter.checkpoint_reader`): `from_hf` reads a
checkpoint, `to_hf` writes the layout `save_pretrained` would.
"""

from __future__ import annotations

from copy import deepcopy

import torch
from torch import nn

from titan_core.models.transformers.hf_classes import require_transformers


class CheckpointLayout:
    """transformers' loading conversions of one model, as an adapter (`from_hf`, `to_hf`)."""

    def __init__(self, hf_model: nn.Module):
        require_transformers()
        from transformers.conversion_mapping import get_model_conversion_mapping  # lazy: the [hf] extra
        from transformers.core_model_loading import WeightConverter, WeightRenaming  # lazy: the [hf] extra

        self.hf = hf_model
        transforms = get_model_conversion_mapping(hf_model)
        self._renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        self._converters = [t for t in transforms if isinstance(t, WeightConverter)]
        self._by_pattern = {p: c for c in self._converters for p in c.source_patterns}
        self._expected = dict(hf_model.state_dict(keep_vars=True))
        self._ties = dict(getattr(hf_model, "all_tied_weights_keys", None) or {})

    def from_hf(self, sd: dict[str, torch.Tensor], **_) -> dict[str, torch.Tensor]:
        """The model's state dict from checkpoint tensors `sd`, as `from_pretrained` would fill it.

        A key transformers does not expect and ignores is left out; one it does not expect and
        would report (a tensor of another model) is kept under its converted name. Whatever a
        conversion raises (an expert missing from a stack) propagates."""
        out, pending = self._renamed(sd)
        for first, converter in pending.items():
            # loading_info=None: transformers re-raises a conversion error instead of logging it
            for name, value in converter.convert(first, model=self.hf, config=self.hf.config).items():
                _put(out, name, value[0] if isinstance(value, list) else value, f"the tensors stacked into {first}")
        for target, source in self._ties.items():
            if target not in out and source in out:  # a tied head is stored once; loading ties it
                out[target] = out[source]
        ignored = self._ignored([k for k in out if k not in self._expected])
        return {k: v for k, v in out.items() if k not in ignored}

    def _renamed(self, sd: dict[str, torch.Tensor]):
        """(tensors renamed one to one, {first target name: converter holding its source tensors})."""
        from transformers.core_model_loading import dot_natural_key, rename_source_key  # lazy: the [hf] extra

        out: dict[str, torch.Tensor] = {}
        pending: dict = {}
        prefix = self.hf.base_model_prefix
        # natural order, as from_pretrained: a converter stacks experts in the order it receives them
        for key, tensor in sorted(sd.items(), key=lambda kv: dot_natural_key(kv[0])):
            name, pattern = rename_source_key(key, self._renamings, self._converters, prefix, self._expected)
            if name not in self._expected and key in self._expected:  # the key was right as it was
                name, pattern = key, None
            if pattern is None:
                _put(out, name, tensor, key)
                continue
            converter = pending.setdefault(name, deepcopy(self._by_pattern[pattern]))
            converter.add_tensor(name, key, pattern, tensor)
        return out, pending

    def _ignored(self, unexpected: list[str]) -> set[str]:
        """Which of the keys the model does not hold transformers ignores on loading (its own rule)."""
        if not unexpected:
            return set()
        from transformers.utils.loading_report import LoadStateDictInfo  # lazy: the [hf] extra

        info = LoadStateDictInfo(
            missing_keys=set(), unexpected_keys=set(unexpected), mismatched_keys=set(), error_msgs=[],
            conversion_errors={}, skipped_pp_keys=set(),
        )  # fmt: skip
        self.hf._adjust_missing_and_unexpected_keys(info)
        return set(unexpected) - info.unexpected_keys

    def to_hf(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The checkpoint layout of model tensors `sd`, as `save_pretrained` writes it (a tied head
        left out); tensors a reverse conversion cannot split (one half of a pair) keep their names."""
        from transformers.core_model_loading import revert_weight_conversion  # lazy: the [hf] extra

        sd = {k: v for k, v in sd.items() if k not in self._ties or self._ties[k] not in sd}
        try:
            return revert_weight_conversion(self.hf, dict(sd))
        except (ValueError, RuntimeError, KeyError, IndexError):
            return dict(sd)


def _put(out: dict[str, torch.Tensor], name: str, tensor: torch.Tensor, source: str) -> None:
    """out[name] = tensor, refusing a second tensor for one name (two checkpoint layouts of one
    weight side by side: loading would keep one of them silently)."""
    if name in out:
        raise ValueError(f"{source} and another checkpoint tensor both load into {name}")
    out[name] = tensor
