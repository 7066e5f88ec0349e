"""Upstream tensors the workspace adapter has no name for, or names in another layout.

arch_diff.py compares decoder layers by their modules; a tensor that is no module's weight (GPT-OSS's
attention `sinks`, a router's bias, DeepSeek-V3's persistent `e_score_correction_bias` buffer, the
experts' biases) slips through that, and a porter then finds it only by reading transformers'
modeling file or when the parity gate cannot load the checkpoint. So every parameter and every
persistent buffer of the upstream model (built on meta) is checked against what the workspace's
adapter maps, in the direction a checkpoint is read: the family adapter's key table (`layer_keys()`),
the names its fused layouts emit (`to_hf` of the family's own model on meta) and, for an indexed
name (`experts.{j}.gate_proj`), its `layer_from_hf` accepting them together. Each tensor it has no
name for, or names with the hidden width on another axis or gate/up interleaved, is one entry: its
module class, its name with the layer folded (`model.layers.{i}.self_attn.sinks`, the layers that
have it), the config keys that drive it and the change a port makes, concrete for the patterns
known here (PATTERN_KEYS), generic otherwise. The tensors it does name go through its
`layer_from_hf` on meta too: a refusal there (fused shapes that disagree) is one more line. The
parity gate remains what proves the port.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from onboard.sanitize import visible
from onboard.upstream.tensors import StateTensor, fold, state_tensors
from titan_core.models import build_meta, get_family
from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.hf_adapter import NEUTRAL_KEYS, TOP_KEYS
from titan_core.models.common.mapping_errors import AdapterError

LAYER_PREFIX = "model.layers."
"""Where every family adapter reads a decoder layer's tensors (`model.layers.<i>.<suffix>`)."""
# what an adapter or a module's code may raise on meta tensors it cannot take (not a finding)
META_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, KeyError, NotImplementedError)
EXPERT_COUNT = ("num_local_experts", "num_experts", "n_routed_experts")
PATTERN_KEYS: dict[str, tuple[str, ...]] = {
    "sinks": (),  # no key makes them: upstream builds them on every attention
    "score_correction": ("n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "scoring_func",
                         "topk_method", *EXPERT_COUNT),
    "router": (*EXPERT_COUNT, "num_experts_per_tok", "norm_topk_prob"),
    "router_bias": (*EXPERT_COUNT, "num_experts_per_tok"),
    "expert_bias": (*EXPERT_COUNT, "moe_intermediate_size"),
    "gate_up_interleaved": (*EXPERT_COUNT, "moe_intermediate_size", "swiglu_limit", "swiglu_alpha"),
    "experts": (*EXPERT_COUNT, "num_experts_per_tok", "moe_intermediate_size"),
    "shared_expert": ("n_shared_experts", "shared_expert_intermediate_size", "moe_intermediate_size"),
    "shared_expert_gate": ("shared_expert_intermediate_size",),
    "fused_qkv": ("num_attention_heads", "num_key_value_heads", "head_dim"),
    "fused_gate_up": ("intermediate_size",),
    "mla": ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"),
    "norm": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"),
    "norm_bias": ("layer_norm_eps", "layer_norm_epsilon", "norm_eps", "rms_norm_eps"),
}  # fmt: skip
"""The known patterns and the config keys that drive each (those present in the config are listed)."""
FALLBACK_KEYS: dict[str, tuple[str, ...]] = {"shared_expert": ("intermediate_size",)}
"""Where none of a pattern's own keys is in the config: Llama-4 sizes its shared expert by intermediate_size."""
STOP_WORDS = frozenset({"model", "layers", "layer", "weight", "bias", "proj", "self", "with", "num", "size",
                        "hidden", "mlp", "attn", "the", "of", "to", "in"})  # fmt: skip
"""Words too common in tensor and config names to say that a key drives a tensor."""


