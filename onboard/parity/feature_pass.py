"""The features pass of parity (onboard/parity/features.py says what each feature is and when it
counts as exercised): the upstream weights scaled, in place, until every soft-cap the seeded pass
left idle clips, and routers rebalanced where an expert got no token. The native model receives
the same checkpoint through the adapter."""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from onboard.parity import active_range
from onboard.parity.features import Feature, Probe, _then


def _attention_keys(sd: dict[str, torch.Tensor]) -> tuple[list[str], int]:
    """(keys to scale, power of the factor in the scores): QK-norm weights and q/k projections. Both:
    a norm after the projection undoes the projection's factor, and a model may normalise one side or
    one kind of layer only (Dots3-Note's LayerNorm on k alone, an RMSNorm on both elsewhere); where
    both act the search's next round sees the larger step and stops sooner."""
    norms = [k for k in sd if re.search(r"\.(q_norm|k_norm)\.weight$", k)]
    return norms + [k for k in sd if QK_PROJ.search(k)], 2


QK_PROJ = re.compile(
    r"\.(q_proj|k_proj|qkv_proj|query_key_value|Wqkv|c_attn|q_b_proj|kv_b_proj|kv_a_proj_with_mqa)\.(?:\w+\.)*(weight|bias)$"
)
"""The projections q and k come from, under the names transformers' models give them, a wrapped linear
included (Moshi's `q_proj.linear.weight`); a fused q/k/v scales v too, which the scores do not see;
latent attention's up-projections after its norms (`q_b_proj`, `kv_b_proj`) and the un-normalised
RoPE part of k (`kv_a_proj_with_mqa`)."""


FINAL_NORM_NAMES = ("norm", "final_layernorm", "final_norm")
"""What the norm before the head is called; preferred over other norms outside the layers (Gemma-3n's
per_layer_projection_norm, which normalises the per-layer inputs, comes after `model.norm`)."""


def _final_keys(model: nn.Module, sd: dict[str, torch.Tensor]) -> list[str]:
    norms = [k for k in sd if k.endswith("norm.weight") and not re.search(r"\.\d+\.", k)]
    final = [k for k in norms if k.removesuffix(".weight").rpartition(".")[2] in FINAL_NORM_NAMES]
    if final or norms:
        return (final or norms)[-1:]
    head = model.get_output_embeddings().weight
    if head is model.get_input_embeddings().weight:
        return []  # a tied head: scaling it would scale the embedding too
    return [k for k, v in sd.items() if v.data_ptr() == head.data_ptr()]


@torch.no_grad()
def _scale(model: nn.Module, keys: list[str], factor: float) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    for key in keys:
        params[key].mul_(factor)


@torch.no_grad()
def _balance_routers(model: nn.Module, features: dict[str, Feature], tokens, params) -> int:
    """Project every router's weight off the mean direction of its inputs, then aim each expert still
    starved at a token (`_aim_starved`), until every expert gets tokens; returns the rounds spent.
    Hidden states of random tokens share a large common component after a few layers, and routing on
    it sends every token to the same experts."""
    need = int(params["feature_min_tokens_per_expert"])
    for rounds in range(int(params["feature_search_rounds"])):
        with Probe(model, features, sample=True) as probe:
            model(input_ids=tokens, use_cache=False)
        if probe.min_tokens_per_expert()[0] >= need:
            return rounds
        routers = probe.routers()
        for name, x in probe.router_inputs.items():
            if name not in routers:  # counted from the experts it names, no weight of its own to turn
                continue
            mean = x.float().mean(0)
            if float(mean.norm()) == 0.0:
                continue
            u = (mean / mean.norm()).to(routers[name].weight.dtype)
            w = routers[name].weight
            w.sub_((w @ u)[:, None] * u[None, :])
            if rounds:  # the mean direction is off already: aim each starved expert at a token of its own
                _aim_starved(w, x.float() - mean, probe.expert_counts.get(name), need)
    return int(params["feature_search_rounds"])


def _aim_starved(w: torch.Tensor, centred: torch.Tensor, counts: torch.Tensor | None, need: int) -> None:
    """Point the router row of each expert that got under `need` tokens along the (centred) input of
    the token it came closest to winning, three times as long as the longest row: it then wins that
    token and those like it. Laguna's sigmoid router left one of 4 experts without a token in 1024,
    with or without the mean direction."""
    if counts is None:
        return
    e = counts.numel()
    scores = centred @ w[:e].float().T
    length = float(w[:e].float().norm(dim=1).max()) * 3
    for j in (counts < need).nonzero().flatten().tolist():
        margin = scores[:, j] - scores.max(dim=-1).values
        d = centred[int(margin.argmax())]
        if float(d.norm()) > 0:
            w[j] = (d / d.norm() * length).to(w.dtype)


