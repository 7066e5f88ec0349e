"""Parity drives every declared nonlinearity into its active range, not only soft-caps and routing.

At the seeded init a port without GPT-OSS's expert clamp, or without DeepSeek-V3's score-correction
bias, computed the very numbers of the correct port: no activation reached the clamp's limit and the
bias is zero. Beyond features.py's soft-caps, windows, experts and padding, declared by (upstream
model or config) -> exercised when (numbers: `params:` of checklists/parity.yaml):

- `zero_tensors`: floating tensors of the upstream checkpoint still zero everywhere after the seeded
  init (a router's score-correction buffer, a one-element gate: onboard/upstream/hf_model.py's
  perturb_constants already draws constant parameters), where a port that drops or misplaces one
  computes the same thing -> every one non-zero in a pass (the features pass draws each from
  N(0, feature_zero_std), small beside the spread of sigmoid router scores, so routing still varies);
- `clamp_<key>`: a clamp the upstream forward applies with a bound equal to a number of the config
  (GPT-OSS's `swiglu_limit`), found by watching every clamp (watch.ClampWatch) -> at least
  feature_clamp_clipped_min of the values it sees lie beyond the bound (the features pass scales the
  gate/up weights of the module that clamps);
- `attention_sinks`: a `sinks` parameter of an upstream attention module -> on every layer the sink
  takes at least feature_sink_mass_min of the attention mass;
- `layer_kinds`: per-layer attention switches (NoPE layers: `no_rope_layers`; windowed and global
  layers: `layer_types`, `sliding_window`) -> on every kind of layer the scores spread by at least
  feature_score_spread_min (watch.ScoreWatch; at the seeded init they spread by ~0.02, where a rotation
  or a key hidden moves the output by ~1e-4 relative). The features pass scales q and k until they do;
  a layer that normalises q and k without a weight (Llama-4's RoPE layers, ~0.96) cannot be scaled,
  so the bound sits below what such a layer gives.
Dense and MoE layers side by side need no pass: their keys differ, and parity's state-dict check
compares every key.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

from onboard.parity.features import Feature, Probe, _text_config, _then

SINK_NAMES = ("sinks", "s_aux")
"""What an upstream attention module calls its per-head sink logits."""

GATE_UP = re.compile(r"(gate|up|w1|w3|fc1|wi)", re.IGNORECASE)
DOWN = re.compile(r"(down|w2|fc2|wo)", re.IGNORECASE)


def fold(names: list[str]) -> list[str]:
    """Names with their layer index folded (`model.layers.{i}.mlp.bias`), each once, in order."""
    out: list[str] = []
    for n in names:
        f = re.sub(r"\.layers\.\d+\.", ".layers.{i}.", n)
        if f not in out:
            out.append(f)
    return out


def layer_kinds(config) -> list[str]:
    """Each upstream layer's attention kind: RoPE or NoPE, sliding or full (empty: one plain kind only)."""
    c = _text_config(config)
    n = int(getattr(c, "num_hidden_layers", 0) or 0)
    rope = getattr(c, "no_rope_layers", None)  # 1: the layer rotates q and k (SmolLM3, Llama-4)
    rope = [bool(x) for x in rope] if isinstance(rope, (list, tuple)) and len(rope) == n else [True] * n
    window = getattr(c, "sliding_window", None)
    types = getattr(c, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(types) == n:
        windowed = [bool(window) and t == "sliding_attention" for t in types]
    else:
        windowed = [bool(window) and getattr(c, "use_sliding_window", True) is not False] * n
    if all(rope) and not any(windowed):
        return []
    return [f"{'RoPE' if r else 'NoPE'} {'sliding' if w else 'full'}" for r, w in zip(rope, windowed)]


def declare_model(hf: nn.Module, declared: dict[str, Feature]) -> None:
    """Add the features read from the upstream model itself (its tensors and its config's layer kinds)."""
    zeros = [k for k, v in hf.state_dict().items() if v.is_floating_point() and v.numel() and not bool(v.any())]
    declared["zero_tensors"] = Feature(
        "zero_tensors", "tensors zero at init", bool(zeros), config={"tensors": fold(zeros)} if zeros else {}
    )
    sinks = [n for n, _ in hf.named_parameters() if n.rpartition(".")[2] in SINK_NAMES]
    declared["attention_sinks"] = Feature(
        "attention_sinks", "attention sinks", bool(sinks), config={"parameters": fold(sinks)} if sinks else {}
    )
    kinds = layer_kinds(hf.config)
    declared["layer_kinds"] = Feature(
        "layer_kinds", "per-layer attention kinds", bool(kinds),
        config={"kinds": sorted(set(kinds)), "layers": kinds} if kinds else {},
    )  # fmt: skip


NOT_A_LIMIT = re.compile(r"eps|init|range|std|dropout|theta|size|num_|max_position|vocab|token_id|layers")
"""Config numbers that are not an activation's limit (a norm's `clamp(min=eps)` is numerical safety)."""


def config_numbers(config) -> dict[str, float]:
    """The config's plain numbers that could be an activation's limit: above 1 in magnitude (0 and +-1
    bound too many things to name one, an epsilon is a norm's safety) and not sizes, ids or ranges."""
    c = _text_config(config)
    values = c.to_dict() if hasattr(c, "to_dict") else vars(c)
    return {
        k: float(v) for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 1.0 < abs(v) < 1e4
        and not NOT_A_LIMIT.search(k)
    }  # fmt: skip


def clamp_key(bound: float, numbers: dict[str, float]) -> str | None:
    return next((k for k, v in numbers.items() if math.isclose(abs(bound), abs(v), rel_tol=1e-6)), None)


def discover_clamps(declared: dict[str, Feature], probe: Probe, config) -> None:
    """Declare `clamp_<key>` for each clamp the forward ran with a bound equal to a config number."""
    numbers = config_numbers(config)
    for site in probe.clamps.sites.values():
        key = clamp_key(site.bound(), numbers)
        name = f"clamp_{key}"
        if key is None or name in declared:
            continue
        declared[name] = Feature(name, f"clamp at {key}", True, config={"key": key, "bound": numbers[key]})


def _clamp_sites(probe: Probe, key: str, numbers: dict[str, float]) -> list:
    return [s for s in probe.clamps.sites.values() if clamp_key(s.bound(), numbers) == key]


def record_more(declared: dict[str, Feature], probe: Probe, hf: nn.Module, pass_name: str, params, how: str) -> None:
    """Fill in this module's features from the pass just run, unless an earlier pass exercised them."""
    discover_clamps(declared, probe, hf.config)
    numbers = config_numbers(hf.config)
    for name, f in declared.items():
        if not f.declared or f.exercised:
            continue
        if name == "zero_tensors":
            _record_zeros(f, hf, pass_name, how)
        elif name.startswith("clamp_"):
            sites = _clamp_sites(probe, f.config["key"], numbers)
            seen, clipped = sum(s.seen for s in sites), sum(s.clipped for s in sites)
            f.value, f.pass_name = (clipped / seen if seen else 0.0), pass_name
            f.exercised = f.value >= float(params["feature_clamp_clipped_min"])
            where = ", ".join(fold(sorted({s.module for s in sites}))) or "no module"
            f.how = _then(f.how, f"{f.value:.1%} of the values clamped at {f.config['key']} = {f.config['bound']:g} "
                                 f"lay beyond it ({where}) in the {pass_name} pass{how}")  # fmt: skip
        elif name == "attention_sinks":
            _record_layers(f, probe.scores.layer_sink_mass(), hf, float(params["feature_sink_mass_min"]),
                           "the sink's share of attention", pass_name, how)  # fmt: skip
        elif name == "layer_kinds":
            _record_kinds(f, probe.scores.layer_spread(), float(params["feature_score_spread_min"]), pass_name, how)


def _record_zeros(f: Feature, hf: nn.Module, pass_name: str, how: str) -> None:
    sd = hf.state_dict()
    names = [k for k in sd if k in _zero_names(f, sd)]
    still = [k for k in names if not bool(sd[k].any())]
    f.value, f.pass_name, f.exercised = len(names) - len(still), pass_name, not still
    shown = ", ".join(f.config["tensors"][:6]) + (" ..." if len(f.config["tensors"]) > 6 else "")
    f.how = _then(f.how, f"{len(names) - len(still)} of {len(names)} tensors zero at init ({shown}) non-zero "
                         f"in the {pass_name} pass{how}")  # fmt: skip


def _zero_names(f: Feature, sd: dict[str, torch.Tensor]) -> set[str]:
    folded = set(f.config["tensors"])
    return {k for k in sd if re.sub(r"\.layers\.\d+\.", ".layers.{i}.", k) in folded}


def _record_layers(f: Feature, per_layer: dict[int, float], hf, need: float, what: str, pass_name, how) -> None:
    if not per_layer:
        f.exercised = False
        f.how = _then(f.how, "not measured: the upstream attention was not the eager implementation parity wraps")
        return
    worst = min(per_layer, key=per_layer.get)
    f.value, f.pass_name = per_layer[worst], pass_name
    f.exercised = f.value >= need
    f.how = _then(f.how, f"{what} >= {f.value:.3g} on every layer (least: layer {worst}; needs >= {need:g}) "
                         f"in the {pass_name} pass{how}")  # fmt: skip


def _record_kinds(f: Feature, spread: dict[int, float], need: float, pass_name: str, how: str) -> None:
    kinds = f.config["layers"]
    per_kind = {k: min((v for i, v in spread.items() if i < len(kinds) and kinds[i] == k), default=None)
                for k in f.config["kinds"]}  # fmt: skip
    if any(v is None for v in per_kind.values()):
        f.exercised = False
        f.how = _then(f.how, "not measured on every kind of layer: the upstream attention was not the eager "
                             "implementation parity wraps")  # fmt: skip
        return
    f.value, f.pass_name = min(per_kind.values()), pass_name
    f.exercised = f.value >= need
    each = ", ".join(f"{k} {v:.3g}" for k, v in per_kind.items())
    f.how = _then(f.how, f"scores spread (std over the keys a query sees) {each}; needs >= {need:g} on every "
                         f"kind, in the {pass_name} pass{how}")  # fmt: skip


# ---- the features pass's share ----------------------------------------------------------------
@torch.no_grad()
def draw_zeros(model: nn.Module, declared: dict[str, Feature], seed: int, params) -> str | None:
    """Draw every zero tensor of the upstream checkpoint from N(0, feature_zero_std), in place."""
    f = declared.get("zero_tensors")
    if f is None or not f.declared or f.exercised:
        return None
    gen, std = torch.Generator().manual_seed(seed), float(params["feature_zero_std"])
    sd = model.state_dict()
    names = sorted(_zero_names(f, sd))
    for k in names:
        t = sd[k]
        t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float64).mul_(std).to(t.dtype))
    return f"{len(names)} zero tensors drawn from N(0, {std:g})"