@dataclass(frozen=True)
class UpstreamTensor:
    """One upstream tensor (all layers that have it) the adapter has no name for, or names in another layout."""

    name: str
    """Its state-dict name, layer folded: `model.layers.{i}.self_attn.sinks`."""
    layers: tuple[int, ...]
    """The decoder layers that have it (empty outside them)."""
    buffer: bool
    """A persistent buffer (True) or a parameter."""
    owner: str
    """The module whose code computes with it, layer folded: `model.layers.{i}.self_attn`."""
    owner_class: str
    shape: tuple[int, ...]
    status: str
    """'unmapped' (the adapter has no name for it) or 'layout' (it has, for another layout)."""
    pattern: str | None
    """The known pattern (a key of PATTERN_KEYS), None when none fits."""
    config_keys: tuple[str, ...]
    change: str
    """What a port changes for it (concrete for a known pattern)."""
    detail: str = ""
    """For 'layout': what differs."""
    suffix: str = ""
    """The name after `model.layers.{i}.` (the whole name outside the layers): what adapter.py maps."""
    interleaved: bool = False
    """Its module's code takes gate and up as alternate entries (`[..., ::2]`, `[..., 1::2]`)."""


@dataclass
class AdapterNames:
    """What an adapter maps: per-layer HF suffixes, their shapes as `to_hf` emits them, top-level names."""

    layer: set[str] = field(default_factory=set)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    top: set[str] = field(default_factory=set)


def adapter_names(adapter, native: nn.Module) -> AdapterNames:
    """The HF names `adapter` reads: its key table, plus what it emits for the family's own model
    (`native`, on meta), which covers the fused layouts its hooks write (experts' gate_up_proj)."""
    names = AdapterNames(layer=set(adapter.layer_keys().values()), top=set(TOP_KEYS.values()))
    try:
        hf = adapter.to_hf(native.state_dict())
    except (AdapterError, *META_ERRORS):  # the table alone then
        hf = {}
    for key, value in hf.items():
        if key.startswith(LAYER_PREFIX):
            suffix = key[len(LAYER_PREFIX) :].partition(".")[2]
            names.layer.add(suffix)
            names.shapes.setdefault(suffix, tuple(value.shape))
        else:
            names.top.add(key)
    return names


