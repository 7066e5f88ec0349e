"""The features pass of parity (onboard/parity/features.py says what each feature is and when it
counts as exercised): the upstream weights scaled, in place, until every soft-cap the seeded pass
left idle clips, and routers rebalanced where an expert got no token. The native model receives
the same checkpoint through the adapter."""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from onboard.parity.features import Feature, Probe, _then


def _attention_keys(sd: dict[str, torch.Tensor]) -> tuple[list[str], int]:
    """(keys to scale, power of the factor in the scores): QK-norm weights, else q/k projections."""
    norms = [k for k in sd if re.search(r"\.(q_norm|k_norm)\.weight$", k)]
    if norms:
        return norms, 2
    return [k for k in sd if re.search(r"\.(q_proj|k_proj)\.(weight|bias)$", k)], 2


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


def prepare_feature_pass(model: nn.Module, features: dict[str, Feature], tokens, params) -> str | None:
    """Scale the upstream weights in place until every unexercised soft-cap clips; say how.

    None when no feature needs a second pass. Each round runs one upstream forward; the
    scale of a cap's keys is multiplied by (cap / q)^(1/power), q the target quantile of
    the values that cap sees, until the clipped fraction reaches the minimum.
    """
    # a cap whose values could not be read (no eager attention upstream) cannot be searched for
    todo = [
        n
        for n in ("attention_softcap", "final_softcap")
        if features[n].declared and not features[n].exercised and features[n].value is not None
    ]
    sd = model.state_dict()
    keys = {"attention_softcap": _attention_keys(sd), "final_softcap": (_final_keys(model, sd), 1)}
    for n in todo:
        if not keys[n][0]:
            why = "no weights found to scale (q/k projections or QK-norm; the final norm, or an untied head)"
            features[n].how = _then(features[n].how, why)
    todo = [n for n in todo if keys[n][0]]
    balance = features["experts"].declared and not features["experts"].exercised and features["experts"].value == 0
    if not todo and not balance:
        return None
    how = []
    if balance:
        rounds = _balance_routers(model, features, tokens, params)
        how.append(f"router weights projected off their inputs' mean direction, starved experts aimed at a "
                   f"token ({rounds} rounds)")  # fmt: skip
    need, target = float(params["feature_softcap_clipped_min"]), float(params["feature_softcap_clipped_target"])
    max_scale = float(params["feature_max_scale"])
    scale = {n: 1.0 for n in todo}
    for _ in range(int(params["feature_search_rounds"])):
        with torch.no_grad(), Probe(model, features, sample=True) as probe:
            model(input_ids=tokens[:1], use_cache=False)  # one sequence is enough to set a scale
        stats = {"attention_softcap": probe.attention, "final_softcap": probe.final}
        todo = [n for n in todo if (stats[n].fraction or 0.0) < need and scale[n] < max_scale]
        if not todo:
            break
        for n in todo:
            q, (k, power) = stats[n].quantile(1 - target), keys[n]
            cap = float(features[n].config["cap"])
            gain = (cap / q) ** (1 / power) if q and math.isfinite(q) and q > 0 else 10.0
            gain = min(max(gain, 1.01), max_scale / scale[n])
            _scale(model, k, gain)
            scale[n] *= gain
    for n, factor in scale.items():
        k = keys[n][0]
        what = k[0] if n == "final_softcap" else "QK-norm weights" if "norm" in k[0] else "q/k projections"
        how.append(f"{what} x{factor:.3g}")
    return ", ".join(how)
