"""Architecture differences config keys cannot show: upstream HF layer vs the closest family.

A port starts from the titan_core family whose adapter reads most of config.json. Some
differences leave no trace in the keys: OLMo-2 normalises the attention and MLP *outputs*
(post-norms) and its QK-norm spans all heads at once; Qwen2-MoE gates its shared expert and
has no QK-norm where Qwen3-MoE has one. `new-model --path port` therefore builds both models on
the meta device (transformers' class from config.json, never remote code; the family's model
with the args its adapter reads) and compares one decoder layer at a time, each reduced to the
same few features (`layer_features`); every feature that differs becomes one line for the README
and one `TODO(port)` in model.py. What names and shapes cannot show is arch_semantics.py's; the
upstream parameters and buffers the family adapter has no name for (a tensor that is no module's
weight, an attention sink, a routing buffer) are arch_tensors.py's, also TODOs of adapter.py. Module
names are a convention, not a contract: the lines say where to look, and the parity gate proves the port.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from onboard.upstream.hf_model import UpstreamError, causal_lm, hf_config_object
from onboard.workspace import arch_semantics as sem
from onboard.workspace.arch_tensors import UpstreamTensor, refusal_lines, tensor_differences, tensor_lines
from titan_core.models import build_meta, get_family
from titan_core.models.common.hf_adapter import AdapterError

PLACES = {
    "pre_attn": "pre-attention",
    "post_attn": "post-attention (on the attention output)",
    "pre_ffn": "pre-MLP",
    "post_ffn": "post-MLP (on the MLP output)",
}
# modules a layer may hold that carry no difference by themselves (or that a feature covers)
KNOWN = ("proj", "norm", "layernorm", "rotary", "act", "dropout", "gate", "experts", "shared_expert",
         "w1", "w2", "w3", "wq", "wk", "wv", "wo", "core", "router", "attention", "attn", "mlp", "moe",
         "feed_forward")  # fmt: skip


@dataclass
class ArchDiff:
    differences: list[str] = field(default_factory=list)
    """One line per structural difference (a TODO for the porter)."""
    note: str | None = None
    """Why the structure could not be compared (transformers missing, unknown model_type), else None."""
    upstream_class: str | None = None
    tensors: list[UpstreamTensor] = field(default_factory=list)
    """Upstream parameters and persistent buffers the family adapter has no name for, or names in
    another layout (arch_tensors.py); each is also one of `differences`, grouped by module."""
    adapter_lines: list[str] = field(default_factory=list)
    """The lines of `differences` adapter.py acts on (those tensors, the adapter's refusals): its TODOs."""


def _norm_places(names: list[str]) -> tuple[dict[str, str], list[str]]:
    """({place: module name}, names whose place they do not say) for a layer's norm children,
    from HF's naming conventions (and the family's attention_norm / ffn_norm).

    `post_attention_layernorm` is llama's pre-MLP norm unless the layer also has an explicit
    pre-MLP norm, or no pre-attention norm (then it normalises the attention output: OLMo-2, Gemma-2).
    """
    places: dict[str, str] = {}
    unplaced = []
    for n in names:
        low = n.lower()
        mlp = any(w in low for w in ("feedforward", "mlp", "ffn"))
        if low == "post_attention_layernorm":
            continue  # placed below, once the other norms are known
        if low in ("attention_norm", "input_layernorm") or low.startswith("input"):
            places["pre_attn"] = n
        elif low == "ffn_norm" or ("pre" in low and mlp):
            places["pre_ffn"] = n
        elif "post" in low and mlp:
            places["post_ffn"] = n
        elif "post" in low and ("attn" in low or "attention" in low):
            places["post_attn"] = n
        else:
            unplaced.append(n)
    ambiguous = next((n for n in names if n.lower() == "post_attention_layernorm"), None)
    if ambiguous is not None:
        sandwich = "pre_ffn" in places or "pre_attn" not in places
        places["post_attn" if sandwich else "pre_ffn"] = ambiguous
    return {p: places[p] for p in PLACES if p in places}, unplaced


QK_NORM_NAMES = ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_layernorm", "key_layernorm")
# the family's module names in HF's spelling, so both sides compare by one vocabulary
NATIVE_TO_HF = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj",
                "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}  # fmt: skip


def _qk_norm(attn: nn.Module | None, n_heads: int, head_dim: int) -> tuple[str | None, str]:
    """('per_head' | 'full_width' | 'present' | None, shape text) of the attention's q_norm."""
    if attn is None:
        return None, ""
    q = next((m for n, m in attn.named_children() if n.lower() in ("q_norm", "q_layernorm", "query_layernorm")), None)
    if q is None:
        return None, ""
    if not isinstance(getattr(q, "weight", None), nn.Parameter):
        return "present", ""
    size = q.weight.numel()
    kind = "per_head" if size == head_dim else "full_width" if size == n_heads * head_dim else "present"
    return kind, f"[{size}]"


def _members(module: nn.Module | None, skip: tuple[str, ...] = ()) -> list[str]:
    """Names (in HF spelling) of a module's children that hold weights, `skip` left out."""
    if module is None:
        return []
    names = [n for n, m in module.named_children() if n.lower() not in skip and any(True for _ in m.parameters())]
    return sorted(NATIVE_TO_HF.get(n, n) for n in names)


def layer_features(layer: nn.Module, n_heads: int, head_dim: int, dim: int = 0) -> dict[str, Any]:
    """The comparable structure of one decoder layer (HF or native naming); `dim`: the hidden
    width, for a norm that holds no weight saying it."""
    children = dict(layer.named_children())
    norms = [n for n, m in children.items() if "norm" in type(m).__name__.lower() or n.endswith("norm")]
    attn_name = next((n for n in children if "attn" in n or n == "attention"), None)
    mlp_name = next((n for n in children if n in ("mlp", "feed_forward", "moe", "block_sparse_moe")), None)
    attn, mlp = children.get(attn_name), children.get(mlp_name)
    projs = dict(attn.named_children()) if attn is not None else {}
    q_proj = next((m for n, m in projs.items() if n in ("q_proj", "wq")), None)
    o_proj = next((m for n, m in projs.items() if n in ("o_proj", "wo")), None)
    mlp_children = dict(mlp.named_children()) if mlp is not None else {}
    moe = any("expert" in n for n in mlp_children)
    shared = [n for n in mlp_children if "shared_expert" in n and "gate" not in n]
    gate = [n for n in mlp_children if "shared_expert" in n and "gate" in n]
    qk, qk_shape = _qk_norm(attn, n_heads, head_dim)
    placed, unplaced = _norm_places(norms)
    covered = tuple(f"{n}." for n in (attn_name, None if moe else mlp_name) if n)  # by the member checks
    unknown = [
        f"{n} ({type(m).__name__})"
        for n, m in layer.named_modules()
        if n
        and n not in children
        and not n.startswith(covered)
        and any(True for _ in m.parameters(recurse=False))
        and not any(k in n.rsplit(".", 1)[-1].lower() for k in KNOWN)
    ]
    unknown += [
        f"{n} ({type(m).__name__})"
        for n, m in children.items()
        if n not in norms + [attn_name, mlp_name] and any(True for _ in m.parameters())
    ]
    return {
        "norms": placed,
        "unplaced_norms": unplaced,
        "norm_kinds": sem.layer_norm_kinds(layer, norms, dim),
        "attn_name": attn_name,
        "attn_members": _members(attn, skip=QK_NORM_NAMES),
        "qk_norm": qk,
        "qk_shape": qk_shape,
        "qkv_bias": getattr(q_proj, "bias", None) is not None,
        "out_bias": getattr(o_proj, "bias", None) is not None,
        "moe": moe,
        "mlp_name": mlp_name,
        "mlp_members": [] if moe else _members(mlp),
        "shared_expert": shared[0] if moe and shared else None,
        "shared_gate": gate[0] if moe and gate else None,
        "unknown": unknown,
    }


QK_NORM = {
    None: "no QK-norm",
    "per_head": "QK-norm per head",
    "full_width": "QK-norm over the full width (all heads normalised together)",
    "present": "a QK-norm",
}


def _kinds(features: dict) -> list[str]:
    """The norm types a layer's norms are (those the probe could run), sorted."""
    return sorted({k for k in features["norm_kinds"].values() if k})


def _named(parent: str | None, members: list[str]) -> str:
    return ", ".join(f"`{parent}.{m}`" for m in members) or "none"


def _places(features: dict) -> str:
    return ", ".join(f"{PLACES[p]} `{n}`" for p, n in features["norms"].items()) or "none"


def compare(up: dict, nat: dict, *, cls: str, family: str) -> list[str]:
    """One line per feature in which the upstream layer differs from the family's."""
    out = []
    if set(up["norms"]) != set(nat["norms"]):
        out.append(
            f"norm placement: {cls} has {_places(up)}; the {family} Block has {_places(nat)}: apply the "
            "norms where upstream does in model.py's Block (and map their weights in adapter.py)"
        )
    up_kinds, nat_kinds = _kinds(up), _kinds(nat)
    if up_kinds and nat_kinds and up_kinds != nat_kinds:
        where = ", ".join(f"`{n}`" for n, k in up["norm_kinds"].items() if k)
        out.append(sem.norm_line(" / ".join(up_kinds), " / ".join(nat_kinds), cls=cls, family=family, where=where))
    if up["qk_norm"] != nat["qk_norm"]:
        fix = (
            "the shared Attention normalises [head_dim] only, so model.py needs its own q/k norm"
            if up["qk_norm"] == "full_width"
            else "set args.qk_norm to match (adapter.py's extra_args_from_hf)"
        )
        up_text = f"{QK_NORM[up['qk_norm']]} {up['qk_shape']}".strip()
        nat_text = f"{QK_NORM[nat['qk_norm']]} {nat['qk_shape']}".strip()
        out.append(f"QK-norm: {cls} has {up_text}; the {family} family has {nat_text}: {fix}")
    for key, what in (("qkv_bias", "q/k/v projection bias"), ("out_bias", "output projection bias")):
        if up[key] != nat[key]:
            out.append(
                f"{what}: {cls} {'has' if up[key] else 'has no'} one, the {family} family "
                f"{'has none' if up[key] else 'has one'} (args.{key}, set in adapter.py)"
            )
    if up["attn_members"] != nat["attn_members"]:
        out.append(
            f"attention projections: {cls} has {_named(up['attn_name'], up['attn_members'])}; the {family} "
            f"Attention has wq, wk, wv, wo (HF {', '.join(nat['attn_members'])}): a fused or "
            "low-rank layout is split or joined in adapter.py's layer hooks; another computation needs "
            "model.py's own attention"
        )
    if up["moe"] != nat["moe"]:
        kinds = ("MoE" if up["moe"] else "dense", "MoE" if nat["moe"] else "dense")
        out.append(f"MLP kind: {cls} is {kinds[0]} here, the {family} layer is {kinds[1]} (moe_every / dense_layers)")
    elif not up["moe"] and up["mlp_members"] != nat["mlp_members"]:
        gated = any("gate" in n for n in up["mlp_members"])
        out.append(
            f"MLP projections: {cls} has {_named(up['mlp_name'], up['mlp_members'])}"
            f"{'' if gated else ' (no gate projection)'}; the {family} FeedForward is SwiGLU with w1, w3, w2 "
            f"(HF {', '.join(nat['mlp_members'])}): a fused gate_up is split in adapter.py; "
            "another MLP is model.py's own"
        )
    if up["moe"] and nat["moe"]:
        if bool(up["shared_expert"]) != bool(nat["shared_expert"]):
            has = f"has `mlp.{up['shared_expert']}`" if up["shared_expert"] else "has none"
            out.append(
                f"shared expert: {cls} {has}; the {family} MoE {'has one' if nat['shared_expert'] else 'has none'} "
                "(args.shared_expert_hidden_dim)"
            )
        if up["shared_gate"] and not nat["shared_gate"]:
            out.append(
                f"gated shared expert: {cls} scales the shared expert by a learned per-token gate "
                f"(`mlp.{up['shared_gate']}`); titan_core's MoE adds the shared expert ungated"
            )
    if up["unplaced_norms"]:
        out.append(
            f"norms whose place the names do not say: {', '.join(up['unplaced_norms'])}: see where {cls} applies them"
        )
    if up["unknown"]:
        out.append(f"modules with weights no check above covers: {', '.join(up['unknown'])}: see what they compute")
    return out


def _upstream(cfg: dict) -> tuple[nn.Module, int, int]:
    """The HF causal LM on meta, with its attention heads and head width."""
    config = hf_config_object(cfg)  # UpstreamError when transformers is missing or lacks the model_type
    with torch.device("meta"):
        model = causal_lm(config)  # the text model of a composite config
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return model, config.num_attention_heads, head_dim


def _layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers, in order: the largest ModuleList/ModuleDict named `layers`."""
    lists = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] == "layers"]
    if not lists:
        return []
    best = max(lists, key=len)
    return list(best.values()) if isinstance(best, nn.ModuleDict) else list(best)


def _native(cfg: dict, family: str):
    """The family's model on meta with the args its adapter reads (or its debugmodel flavor), and
    the config keys the adapter read (none when it could not read them)."""
    fam = get_family(family)
    try:
        args, used = fam.adapter.args_from_hf(cfg)
        return build_meta(family, args), args, used
    except (AdapterError, TypeError, ValueError):
        args = fam.flavors.get("debugmodel") or next(iter(fam.flavors.values()))
        return build_meta(family, args), args, set()


def _native_norm(native: nn.Module, args) -> str | None:
    """The norm type of the family's layers (its first layer's norms), e.g. 'RMSNorm'."""
    nat_layers = _layers(native)
    if not nat_layers:
        return None
    return " / ".join(_kinds(layer_features(nat_layers[0], args.n_heads, args.head_dim, args.dim))) or None


def _keys_only(cfg: dict, family: str, native: nn.Module, args, used: set[str]) -> list[str]:
    """What the config's keys say differs, for a config transformers cannot build."""
    model_type = str(cfg.get("model_type"))
    lines = []
    up_norm, nat_norm = sem.config_norm_kind(cfg), _native_norm(native, args)
    if up_norm and nat_norm and not nat_norm.startswith(up_norm):
        keys = ", ".join(f"`{k}`" for k in (*sem.NORM_TYPE_KEYS, *sem.LAYER_NORM_EPS_KEYS) if k in cfg)
        lines.append(sem.norm_line(up_norm, nat_norm, cls=model_type, family=family, where=f"by config.json's {keys}"))
    return lines + _model_level(cfg, family, None, native, used, cls=model_type, norms=None)