@functools.lru_cache(maxsize=None)
def interleaves_gate_up(cls: type) -> bool:
    """Whether a module class's code takes gate and up as alternate entries of one fused tensor
    (`gate_up[..., ::2]`, `gate_up[..., 1::2]`, GPT-OSS) rather than its two halves."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return bool(re.search(r"\[\s*\.\.\.\s*,\s*::2\s*\]", src)) and "1::2" in src


def pattern_of(t: StateTensor, rest: str) -> str | None:
    """The known pattern of an upstream tensor by its name and module (first that fits), else None."""
    leaf, low = t.leaf.lower(), rest.lower()
    module_leaf = t.module.rpartition(".")[2].lower()
    if "sink" in leaf:
        return "sinks"
    if "correction" in leaf:
        return "score_correction"
    if "shared_expert_gate" in low:
        return "shared_expert_gate"
    if "shared_expert" in low:
        return "shared_expert"
    if module_leaf in ("router", "gate") or "router" in t.owner_class.lower():
        return "router_bias" if leaf == "bias" else "router"
    if "expert" in low and leaf.endswith("bias"):
        return "expert_bias"
    if "gate_up" in leaf or "gate_up" in module_leaf:
        if interleaves_gate_up(t.owner_type):
            return "gate_up_interleaved"
        return "experts" if "expert" in low else "fused_gate_up"
    if "expert" in low:
        return "experts"
    if any(k in low for k in ("qkv", "query_key_value", "c_attn")):
        return "fused_qkv"
    if any(k in low for k in ("kv_a_", "kv_b_", "q_a_", "q_b_")):
        return "mla"
    if "norm" in module_leaf or "norm" in t.owner_class.lower():
        return "norm_bias" if leaf == "bias" else "norm"
    return None


def change_for(pattern: str | None, *, rest: str, family: str, interleaved: bool, layout: bool = False) -> str:
    """The change a port makes for a tensor of `pattern` (upstream suffix `rest`); `layout`: the
    adapter names it, for another layout (the detail says which)."""
    mapped = f"map `{rest}` in adapter.py's layer_keys (or layer_from_hf / layer_group_to_hf)"
    if layout and pattern not in ("gate_up_interleaved", "experts"):
        return (
            f"model.py's module takes upstream's layout, or adapter.py's layer hooks reshape / transpose `{rest}` "
            "(renames and reshapes only, so the round trip stays exact)"
        )
    texts = {
        "sinks": (
            "attention sinks: one learned logit per head joins every softmax as one more key with no value "
            "(a query may attend to nothing): in model.py hold `sinks = nn.Parameter(torch.empty(n_heads))` on the "
            "attention and override its forward to call the core with `sinks=self.sinks`; the naive core "
            "(NaiveAttention) takes `sinks=`, sdpa has no such argument, so the core is a subclass of NaiveAttention "
            "(a kernel swap then refuses it instead of dropping the sinks); map `attention.sinks` <-> "
            f"`{rest}` in adapter.py's layer_keys and init it as upstream's _init_weights does"
        ),
        "score_correction": (
            "sigmoid routing with a score-correction bias (DeepSeek-V3 style): scores = sigmoid(router logits); "
            "the top-k experts are chosen by scores + this bias (within the topk_group best of n_group groups) but "
            "weighted by the uncorrected scores (renormalised when norm_topk_prob, times routed_scaling_factor); "
            "the bias is a persistent buffer the checkpoint carries and the optimizer never updates: register it "
            "with register_buffer(..., persistent=True) on the port's own router (titan_core's Router is softmax "
            f"top-k with no bias) and map `moe.router.e_score_correction_bias` <-> `{rest}` in adapter.py"
        ),
        "router": (
            "the router's weight: titan_core's Router holds it as `moe.router.gate.weight` (Linear(dim, n_experts, "
            f"bias=False), softmax over all experts, then top-k): map `{rest}` to it in adapter.py's layer_keys and "
            "check upstream's scoring against it (a softmax over the top-k logits alone equals, in exact "
            "arithmetic, Router with norm_topk_prob = True; sigmoid scores need a router of the port's own)"
        ),
        "router_bias": (
            "a bias on the router logits (it moves both which experts are chosen and their weights): titan_core's "
            "Router has Linear(dim, n_experts, bias=False): build the port's router gate with bias=True and map "
            f"`moe.router.gate.bias` <-> `{rest}` in adapter.py's layer_keys"
        ),
        "expert_bias": (
            "a bias on each expert's projection ([n_experts, out], added after that expert's matmul, ungated: each "
            "chosen expert adds its own before the routing weight multiplies): titan_core's Experts has none, so "
            f"model.py's experts hold them and add them in their forward; {mapped}"
            + (
                "; the gate/up bias is interleaved like gate_up_proj: gate bias = b[..., ::2], up bias = b[..., 1::2]"
                if interleaved and "gate_up" in rest
                else ""
            )
        ),
        "gate_up_interleaved": (
            "gate and up interleaved on the last dim: gate = gate_up[..., ::2], up = gate_up[..., 1::2] (not the "
            "two halves): adapter.py's layer_from_hf takes w1 (gate) and w3 (up) that way (transposed to [E, dim, "
            "hidden] when upstream stores [E, 2I, dim]), layer_group_to_hf interleaves them back with "
            "torch.stack((w1, w3), dim=-1).flatten(-2)"
        ),
        "experts": (
            "routed experts as 3-D tensors: titan_core's MoE (Router and Experts: w1/w3 [E, dim, hidden], w2 "
            "[E, hidden, dim], applied as x @ w) in model.py's Block, with n_experts, top_k and moe_hidden_dim read "
            f"in adapter.py; split or transpose `{rest}` in adapter.py's layer hooks (the qwen3_moe adapter's "
            "layer_from_hf splits a fused [E, 2I, dim] gate_up_proj into halves)"
        ),
        "shared_expert": (
            "a shared expert: a dense SwiGLU every token goes through, added to the routed experts' output "
            "(ungated): MoE(..., shared_hidden_dim=...) with args.shared_expert_hidden_dim = its hidden width "
            "(n_shared_experts * moe_intermediate_size in DeepSeek-style configs) read in adapter.py, and its "
            "gate_proj / up_proj / down_proj mapped to `moe.shared_expert.w1` / `w3` / `w2`"
        ),
        "shared_expert_gate": (
            "a learned per-token gate on the shared expert: out = routed + sigmoid(shared_expert_gate(x)) * "
            "shared_expert(x); titan_core's MoE adds the shared expert ungated: add `moe.shared_expert_gate` "
            f"(Linear(dim, 1, bias=False)) in model.py and map it to `{rest}`"
        ),
        "fused_qkv": (
            "fused q/k/v projection: adapter.py's layer_from_hf splits its rows into wq [n_heads * head_dim] and wk, "
            "wv [n_kv_heads * head_dim] each (in the order upstream slices them), layer_group_to_hf concatenates "
            "them back"
        ),
        "fused_gate_up": (
            "fused gate/up projection of a dense MLP: adapter.py's layer_from_hf splits its rows into w1 (gate) and "
            "w3 (up) in the order upstream's forward takes them (chunk(2): gate first), layer_group_to_hf "
            "concatenates them back"
        ),
        "mla": (
            "multi-head latent attention (DeepSeek MLA: low-rank q and kv projections, a norm on the kv latent, RoPE "
            "on qk_rope_head_dim of each head only): titan_core's Attention has no such projections, so model.py "
            f"builds its own attention with these weights; {mapped}"
        ),
        "norm": (
            f"a norm the {family} family's Block lacks: apply it where upstream does (the norm placement line "
            f"says where) and {mapped}"
        ),
        "norm_bias": (
            f"a norm's bias (a LayerNorm's): the {family} family's RMSNorm has none: nn.LayerNorm(dim, eps, "
            f"bias=True) in model.py (the norm type line) and {mapped}"
        ),
    }
    generic = f"read what upstream computes with it, build that in model.py and {mapped}"
    return texts.get(pattern, generic) if pattern else generic


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if len(w) > 1 and not w.isdigit()} - STOP_WORDS


def config_keys(cfg: dict[str, Any], pattern: str | None, rest: str) -> tuple[str, ...]:
    """The config keys that drive a tensor: the pattern's known keys present in `cfg`, else (best
    effort) the keys whose names share a word with the tensor's name."""
    for table in (PATTERN_KEYS, FALLBACK_KEYS):
        known = tuple(k for k in table.get(pattern or "", ()) if k in cfg)
        if known:
            return known
    mine = _words(rest)
    return tuple(sorted(k for k in cfg if isinstance(k, str) and k not in NEUTRAL_KEYS and _words(k) & mine))


