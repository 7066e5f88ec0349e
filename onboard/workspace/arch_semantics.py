"""What a port's modules compute, where names and shapes agree but the computation does not.

arch_diff.py compares the upstream layer with the family's by module names and shapes. These
differences hide behind equal names: a LayerNorm and an RMSNorm both hold a [dim] weight,
interleaved and half-split RoPE hold nothing at all, an embedding's padding_idx is no weight,
and a config key the family reads may mean something else in the config's own model. Each check
finds them by what the upstream code does (a norm run on a probe input, `rotate_half` run on
[0, 1, 2, 3], the embedding built on meta), from the config's keys where the upstream class
cannot be built. The lines say where to look; the parity gate remains what proves the port.
"""

from __future__ import annotations

import copy
import inspect
import re
import sys
from typing import Any

import torch
from torch import nn

# what a module's code raises when it cannot run on a probe input (a norm that wants another shape)
PROBE_ERRORS = (RuntimeError, TypeError, ValueError, AttributeError, IndexError, NotImplementedError)
ROPE_FLAGS = ("rope_interleave", "rope_interleaved", "rotary_interleaved", "rotary_emb_interleaved", "interleaved_rope")
"""Config keys that switch a model's RoPE to the interleaved (GPT-J) layout."""
NORM_TYPE_KEYS = ("norm_type", "normalization_type", "layer_norm_type")
LAYER_NORM_EPS_KEYS = ("layer_norm_eps", "layer_norm_epsilon", "layernorm_epsilon")
HALF_SPLIT, INTERLEAVED = [-2.0, -3.0, 0.0, 1.0], [-1.0, 0.0, -3.0, 2.0]


# ---- norm type ------------------------------------------------------------------------------
def norm_kind(module: nn.Module, width: int) -> str | None:
    """'LayerNorm' | 'RMSNorm' | 'L2Norm' by running a CPU copy of `module` (weights 1, biases 0) on
    rows with a non-zero mean; ' with bias' appended when it has one; None when it cannot run.

    `width` is the normalised size when the module holds no weight that says it."""
    weight = getattr(module, "weight", None)
    shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) and weight.dim() >= 1 else (width,)
    try:
        probe = copy.deepcopy(module).to_empty(device="cpu").float()
        with torch.no_grad():
            for name, p in probe.named_parameters():
                p.fill_(0.0 if name.rpartition(".")[2] == "bias" else 1.0)
            x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(0)) + 3.0
            y = probe(x)
    except PROBE_ERRORS:
        return None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or not bool(torch.isfinite(y).all()):
        return None
    rows = y.reshape(4, -1, shape[-1]).double()
    if float(rows.mean(-1).abs().max()) < 1e-3:  # x's rows have mean/rms ~0.95: an RMSNorm keeps that
        kind = "LayerNorm"
    elif float((rows.pow(2).sum(-1) - 1).abs().max()) < 1e-3:
        kind = "L2Norm"
    else:
        kind = "RMSNorm"
    has_bias = any(n.rpartition(".")[2] == "bias" for n, _ in module.named_parameters())
    return kind + (" with bias" if has_bias else "")


def layer_norm_kinds(layer: nn.Module, norm_names: list[str], width: int) -> dict[str, str | None]:
    """{norm child name: norm_kind} for the norms of one decoder layer."""
    children = dict(layer.named_children())
    return {n: norm_kind(children[n], width) for n in norm_names}


def config_norm_kind(cfg: dict[str, Any]) -> str | None:
    """'LayerNorm' when the config's keys say its norms are layer norms, 'RMSNorm' when they say
    RMS norms, else None (nothing said)."""
    for key in NORM_TYPE_KEYS:
        value = str(cfg.get(key) or "").lower().replace("_", "")
        if "rms" in value:
            return "RMSNorm"
        if "layer" in value:
            return "LayerNorm"
    if any(k in cfg for k in LAYER_NORM_EPS_KEYS) and "rms_norm_eps" not in cfg:
        return "LayerNorm"
    return None


def norm_line(up: str, nat: str, *, cls: str, family: str, where: str) -> str:
    fix = "nn.LayerNorm(dim, eps, bias=...) in model.py, with layer_norm_eps read in adapter.py"
    if "bias" in up:
        fix += " and the bias mapped as a weight of its own"
    if not up.startswith("LayerNorm"):
        fix = "the norm upstream uses, in model.py"
    return (
        f"norm type: {cls}'s norms ({where}) are {up}; the {family} family's are {nat}: "
        f"{fix} (a LayerNorm subtracts the mean, an RMSNorm does not)"
    )