def _clamp_keys(model: nn.Module, module: str) -> list[tuple[nn.Parameter, str]]:
    """The parameters feeding a clamp in `module`: its gate/up weights and biases (not down), its own
    (GPT-OSS's experts hold `gate_up_proj`) or its children's (a dense MLP's `gate_up_proj.weight`)."""
    mod = model.get_submodule(module) if module else model
    own = [(p, n) for n, p in mod.named_parameters() if p.is_floating_point()]
    picked = [(p, n) for p, n in own if GATE_UP.search(n) and not DOWN.search(n)]
    return picked or [(p, n) for p, n in own if not DOWN.search(n)]


@torch.no_grad()
def scale_clamps(model: nn.Module, declared: dict[str, Feature], tokens, params) -> str | None:
    """Scale the gate/up weights of each module whose config-bounded clamp stayed idle until
    feature_clamp_clipped_target of its values lie beyond the bound (one upstream forward a round)."""
    todo = [n for n, f in declared.items() if n.startswith("clamp_") and f.declared and not f.exercised]
    if not todo:
        return None
    numbers = config_numbers(model.config)
    need, target = float(params["feature_clamp_clipped_min"]), float(params["feature_clamp_clipped_target"])
    max_scale = float(params["feature_max_scale"])
    scale: dict[str, float] = {}
    stuck: set[str] = set()
    for _ in range(int(params["feature_search_rounds"])):
        with Probe(model, declared, sample=True) as probe:
            model(input_ids=tokens[:1], use_cache=False)
        short: dict[str, list] = {}  # module -> its clamps still short of the minimum
        for name in todo:
            for site in _clamp_sites(probe, declared[name].config["key"], numbers):
                if site.fraction < need and scale.get(site.module, 1.0) < max_scale and site.module not in stuck:
                    short.setdefault(site.module, []).append(site)
        if not short:
            break
        for module, sites in short.items():  # one factor per module: its clamps share the weights scaled
            gains = []
            for site in sites:
                q = site.quantile(1 - target)
                gains.append(site.bound() / q if q and math.isfinite(q) and q > 0 else 10.0)
            gain = min(max(max(gains), 1.01), max_scale / scale.get(module, 1.0))
            weights = _clamp_keys(model, module)
            if not weights:  # nothing to scale: left idle, and said so by the record of the pass
                stuck.add(module)
                continue
            for p, _n in weights:
                p.mul_(gain)
            scale[module] = scale.get(module, 1.0) * gain
    if not scale:
        return None
    mods = ", ".join(f"{m} x{s:.3g}" for m, s in list(scale.items())[:3]) + (" ..." if len(scale) > 3 else "")
    return f"gate/up weights of the clamping modules scaled ({mods})"


