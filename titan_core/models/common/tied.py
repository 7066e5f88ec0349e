"""Tied weights: one tensor under two names, and the one rule every mapping follows for it.

A tied model's output head IS its input embedding. Each form of its weights holds it so:

- a native state dict: once, as `tok_embeddings.weight` (the model has no `output` module;
  a model that ties by sharing the Parameter lists `output.weight` too, as that same tensor);
- an HF state dict in memory: under both names, `lm_head.weight` being the embedding tensor itself;
- an HF checkpoint on disk: usually once (`save_pretrained` drops the head); some exporters
  store the head as well, a copy equal to the embedding.

So, towards HF the head is emitted as the embedding tensor (`with_tied_head`); from HF a tied
head is dropped after checking it is the embedding (`without_tied_head`); and names are
compared knowing which ones are aliases of a tensor held under another name (`aliases`,
`stored_once`), so a checkpoint that stores the head and one that leaves it out hold the same
model. A config that does not say is tied as its model_type's HF config class defaults
(`tie_default`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from titan_core.models.common.mapping_errors import AdapterError


@dataclass(frozen=True)
class Tie:
    """The two names of a tied head in one naming scheme."""

    head: str
    """The output head's name (the alias)."""
    embedding: str
    """The input embedding's name (the tensor's owner)."""


NATIVE_TIE = Tie(head="output.weight", embedding="tok_embeddings.weight")
HF_TIE = Tie(head="lm_head.weight", embedding="model.embed_tokens.weight")


def _identity(t: torch.Tensor) -> tuple:
    # tensors on meta have no storage, so there only the object (a Parameter) tells; nor does an
    # empty tensor's (every one points at 0), nor a subclass's that keeps its storage elsewhere
    if t.device.type != "meta" and t.numel():
        try:
            return ("view", t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        except (RuntimeError, NotImplementedError, TypeError):
            pass
    return ("object", id(t))


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b are one tensor: one object, or one view of one storage. On meta only the
    object tells (a model's Parameters, `state_dict(keep_vars=True)`)."""
    return a is b or _identity(a) == _identity(b)


def aliases(sd: dict[str, Any]) -> dict[str, str]:
    """{name: the first name holding the same tensor} for every later name of a shared tensor."""
    first: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for name, value in sd.items():
        if torch.is_tensor(value):
            owner = first.setdefault(_identity(value), name)
            if owner != name:
                out[name] = owner
    return out


def stored_once(sd: dict[str, Any]) -> dict[str, Any]:
    """`sd` with each shared tensor under its first name only, as a checkpoint stores it."""
    drop = aliases(sd)
    return {k: v for k, v in sd.items() if k not in drop}


def with_tied_head(sd: dict[str, Any], tie: Tie = HF_TIE) -> dict[str, Any]:
    """`sd` with the head emitted as the embedding tensor itself when only the embedding is
    there: the in-memory HF form (drop it again before writing a file, as save_pretrained does)."""
    if tie.head in sd or tie.embedding not in sd:
        return sd
    return {**sd, tie.head: sd[tie.embedding]}


def without_tied_head(sd: dict[str, Any], tied: bool | None, tie: Tie = HF_TIE) -> dict[str, Any]:
    """`sd` without its head when the model is tied: `tied` True, or, left as None, when the head
    is the embedding tensor itself (HF's in-memory form). A head kept for a tied model must
    be the embedding: AdapterError for another shape, or (off meta) other values."""
    head, emb = sd.get(tie.head), sd.get(tie.embedding)
    if head is None or emb is None or tied is False:
        return sd
    shared = same_tensor(head, emb)
    if tied is None and not shared:
        return sd
    if not shared:
        if head.shape != emb.shape:
            shapes = f"{tie.head} {list(head.shape)} has another shape than {tie.embedding} {list(emb.shape)}"
            raise AdapterError(f"the head is tied but {shapes}")
        if "meta" not in (head.device.type, emb.device.type) and not torch.equal(head, emb):
            raise AdapterError(f"the head is tied but {tie.head} differs from {tie.embedding}")
    return {k: v for k, v in sd.items() if k != tie.head}


def tie_default(model_type: str | None, own_types: tuple[str, ...]) -> bool:
    """Whether a config without `tie_word_embeddings` is tied: False for the model types a
    family claims (their HF classes default to untied); for another one (a port's: Gemma-2
    is tied by default), what its transformers config class defaults to, when installed."""
    if not model_type or model_type in own_types:
        return False
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # lazy: the [hf] extra
    except ImportError:
        return False
    if model_type not in CONFIG_MAPPING:
        return False
    try:
        return bool(getattr(CONFIG_MAPPING[model_type](), "tie_word_embeddings", False))
    except Exception:  # a config class that cannot be built from its defaults says nothing
        return False