# ---- RoPE layout ----------------------------------------------------------------------------
def _rotation_of(module) -> tuple[str | None, str]:
    """(layout, evidence) from an upstream modeling module's own rotation code."""
    if module is None:
        return None, ""
    short = module.__name__.rpartition(".")[2]
    if callable(getattr(module, "rotate_every_two", None)):
        return "interleaved", f"{short}.rotate_every_two rotates adjacent pairs"
    rotate = getattr(module, "rotate_half", None)
    if callable(rotate):
        try:
            out = rotate(torch.arange(4.0)[None]).flatten().tolist()
        except PROBE_ERRORS:
            out = None
        if out == INTERLEAVED:
            return "interleaved", f"{short}.rotate_half([0, 1, 2, 3]) = {INTERLEAVED} (adjacent pairs)"
        if out == HALF_SPLIT:
            return "half_split", f"{short}.rotate_half rotates the two halves"
    for name, fn in vars(module).items():
        if inspect.isfunction(fn) and re.search(r"rot|rope", name) and fn.__module__ == module.__name__:
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            if "view_as_complex" in src:
                return "interleaved", f"{short}.{name} multiplies adjacent pairs as complex numbers"
    return None, ""


def rope_layout(cfg: dict[str, Any], upstream: nn.Module | None) -> tuple[str | None, str]:
    """('interleaved' | 'half_split' | None, evidence) of the upstream model's RoPE: the config's
    flag first (a modeling file may implement both layouts), then the modeling module's code."""
    for key in ROPE_FLAGS:
        if key in cfg and cfg[key] is not None:
            return ("interleaved" if cfg[key] else "half_split"), f"config.json sets {key} = {cfg[key]}"
    if upstream is None:
        return None, ""
    return _rotation_of(sys.modules.get(type(upstream).__module__))


def rope_line(evidence: str, *, family: str) -> str:
    return (
        f"RoPE layout: {evidence}: upstream rotates adjacent pairs (x0, x1), (x2, x3), ... (interleaved, "
        f"GPT-J style); the {family} family's apply_rope rotates x_i with x_(i + head_dim/2) (half-split): "
        "model.py needs an interleaved rotation, or adapter.py permutes the rows of the q and k "
        "projections (and q/k norm weights) into half-split order"
    )


# ---- padding_idx ----------------------------------------------------------------------------
def padding_line(cfg: dict[str, Any], upstream: nn.Module | None, native: nn.Module, *, cls: str, family: str):
    """The line for an upstream embedding with a padding_idx the native one lacks, else None."""
    mine = getattr(getattr(native, "tok_embeddings", None), "padding_idx", None)
    if upstream is not None:
        emb = upstream.get_input_embeddings()
        theirs = getattr(emb, "padding_idx", None)
        said = f"{cls}'s embedding has padding_idx = {theirs} (pad_token_id)"
    else:
        pad = cfg.get("pad_token_id")
        theirs = pad if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else None
        said = (f"pad_token_id = {theirs}: transformers' classes mostly build their embedding with "
                "padding_idx = it (check upstream's)")  # fmt: skip
    if theirs is None or theirs == mine:
        return None
    return (
        f"embedding padding_idx: {said}: that row starts at 0 and never gets a gradient; the {family} "
        f"family's tok_embeddings has {'none' if mine is None else f'padding_idx = {mine}'}: build "
        "nn.Embedding(vocab_size, dim, padding_idx=...) in model.py, pad_token_id carried in args.extra by adapter.py"
    )


# ---- keys the family reads with its own meaning -----------------------------------------------
def attention_norms(layer: nn.Module | None, head_dim: int) -> list[str]:
    """'name (Type, weight [shape] | no weight, kind)' for the norm modules inside a layer's attention."""
    if layer is None:
        return []
    attn = next((m for n, m in layer.named_children() if "attn" in n or n == "attention"), None)
    out = []
    for name, mod in (attn.named_children() if attn is not None else []):
        if "norm" not in name.lower() and "norm" not in type(mod).__name__.lower():
            continue
        w = getattr(mod, "weight", None)
        has = f"weight {list(w.shape)}" if isinstance(w, torch.Tensor) else "no weight"
        out.append(f"`{name}` ({type(mod).__name__}, {has}, {norm_kind(mod, head_dim) or 'kind unknown'})")
    return out


def meaning_lines(cfg: dict[str, Any], adapter, used: set[str], *, family: str, upstream_norms: list[str] | None):
    """One line per config key the family reads with a meaning of its own, in a config of another model."""
    meanings: dict[str, str] = getattr(adapter, "key_meanings", {})
    if cfg.get("model_type") in adapter.hf_model_types:
        return []
    lines = []
    for key, meaning in meanings.items():
        if key not in cfg or key not in used:
            continue
        seen = ""
        if upstream_norms is not None:
            seen = f"; upstream's attention holds {', '.join(upstream_norms) or 'no norm module'}"
        lines.append(
            f"config key `{key}` = {cfg[key]!r}: the {family} family reads it as {meaning}; a "
            f"{cfg.get('model_type')} config may mean something else by it{seen}: read what upstream does with "
            f"`config.{key}` and implement that in model.py (adapter.py: stop passing it to the family's field)"
        )
    return lines