def spread_gain(declared: dict[str, Feature], probe: Probe, params) -> float | None:
    """The factor on q and k (scores scale with its square) that brings the least-spread kind of layer
    to feature_score_spread_target; None when every kind spreads enough already."""
    f = declared.get("layer_kinds")
    if f is None or not f.declared or f.exercised:
        return None
    spread = probe.scores.layer_spread()
    if not spread:
        return None
    low = min(spread.values())
    if low >= float(params["feature_score_spread_min"]):
        return None
    return math.sqrt(float(params["feature_score_spread_target"]) / max(low, 1e-12))


LIMIT_KEY = re.compile(r"limit|clamp|clip", re.IGNORECASE)
"""Config keys that name an activation's limit: a port that reads one must show a pass where it bites."""


def unreached_keys(config, declared: dict[str, Feature], unconsumed: list[str] | None) -> list[str]:
    """Config keys naming a limit (LIMIT_KEY, a positive number) that the port consumes (not in its
    adapter's `unconsumed_keys`) and for which no clamp bounded by that number ran upstream: no pass
    could have reached them. Each as "key (why)", beside features.idle's entries. For a port or a
    native family only: on the transformers path the upstream class's own code applies such a key on
    both sides (Gemma-3n's `altup_coef_clip` clips weights in training mode, never in a forward parity
    runs), so there is no second implementation for a pass to catch out."""
    c = _text_config(config)
    values = c.to_dict() if hasattr(c, "to_dict") else vars(c)
    skip = set(unconsumed or [])
    out = []
    for k, v in values.items():
        if k in skip or not LIMIT_KEY.search(k) or isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            continue
        if f"clamp_{k}" not in declared:
            out.append(f"{k} (the config sets {v!r} and the port reads it, but no upstream clamp ran with that "
                       f"bound: no parity pass reached it)")  # fmt: skip
    return out


def feature_summary(declared: dict[str, Feature]) -> list[str]:
    """What each pass proved: "name (pass): how" for every exercised feature."""
    return [f"{n} ({f.pass_name}): {f.how}" for n, f in declared.items() if f.declared and f.exercised]
