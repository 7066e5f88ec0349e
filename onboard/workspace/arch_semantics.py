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

from onboard.sanitize import visible

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


# ---- config keys of a known pattern: the concrete change ----------------------------------------
def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rope_skip_interval(nope: list[int], n_layers: int) -> int | None:
    """The k with `TransformerArgs.rope_skip_every = k` skipping RoPE on exactly the layers `nope`
    (layers i with (i + 1) % k == 0), None when no interval does."""
    for k in range(1, n_layers + 1):
        if [i for i in range(n_layers) if (i + 1) % k == 0] == nope:
            return k
    return None


def _skip_rope(nope: list[int], n_layers: int, *, source: str) -> str:
    if not nope:
        return f"{source}: every layer applies RoPE (no NoPE layer): args.rope_skip_every = 0, nothing to change"
    every = rope_skip_interval(nope, n_layers)
    if every:
        return (
            f"{source}: layers {nope} skip RoPE (NoPE), one in every {every}: set TransformerArgs.rope_skip_every = "
            f"{every} in adapter.py's extra_args_from_hf (layers i with (i + 1) % {every} == 0 then skip it: the "
            "Block builds Attention(use_rope=args.layer_uses_rope(i)))"
        )
    return (
        f"{source}: layers {nope} skip RoPE (NoPE) at no fixed interval, which rope_skip_every cannot say: carry the "
        "list in args.extra (adapter.py) and build Attention(use_rope=bool(args.extra['no_rope_layers'][i])) in "
        "model.py's Block (a per-layer check in the port's attention)"
    )


def _no_rope_layers(cfg: dict[str, Any], value: Any) -> str:
    n = _int(cfg.get("num_hidden_layers")) or 0
    if isinstance(value, list) and not value:
        return "empty: transformers fills it from no_rope_layer_interval (that key's line says what to set)"
    if not (isinstance(value, list) and len(value) == n and all(_int(v) in (0, 1) for v in value)):
        return ("a per-layer RoPE flag (1: RoPE, 0: NoPE), not one per layer here: read what upstream's attention "
                "does with it; Attention(use_rope=...) per layer in model.py's Block")  # fmt: skip
    return _skip_rope([i for i, v in enumerate(value) if not v], n, source="1 = RoPE, 0 = none")


def _no_rope_interval(cfg: dict[str, Any], value: Any) -> str:
    listed = cfg.get("no_rope_layers")
    if isinstance(listed, list) and listed:
        return (
            "transformers uses it only to fill a missing no_rope_layers; this config lists them, so no_rope_layers "
            "decides which layers skip RoPE (its line says what to set)"
        )
    n, every = _int(cfg.get("num_hidden_layers")) or 0, _int(value)
    if not every or every < 1:
        return "not a positive layer count: read what upstream does with it"
    return _skip_rope([i for i in range(n) if (i + 1) % every == 0], n, source=f"a NoPE layer every {every}")


def _swiglu_limit(cfg: dict[str, Any], value: Any) -> str:
    alpha = (f"; with swiglu_alpha = {cfg['swiglu_alpha']} GPT-OSS computes glu = gate * sigmoid(alpha * gate) "
             "and out = (up + 1) * glu") if "swiglu_alpha" in cfg else ""  # fmt: skip
    return (
        f"clamped SwiGLU: upstream clamps the gate to at most {value} and up to [-{value}, {value}] before the "
        f"activation{alpha}; titan_core's FeedForward and Experts compute silu(gate) * up unclamped: model.py's "
        "MLP / experts compute upstream's form, the limit read into args.extra by adapter.py"
    )


def _swiglu_alpha(cfg: dict[str, Any], value: Any) -> str:
    return (
        f"the SwiGLU's sigmoid slope: glu = gate * sigmoid({value} * gate) (silu has slope 1; GPT-OSS also "
        "multiplies by up + 1, clamped by swiglu_limit): model.py's experts compute it, the value read into "
        "args.extra by adapter.py"
    )


def _first_dense(cfg: dict[str, Any], value: Any) -> str:
    n = _int(value)
    if not n:
        return "0: every layer is MoE, nothing to change"
    first = "the first layer has" if n == 1 else f"the first {n} layers have"
    return (
        f"{first} a dense MLP, the rest MoE: TransformerArgs.dense_layers = list(range({n})) in adapter.py's "
        "extra_args_from_hf"
    )


def _moe_layers(cfg: dict[str, Any], value: Any) -> str:
    n = _int(cfg.get("num_hidden_layers")) or 0
    if not isinstance(value, list):
        return "the MoE layers' indices: read them and set TransformerArgs.dense_layers to the others"
    dense = [i for i in range(n) if i not in value]
    if not dense:
        return "every layer is MoE: TransformerArgs.dense_layers = [] (the default), nothing to change"
    return f"the other layers are dense: TransformerArgs.dense_layers = {dense} in adapter.py's extra_args_from_hf"