def prepare_feature_pass(model: nn.Module, features: dict[str, Feature], tokens, params, seed: int = 0) -> str | None:
    """Change the upstream weights in place until every declared feature the seeded pass left idle is
    active; say how. None when no feature needs a second pass.

    In order, each step seeing the ones before: zero tensors drawn (active_range.draw_zeros), clamps'
    gate/up weights scaled, q/k scaled until each soft-cap clips and every kind of layer's scores spread,
    and last the routers rebalanced on the weights the pass will run. Each search
    round runs one upstream forward; a soft-cap's keys are multiplied by (cap / q)^(1/power), q the target
    quantile of the values that cap sees, until the clipped fraction reaches the minimum.
    """
    how = [h for h in (active_range.draw_zeros(model, features, seed, params),) if h]
    # a cap whose values could not be read (no eager attention upstream) cannot be searched for
    todo = [
        n
        for n in ("attention_softcap", "final_softcap")
        if features[n].declared and not features[n].exercised and features[n].value is not None
    ]
    sd = model.state_dict()
    keys = {"attention_softcap": _attention_keys(sd), "final_softcap": (_final_keys(model, sd), 1)}
    kinds = features.get("layer_kinds")
    spread = kinds is not None and kinds.declared and not kinds.exercised and kinds.value is not None
    for n in todo + (["layer_kinds"] if spread else []):
        if not (keys["attention_softcap"] if n == "layer_kinds" else keys[n])[0]:
            why = "no weights found to scale (q/k projections or QK-norm; the final norm, or an untied head)"
            features[n].how = _then(features[n].how, why)
    todo = [n for n in todo if keys[n][0]]
    spread = spread and bool(keys["attention_softcap"][0])
    balance = features["experts"].declared and not features["experts"].exercised and features["experts"].value == 0
    how += [h for h in (active_range.scale_clamps(model, features, tokens, params),) if h]
    need, target = float(params["feature_softcap_clipped_min"]), float(params["feature_softcap_clipped_target"])
    max_scale = float(params["feature_max_scale"])
    scale = {n: 1.0 for n in todo + (["layer_kinds"] if spread else [])}
    for _ in range(int(params["feature_search_rounds"]) if scale else 0):
        with torch.no_grad(), Probe(model, features, sample=True) as probe:
            model(input_ids=tokens[:1], use_cache=False)  # one sequence is enough to set a scale
        stats = {"attention_softcap": probe.attention, "final_softcap": probe.final}
        todo = [n for n in todo if (stats[n].fraction or 0.0) < need and scale[n] < max_scale]
        widen = active_range.spread_gain(features, probe, params) if spread else None
        if not todo and widen is None:
            break
        gains = {}
        for n in todo:
            q, power = stats[n].quantile(1 - target), keys[n][1]
            cap = float(features[n].config["cap"])
            gains[n] = (cap / q) ** (1 / power) if q and math.isfinite(q) and q > 0 else 10.0
        if widen is not None:  # the same q/k keys as the attention soft-cap: one factor, the larger
            gains["attention_softcap"] = max(gains.get("attention_softcap", 1.0), widen)
        for n, gain in gains.items():
            gain = min(max(gain, 1.01), max_scale / scale.get(n, 1.0))
            _scale(model, keys[n][0], gain)
            scale[n] = scale.get(n, 1.0) * gain
    scale.pop("layer_kinds", None)
    for n, factor in scale.items():
        if factor == 1.0:
            continue
        k = keys[n][0]
        norms = any(re.search(r"\.(q_norm|k_norm)\.weight$", x) for x in k)
        what = k[0] if n == "final_softcap" else "QK-norm weights and q/k projections" if norms else "q/k projections"
        how.append(f"{what} x{factor:.3g}")
    # last: every scaling above moves the hidden states the routers see, so they are balanced on the
    # weights the pass will run (a clamp's scaled experts starved an expert of the next layer)
    if balance or (how and features["experts"].declared):
        rounds = _balance_routers(model, features, tokens, params)
        if balance or rounds:  # none spent: the changes above starved no expert
            how.append(f"router weights projected off their inputs' mean direction, starved experts aimed at a "
                       f"token ({rounds} rounds)")  # fmt: skip
    return ", ".join(how) if how else None