def _width_axis(shape: tuple[int, ...], width: int) -> int | None:
    axes = [a for a, s in enumerate(shape) if s == width]
    return axes[0] if len(axes) == 1 else None  # absent or ambiguous: no evidence


def layout_detail(shape: tuple[int, ...], theirs: tuple[int, ...] | None, *, hidden: int, dim: int, family: str) -> str:
    """What differs between upstream's layout of a tensor and the adapter's (`theirs`), '' when nothing shows:
    a different rank, or the hidden width on another axis (the two models' widths may differ)."""
    if theirs is None or len(shape) < 2:
        return ""
    if len(theirs) != len(shape):
        return f"upstream's is {len(shape)}-D {list(shape)}, the {family} adapter's {len(theirs)}-D {list(theirs)}"
    up, nat = _width_axis(shape, hidden), _width_axis(theirs, dim)
    if up is None or nat is None or up == nat:
        return ""
    return (
        f"upstream stores {list(shape)}, the hidden width ({hidden}) on axis {up}; the {family} adapter emits "
        f"{list(theirs)}, its width ({dim}) on axis {nat}: transpose it in adapter.py's layer hooks"
    )


def _fold_path(path: str) -> str:
    """A module path with its layer index folded (`model.layers.{i}.self_attn`; the layer itself too)."""
    return fold(f"{path}.x")[0][:-2]