def _model_level(cfg, family, model, native, used, *, cls: str, norms) -> list[str]:
    """What differs in the whole model rather than in one layer: RoPE, padding_idx, keys' meanings
    (`model` None: from the config's keys alone)."""
    layout, evidence = sem.rope_layout(cfg, model)
    lines = [sem.rope_line(evidence, family=family)] if layout == "interleaved" else []
    pad = sem.padding_line(cfg, model, native, cls=cls, family=family)
    lines += [pad] if pad else []
    return lines + sem.meaning_lines(cfg, get_family(family).adapter, used, family=family, upstream_norms=norms)


def architecture_differences(cfg: dict, family: str) -> ArchDiff:
    """The differences between the upstream class of `cfg` and `family`, layer by layer, then the
    model-wide ones; from the config's keys alone when the upstream class cannot be built."""
    native, args, used = _native(cfg, family)
    try:
        model, n_heads, head_dim = _upstream(cfg)
    except UpstreamError as e:
        return ArchDiff(differences=_keys_only(cfg, family, native, args, used), note=f"structure not compared: {e}")
    except (ValueError, TypeError, KeyError, AttributeError, AssertionError, IndexError) as e:
        # transformers' own modeling code refusing this config: said in the README and by new-model, not hidden
        note = f"structure not compared: transformers cannot build {cfg.get('model_type')}: {e}"
        return ArchDiff(differences=_keys_only(cfg, family, native, args, used), note=note)
    up_layers, nat_layers = _layers(model), _layers(native)
    norms = sem.attention_norms(up_layers[0] if up_layers else None, head_dim)
    model_lines = _model_level(cfg, family, model, native, used, cls=type(model).__name__, norms=norms)
    cls = type(up_layers[0]).__name__ if up_layers else type(model).__name__
    if not up_layers:
        note = f"structure not compared: {type(model).__name__} has no `layers` list"
        return ArchDiff(differences=model_lines, note=note, upstream_class=cls)
    dim = model.config.hidden_size
    found: dict[str, list[int]] = {}
    for i, up in enumerate(up_layers):
        nat = nat_layers[min(i, len(nat_layers) - 1)]
        up_f = layer_features(up, n_heads, head_dim, dim)
        nat_f = layer_features(nat, args.n_heads, args.head_dim, args.dim)
        for line in compare(up_f, nat_f, cls=cls, family=family):
            found.setdefault(line, []).append(i)
    lines = [
        line if len(layers) == len(up_layers) else f"{line} (layers {', '.join(map(str, layers))})"
        for line, layers in found.items()
    ]
    tensors, refusals = tensor_differences(model, cfg, family, args)
    mapping = tensor_lines(tensors, cfg, family=family, n_layers=len(up_layers))
    mapping += refusal_lines(refusals, family=family, n_layers=len(up_layers))
    return ArchDiff(
        differences=lines + mapping + model_lines, upstream_class=cls, tensors=tensors, adapter_lines=mapping
    )