def _moe_step(cfg: dict[str, Any], value: Any) -> str:
    if value == 1:
        return "every layer is MoE: TransformerArgs.moe_every = 1 (the default), nothing to change"
    return (
        f"layers i with (i + 1) % {value} == 0 are MoE, the rest dense: TransformerArgs.moe_every = {value} in "
        "adapter.py's extra_args_from_hf"
    )


def _shared_experts(cfg: dict[str, Any], value: Any) -> str:
    n, width = _int(value), _int(cfg.get("moe_intermediate_size"))
    if not n:
        return "no shared expert: nothing to change"
    size = f" = {n * width}" if width else ""
    return (
        f"{n} shared expert(s), one dense SwiGLU of n_shared_experts * moe_intermediate_size{size} every token "
        f"goes through, added to the routed experts' output: args.shared_expert_hidden_dim{size} in adapter.py's "
        "extra_args_from_hf (MoE(..., shared_hidden_dim=...) builds it), its weights mapped to moe.shared_expert.*"
    )


def _shared_width(cfg: dict[str, Any], value: Any) -> str:
    return (
        f"the shared expert's hidden width: args.shared_expert_hidden_dim = {value} in adapter.py's "
        "extra_args_from_hf (titan_core's MoE adds it ungated; a shared_expert_gate upstream is model.py's)"
    )


def _groups(cfg: dict[str, Any], value: Any) -> str:
    groups, keep = _int(cfg.get("n_group")) or 1, _int(cfg.get("topk_group")) or 1
    if groups <= 1 or keep >= groups:
        return "one expert group (or all kept): group-limited routing is plain top-k, nothing to change"
    return (
        f"group-limited routing: the experts fall in {groups} groups and each token keeps the {keep} groups with "
        "the highest sum of their top-2 scores, then picks its top-k among their experts: the port's own router "
        "(titan_core's Router picks among all experts)"
    )


def _routed_scale(cfg: dict[str, Any], value: Any) -> str:
    if value == 1 or value == 1.0:
        return "1.0: nothing to change"
    return (
        f"the routed experts' weights are multiplied by {value} after the top-k (after norm_topk_prob's "
        "renormalisation): the port's router or MoE, the factor read into args.extra by adapter.py"
    )


def _scoring(cfg: dict[str, Any], value: Any) -> str:
    if str(value).lower() == "softmax":
        return "softmax scores, as titan_core's Router: nothing to change"
    return f"router scores by {value!r} instead of a softmax over all experts: the port's own router"


def _mla(cfg: dict[str, Any], value: Any) -> str:
    return (
        "a size of multi-head latent attention (DeepSeek MLA; the upstream tensors' MLA line names its weights): "
        "model.py's own attention reads it from args.extra, put there by adapter.py"
    )


def _rope_flag(cfg: dict[str, Any], value: Any) -> str:
    if not value:
        return "RoPE on the two halves of each head, as the families' apply_rope: nothing to change"
    return "RoPE on adjacent pairs (interleaved): the RoPE layout line says what to change"


KEY_CHANGES = {
    **{key: _mla for key in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")},
    **{key: _rope_flag for key in ROPE_FLAGS},
    "no_rope_layers": _no_rope_layers,
    "no_rope_layer_interval": _no_rope_interval,
    "swiglu_limit": _swiglu_limit,
    "swiglu_alpha": _swiglu_alpha,
    "first_k_dense_replace": _first_dense,
    "moe_layers": _moe_layers,
    "interleave_moe_layer_step": _moe_step,
    "decoder_sparse_step": _moe_step,
    "n_shared_experts": _shared_experts,
    "shared_expert_intermediate_size": _shared_width,
    "n_group": _groups,
    "topk_group": _groups,
    "routed_scaling_factor": _routed_scale,
    "scoring_func": _scoring,
    "norm_topk_prob": lambda cfg, v: f"TransformerArgs.norm_topk_prob = {bool(v)} in adapter.py's extra_args_from_hf "
    "(renormalise the kept top-k weights to sum to 1)",
    "num_experts_per_tok": lambda cfg, v: f"TransformerArgs.top_k = {v} in adapter.py's extra_args_from_hf",
    "n_routed_experts": lambda cfg, v: f"TransformerArgs.n_experts = {v} in adapter.py's extra_args_from_hf",
    "num_local_experts": lambda cfg, v: f"TransformerArgs.n_experts = {v} in adapter.py's extra_args_from_hf",
    "moe_intermediate_size": lambda cfg, v: f"TransformerArgs.moe_hidden_dim = {v} (each routed expert's width) "
    "in adapter.py's extra_args_from_hf",
}
"""{config key: its value -> the concrete change a port makes}, for keys of a known pattern."""


def key_change(cfg: dict[str, Any], key: str) -> str | None:
    """The concrete change a port makes for config key `key` of `cfg`, from its value; None when the
    key is of no known pattern (the scaffold's generic hint applies)."""
    change = KEY_CHANGES.get(key)
    # the value is the config's text: made visible, as every line of the TODOs and the README is
    return visible(change(cfg, cfg[key])) if change is not None and key in cfg else None