def _from_hf(adapter, i: int, entries: dict[str, Any]) -> tuple[bool, str]:
    """(whether `adapter.layer_from_hf` takes layer i's `entries`, its refusal: '' when none was said)."""
    inverse = {v: k for k, v in adapter.layer_keys().items()}
    try:
        adapter.layer_from_hf(i, entries, inverse)
    except AdapterError as e:
        return False, str(e)
    except META_ERRORS:
        return False, ""  # a hook that cannot run on meta tensors: nothing learned, nothing taken as mapped
    return True, ""


def shape_probe(family: str, args: TransformerArgs) -> tuple[nn.Module, int]:
    """(the family's model on meta, its hidden width) with `args` but a width no other size of it
    has, so the axis that holds the width says itself in every tensor the adapter emits."""
    sizes = (args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim, args.head_dim, args.ffn_hidden_dim,
             args.moe_hidden_dim, args.shared_expert_hidden_dim, args.vocab_size, args.n_experts)  # fmt: skip
    dim = max(sizes) * 2 + 8  # never a sum of two of them either (a fused gate_up's 2 * hidden)
    try:
        return build_meta(family, dataclasses.replace(args, dim=dim)), dim
    except (ValueError, TypeError, AdapterError):  # a family that ties its width to others: the args as read
        return build_meta(family, args), args.dim


def tensor_differences(
    model: nn.Module, cfg: dict[str, Any], family: str, args: TransformerArgs
) -> tuple[list[UpstreamTensor], dict[str, list[int]]]:
    """(the upstream tensors the `family` adapter has no name for or names in another layout, {its
    refusal of the tensors it does name, layer folded: the layers refused}) for transformers' `model`
    on meta; `args`: the family's args for this config (its debug flavor when it cannot read it)."""
    adapter = get_family(family).adapter
    native, dim = shape_probe(family, args)
    names = adapter_names(adapter, native)
    hidden = model.config.hidden_size
    found: dict[tuple[str, str, str], dict] = {}
    named: dict[int, dict[str, Any]] = {}  # per layer, what the adapter names: its layer_from_hf must take them
    indexed: dict[tuple[int, str], dict[str, Any]] = {}  # per layer, names with an inner index, by what precedes it
    rows = []
    for t in state_tensors(model):
        folded, i, rest = fold(t.key)
        if t.key.endswith("rotary_emb.inv_freq"):
            continue  # from_hf drops it: a derived buffer some checkpoints carry
        in_layer = i is not None and t.key.startswith(f"{LAYER_PREFIX}{i}.")
        mapped = rest in names.layer if in_layer else t.key in names.top
        if in_layer and not mapped and "{j}" in folded:  # per-expert modules: the hooks may take them together
            indexed.setdefault((i, folded.partition("{j}")[0]), {})[rest] = t.tensor
        rows.append((t, folded, i, rest, mapped))
        if in_layer and mapped:
            named.setdefault(i, {})[rest] = t.tensor
    accepted = {key for key, entries in indexed.items() if _from_hf(adapter, key[0], entries)[0]}
    refusals: dict[str, list[int]] = {}
    for i, entries in sorted(named.items()):
        refusal = _from_hf(adapter, i, entries)[1]
        if refusal:
            text = refusal.replace(f"{LAYER_PREFIX}{i}.", f"{LAYER_PREFIX}{{i}}.")
            refusals.setdefault(re.sub(rf"\blayer {i}\b", "layer {i}", text), []).append(i)
    for t, folded, i, rest, mapped in rows:
        if not mapped and i is not None and (i, folded.partition("{j}")[0]) in accepted:
            continue
        shape = tuple(t.tensor.shape)
        theirs = names.shapes.get(rest)
        detail = layout_detail(shape, theirs, hidden=hidden, dim=dim, family=family) if mapped else ""
        pattern = pattern_of(t, rest)
        if mapped and not detail and pattern != "gate_up_interleaved":
            continue  # the adapter names it in this layout
        interleaved = interleaves_gate_up(t.owner_type)
        if mapped and pattern == "gate_up_interleaved":
            detail = "; ".join(d for d in (detail, "upstream interleaves gate and up, the adapter splits halves") if d)
        entry = found.setdefault((folded, "unmapped" if not mapped else "layout", detail), {
            "t": t, "rest": rest, "layers": [], "shape": shape, "pattern": pattern, "interleaved": interleaved,
            "suffix": folded.partition("{i}.")[2] or folded,  # the name a change text gives, any layer's
        })  # fmt: skip
        if i is not None and i not in entry["layers"]:  # per-expert modules fold onto one name per layer
            entry["layers"].append(i)
    out = [
        UpstreamTensor(
            name=folded, layers=tuple(e["layers"]), buffer=e["t"].buffer, owner=_fold_path(e["t"].owner),
            owner_class=e["t"].owner_class, shape=e["shape"], status=status, pattern=e["pattern"],
            config_keys=config_keys(cfg, e["pattern"], e["rest"]),
            change=change_for(e["pattern"], rest=e["suffix"], family=family, interleaved=e["interleaved"],
                              layout=status == "layout"),
            detail=detail, suffix=e["suffix"], interleaved=e["interleaved"],
        )
        for (folded, status, detail), e in found.items()
    ]  # fmt: skip
    return out, refusals


# ---- lines for the README, the TODOs and new-model's output -------------------------------------
def layers_text(layers: tuple[int, ...] | list[int], n_layers: int) -> str:
    """'every layer', 'layers 1-60', 'layers 0, 4, 8' or 'outside the decoder layers'."""
    if not layers:
        return "outside the decoder layers"
    if len(layers) == n_layers:
        return "every layer"
    runs: list[list[int]] = []
    for i in sorted(layers):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    parts = [f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs]
    return f"layer{'s' if len(layers) > 1 else ''} {', '.join(parts)}"


def _value(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)  # escapes control characters: the value is the config's data
    return text if len(text) <= 40 else text[:37] + "..."


def keys_text(cfg: dict[str, Any], keys: tuple[str, ...]) -> str:
    return ", ".join(f"{visible(k)} = {_value(cfg[k])}" for k in keys) or "none found"


def tensor_lines(tensors: list[UpstreamTensor], cfg: dict[str, Any], *, family: str, n_layers: int) -> list[str]:
    """One line per module, status and pattern, its tensors named with their shapes."""
    groups: dict[tuple, list[UpstreamTensor]] = {}
    for t in tensors:
        groups.setdefault((t.owner, t.status, t.pattern, t.layers, t.detail), []).append(t)
    lines = []
    for (_, status, _, layers, detail), ts in groups.items():
        what = "has no name for" if status == "unmapped" else "names in another layout"
        plural = "s" if len(ts) > 1 else ""
        named = ", ".join(f"`{t.name}` {list(t.shape)}" + (" (persistent buffer)" if t.buffer else "") for t in ts)
        keys = tuple(dict.fromkeys(k for t in ts for k in t.config_keys))
        # one change for the module's tensors together, naming each of them
        rest = "` / `".join(t.suffix for t in ts)  # change_for quotes it: `a` / `b`
        interleaved = any(t.interleaved for t in ts)
        change = ts[0].change if len(ts) == 1 else change_for(
            ts[0].pattern, rest=rest, family=family, interleaved=interleaved, layout=status == "layout"
        )  # fmt: skip
        lines.append(
            f"upstream tensor{plural} the {family} adapter {what}: {named} ({ts[0].owner_class}, "
            f"{layers_text(layers, n_layers)}); config keys: {keys_text(cfg, keys)}: "
            + (f"{detail}: " if detail else "")
            + change
        )
    return lines


def refusal_lines(refusals: dict[str, list[int]], *, family: str, n_layers: int) -> list[str]:
    return [
        f"the {family} adapter refuses the upstream tensors it names ({layers_text(layers, n_layers)}): {text}: "
        "adapter.py overrides layer_from_hf and layer_group_to_hf for upstream's layout"
        for text, layers in refusals.items()
    ]
