"""Parity exercises what the config declares.

Seeded weights leave many features idle: at HF's init attention scores sit near 0.006,
far below a soft-cap of 50, so a port without the cap agrees to 1e-7. Each feature the
upstream config declares is therefore measured while the comparison runs, and parity adds
a second pass ("features") with weights scaled until every soft-cap clips. Declared by
(HF config) -> exercised when (numbers: `params:` of checklists/parity.yaml):

- attention soft-cap, `attn_logit_softcapping`: at least feature_softcap_clipped_min of
  the unmasked scores are clipped;
- final soft-cap, `final_logit_softcapping` (or another name for it: adapter.FINAL_CAP_KEYS): the
  same, of the pre-cap logits;
- sliding window, `sliding_window` (the layers `layer_types` windows, all without it):
  seq_len >= feature_window_seq_factor x the largest window (parity's seq_len grows to it);
- experts, `num_experts` / `num_local_experts` / `n_routed_experts`: every expert of every
  MoE layer gets at least feature_min_tokens_per_expert tokens;
- padding, `pad_token_id`: pad ids in the batch (the last feature_pad_fraction of the
  first sequence: right padding).

Where parity runs a twin, a feature of the full model's config the twin does not hold is
declared and never exercised (`not_held`), and so is the GQA ratio (`gqa_ratio`) where the
twin's query heads per key/value head differ from the full model's.

"Clipped" is abs(x) >= cap: there the cap removes at least 24% of the value (tanh(1) = 0.76).
Scores are read from inside the upstream's own eager attention (its module's
`eager_attention_forward`, wrapped for the forward), pre-cap logits from the output
embedding's forward hook, routing from the routers' outputs.

The features pass (feature_pass.py) scales, in the upstream checkpoint, the weights that feed each
idle cap, and rebalances routers where an expert got no token; the native model receives the same
checkpoint through the adapter, and every criterion applies to both passes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from onboard.parity.watch import ClampWatch, ScoreWatch, layer_of

SAMPLE = 1 << 18  # values kept per call for the quantile that sets the next scale


SCORE_FEATURES = ("attention_softcap", "attention_sinks", "layer_kinds")
"""The features read from the upstream's attention scores (the eager attention is wrapped for them)."""

ROUTER_NAMES = ("gate", "router")
"""What transformers' MoE blocks name their router module."""


@dataclass
class Feature:
    name: str
    label: str
    declared: bool
    exercised: bool | None = None
    """None when not declared; else whether some parity pass had it active."""
    how: str = ""
    value: float | None = None
    """The measure (fraction clipped, seq_len / window, min tokens per expert, pad tokens)."""
    pass_name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "declared": self.declared, "exercised": self.exercised, "how": self.how, "value": self.value,
            "pass": self.pass_name, **self.config,
        }  # fmt: skip


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def layer_windows(config) -> list[int]:
    """The window of every windowed upstream layer (empty when none is windowed)."""
    c = _text_config(config)
    window = getattr(c, "sliding_window", None)
    if not window:
        return []
    types = getattr(c, "layer_types", None)
    if types:
        return [int(window) for t in types if t == "sliding_attention"]
    if getattr(c, "use_sliding_window", True) is False:
        return []
    return [int(window)] * int(getattr(c, "num_hidden_layers", 1))


def n_experts(config) -> int:
    """The routed experts of each upstream MoE layer (0: no experts to exercise)."""
    from titan_core.models.transformers.adapter import routed_experts  # lazy: beside transformers, an extra

    return routed_experts(_text_config(config))


def router_rows(config, experts: int) -> list[int]:
    """The row counts a router's weight may have: one row per routed expert, plus one per shared
    expert where the router scores them too (Inkling) or per zero-compute expert (LongCat-Flash's
    `zero_expert_num`). The routed experts' rows come first in each."""
    c = _text_config(config)
    extra = [getattr(c, k, None) for k in ("n_shared_experts", "zero_expert_num")]
    return sorted({experts, *(experts + n for n in extra if isinstance(n, int) and n > 0)})


def declare(config) -> dict[str, Feature]:
    """Every feature parity knows, with whether the upstream config declares it."""
    c = _text_config(config)
    from titan_core.models.transformers.adapter import final_logit_cap  # lazy: beside transformers, an extra

    attn_cap, final_cap = getattr(c, "attn_logit_softcapping", None), final_logit_cap(c)
    windows = layer_windows(config)
    experts = n_experts(config)
    pad = getattr(c, "pad_token_id", None)
    pad_ok = isinstance(pad, int) and 0 <= pad < c.vocab_size
    return {
        "attention_softcap": Feature(
            "attention_softcap", "attention soft-cap", bool(attn_cap), config={"cap": attn_cap} if attn_cap else {}
        ),
        "final_softcap": Feature(
            "final_softcap", "final soft-cap", bool(final_cap), config={"cap": final_cap} if final_cap else {}
        ),
        "sliding_window": Feature(
            "sliding_window", "sliding window", bool(windows), config={"window": max(windows)} if windows else {}
        ),
        "experts": Feature(
            "experts",
            "experts",
            experts > 0,
            config={"n_experts": experts, "top_k": getattr(c, "num_experts_per_tok", None),
                    "router_rows": router_rows(config, experts)} if experts else {},  # fmt: skip
        ),
        "padding": Feature("padding", "padding", pad_ok, config={"pad_token_id": pad} if pad_ok else {}),
    }


def seq_len_for(features: dict[str, Feature], seq_len: int, params: dict[str, Any]) -> int:
    """The parity sequence length: at least `seq_len`, and long enough for every window."""
    window = features["sliding_window"].config.get("window")
    return max(seq_len, int(params["feature_window_seq_factor"]) * window) if window else seq_len


def make_inputs(vocab: int, batch: int, seq_len: int, seed: int, features: dict[str, Feature], params):
    """Random tokens and labels; with a declared pad id, the end of the first sequence is padding."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    labels = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    pad = features["padding"]
    if pad.declared:
        n = max(1, int(seq_len * float(params["feature_pad_fraction"])))
        tokens[0, -n:] = pad.config["pad_token_id"]
    return tokens, labels


def record_static(features: dict[str, Feature], tokens: torch.Tensor, seq_len: int, params) -> None:
    """The features whose exercise depends on the inputs alone: window and padding."""
    f = features["sliding_window"]
    if f.declared:
        window, factor = f.config["window"], float(params["feature_window_seq_factor"])
        f.value = seq_len / window
        f.exercised = f.value >= factor
        f.how = f"seq_len {seq_len} = {f.value:.3g} x the largest window {window} (needs >= {factor:g} x)"
        f.pass_name = "all"
    f = features["padding"]
    if f.declared:
        pad = f.config["pad_token_id"]
        f.value = int((tokens == pad).sum())
        f.exercised = f.value > 0
        tail = max(1, int(seq_len * float(params["feature_pad_fraction"])))
        f.how = f"{f.value} pad ids (id {pad}) in the batch: the last {tail} positions of sequence 0, the rest random"
        f.pass_name = "all"


# ---- measuring inside the upstream forward -------------------------------------------------
class _Stat:
    def __init__(self, sample: bool):
        self.clipped, self.total, self.samples, self.sample = 0, 0, [], sample

    def add(self, magnitudes: torch.Tensor, cap: float, valid: torch.Tensor | None = None) -> None:
        x = magnitudes.detach().float()
        keep = torch.ones_like(x, dtype=torch.bool) if valid is None else valid.expand_as(x)
        self.clipped += int(((x >= cap) & keep).sum())
        self.total += int(keep.sum())
        if self.sample:  # a strided subset for the quantile that sets the next scale
            step = max(1, x.numel() // SAMPLE)
            self.samples.append(x.flatten()[::step][keep.flatten()[::step]])

    @property
    def fraction(self) -> float | None:
        return self.clipped / self.total if self.total else None

    def quantile(self, q: float) -> float | None:
        values = torch.cat(self.samples) if self.samples else torch.empty(0)
        if values.numel() == 0:
            return None
        return float(torch.quantile(values[:: max(1, values.numel() // SAMPLE)], q))


def _repeat_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    return x if x.shape[1] == n_heads else x.repeat_interleave(n_heads // x.shape[1], dim=1)


class Probe:
    """Measures, during upstream forwards, what each declared feature saw."""

    def __init__(self, model: nn.Module, features: dict[str, Feature], *, sample: bool = False):
        self.model, self.features, self.sample = model, features, sample
        self.attention, self.final = _Stat(sample), _Stat(sample)
        self.expert_counts: dict[str, torch.Tensor] = {}
        self.router_inputs: dict[str, torch.Tensor] = {}  # kept when sampling, to rebalance routing
        self.scores = ScoreWatch()
        self.clamps: ClampWatch | None = None
        self._names = {id(m): n for n, m in model.named_modules()}
        self._undo: list = []

    def routers(self) -> dict[str, nn.Module]:
        """Upstream router modules: a `gate`/`router` whose weight is [n_experts, hidden], or the one
        child of a `gate`/`router` that holds that weight (HunYuan's `gate.wg`, JetMoE's `router.layer`);
        its rows may go on past the routed experts' (`router_rows`: Inkling's shared, LongCat's zero experts)."""
        config = self.features["experts"].config
        e = config.get("n_experts")
        if not e:
            return {}
        rows = set(config.get("router_rows") or [e])
        found = {}
        for name, mod in self.model.named_modules():
            parent, _, last = name.rpartition(".")
            w = getattr(mod, "weight", None)
            if not (isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[0] in rows):
                continue
            if last in ROUTER_NAMES or (parent.rpartition(".")[2] in ROUTER_NAMES and parent not in found):
                found[name] = mod
        return found

    def choosers(self) -> dict[str, nn.Module]:
        """The `gate`/`router` modules `routers` misses, neither one nor above one (Zaya's router
        scores through an MLP of its own, with a row more for a skip expert): counted from the
        experts their output names (an integer tensor), where it names them."""
        if not self.features["experts"].config.get("n_experts"):
            return {}
        found = self.routers()
        return {
            name: mod for name, mod in self.model.named_modules()
            if name.rpartition(".")[2] in ROUTER_NAMES and not any(f == name or f.startswith(name + ".") for f in found)
        }  # fmt: skip

    def _reads_scores(self) -> bool:
        return any(self.features[n].declared for n in SCORE_FEATURES if n in self.features)

    def __enter__(self):
        if self._reads_scores():
            self._wrap_eager_attention()
        # every clamp is watched: the first pass finds which ones a config number bounds (active_range.py)
        self.clamps = ClampWatch(self.model, sample=self.sample)
        self.clamps.__enter__()
        self._undo.append(self._close_clamps)
        if self.features["final_softcap"].declared:
            cap = float(self.features["final_softcap"].config["cap"])
            head = self.model.get_output_embeddings()
            self._undo.append(head.register_forward_hook(lambda _m, _a, out: self.final.add(out.abs(), cap)).remove)
        for name, mod in self.routers().items():
            self._undo.append(mod.register_forward_hook(self._count(name)).remove)
            parent = name.rpartition(".")[0]
            if parent and parent.rpartition(".")[2] in ROUTER_NAMES:
                self._count_from_parent(name, self.model.get_submodule(parent))
        for name, mod in self.choosers().items():
            self._undo.append(mod.register_forward_hook(self._count(name, chosen_only=True)).remove)
        return self

    def _count_from_parent(self, name: str, parent: nn.Module) -> None:
        """A router that only reads its child's weight (LongCat-Flash's `router` computes with
        `classifier.weight`, never calling `classifier`): its own output, counted in the child's name
        whenever the child itself did not run during the call."""
        ran = [False]
        count = self._count(name)

        def child_ran(*_):
            ran[0] = True

        def before(*_):
            ran[0] = False

        def after(module, args, out):
            if not ran[0]:
                count(module, args, out)

        child = self.model.get_submodule(name)
        for undo in (child.register_forward_hook(child_ran), parent.register_forward_pre_hook(before),
                     parent.register_forward_hook(after)):  # fmt: skip
            self._undo.append(undo.remove)

    def _close_clamps(self) -> None:
        self.clamps.__exit__(None, None, None)
        self.clamps.close()

    def __exit__(self, *exc):
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    def _count(self, name: str, *, chosen_only: bool = False):
        e, k = self.features["experts"].config["n_experts"], self.features["experts"].config["top_k"]

        def hook(_module, args, out):
            given = next((t for t in args if torch.is_tensor(t)), None)
            if self.sample and given is not None:
                self.router_inputs[name] = given.detach().reshape(-1, given.shape[-1])
            outs = out if isinstance(out, (tuple, list)) else (out,)
            idx = next((t for t in outs if torch.is_tensor(t) and not t.is_floating_point()), None)
            if idx is None and chosen_only:
                return
            if idx is None:  # a plain linear router: its logits, top-k of the routed experts' as upstream routes
                logits = next(t for t in outs if torch.is_tensor(t))
                idx = logits.reshape(-1, logits.shape[-1])[:, :e].topk(int(k or 1), dim=-1).indices
            # the routed experts only: a shared or zero-compute expert's index (LongCat's) is not one
            counts = torch.bincount(idx.reshape(-1).long(), minlength=e)[:e]
            self.expert_counts[name] = self.expert_counts.get(name, 0) + counts

        return hook

    def _wrap_eager_attention(self) -> None:
        """Wrap `eager_attention_forward` of every module that defines an attention class of the model."""
        modules = {sys.modules[type(m).__module__] for m in self.model.modules() if "Attention" in type(m).__name__}
        for module in modules:
            original = getattr(module, "eager_attention_forward", None)
            if original is None:
                continue

            def wrapped(mod, query, key, value, attention_mask, *a, _original=original, **kw):
                self._scores(mod, query, key, attention_mask, kw.get("scaling"), kw.get("softcap"))
                return _original(mod, query, key, value, attention_mask, *a, **kw)

            module.eager_attention_forward = wrapped
            self._undo.append(lambda m=module, o=original: setattr(m, "eager_attention_forward", o))

    @torch.no_grad()
    def _scores(self, mod, query, key, mask, scaling, softcap) -> None:
        """The scores as upstream computes them before any cap: the soft-cap's clipped fraction, each
        layer's spread and its sink's mass (watch.ScoreWatch)."""
        scaling = mod.head_dim**-0.5 if scaling is None else scaling
        scores = (query @ _repeat_kv(key, query.shape[1]).transpose(-2, -1)) * scaling
        if mask is not None:
            valid = mask[..., : scores.shape[-1]] == 0 if mask.is_floating_point() else mask[..., : scores.shape[-1]]
        else:
            s_q, s_k = scores.shape[-2:]
            valid = torch.ones(s_q, s_k, dtype=torch.bool).tril(s_k - s_q)
        if softcap is not None and self.features["attention_softcap"].declared:
            self.attention.add(scores.abs(), float(self.features["attention_softcap"].config["cap"]), valid)
        sinks = getattr(mod, "sinks", None)
        self.scores.add(layer_of(self._names.get(id(mod), "")), scores, valid,
                        sinks if isinstance(sinks, torch.Tensor) else None)  # fmt: skip

    def min_tokens_per_expert(self) -> tuple[int, str | None]:
        if not self.expert_counts:
            return 0, None
        name, counts = min(self.expert_counts.items(), key=lambda kv: int(kv[1].min()))
        return int(counts.min()), name


def record_probe(features: dict[str, Feature], probe: Probe, pass_name: str, params, how: str = "") -> None:
    """Fill in the measured features from `probe`, unless an earlier pass already exercised them."""
    need = float(params["feature_softcap_clipped_min"])
    for name, stat in (("attention_softcap", probe.attention), ("final_softcap", probe.final)):
        f = features[name]
        if not f.declared or f.exercised:
            continue
        if stat.fraction is None:
            f.exercised, f.how = False, (
                "no scores measured: the upstream attention was not the eager implementation parity wraps"
                if name == "attention_softcap" else "no pre-cap logits measured at the output embedding"
            )  # fmt: skip
            continue
        f.value, f.exercised, f.pass_name = stat.fraction, stat.fraction >= need, pass_name
        what = "scores" if name == "attention_softcap" else "logits"
        clipped = f"{stat.fraction:.1%} of {what} clipped (|x| >= cap {f.config['cap']:g})"
        f.how = _then(f.how, f"{clipped} in the {pass_name} pass{how}")
    f = features["experts"]
    if f.declared and not f.exercised:
        low, where = probe.min_tokens_per_expert()
        f.value = low if where else None  # None: no router found, nothing to rebalance
        f.exercised = where is not None and low >= int(params["feature_min_tokens_per_expert"])
        f.pass_name = pass_name
        f.how = _then(f.how, (
            f"every expert got >= {low} tokens in the {pass_name} pass{how}" if f.exercised
            else f"an expert of {where} got {low} tokens in the {pass_name} pass{how}" if where
            else "no router output found (a module named gate or router, or a child of one, with "
                 "[n_experts, hidden] weights or an output naming the chosen experts)"
        ))  # fmt: skip


def _then(earlier: str, now: str) -> str:
    return f"{earlier}; then {now}" if earlier else now


def not_held(features: dict[str, Feature], full_config, holder: str, twin_config=None) -> list[str]:
    """Where parity ran a twin: each feature the full model's config (`full_config`) declares and the
    twin's (`features`, declared from what the twin holds) does not, marked declared and exercised by
    no pass, since the twin dropped it; and, given the twin's config (`twin_config`), `gqa_ratio` where
    the twin's query heads per key/value head differ from the full model's (a --twin-width that cannot
    hold them, onboard/sizing/twin/heads.py): the key/value expansion parity ran is not the full
    model's. Returns their names."""
    dropped = []
    for name, f in declare(full_config).items():
        if f.declared and not features[name].declared:
            how = f"the full model's config.json declares it, {holder} does not hold it: no parity pass ran it"
            features[name] = Feature(name, f.label, True, False, how=how, config=f.config)
            dropped.append(name)
    full, twin = heads(full_config), heads(twin_config) if twin_config is not None else None
    if full and twin and full[0] // full[1] != twin[0] // twin[1]:
        layout = {"full": f"{full[0]}:{full[1]}", "twin": f"{twin[0]}:{twin[1]}"}
        how = (f"full {layout['full']}, twin {layout['twin']}: the twin's key/value expansion groups differ; "
               f"{holder} does not hold the full model's GQA ratio, no parity pass ran it")  # fmt: skip
        features["gqa_ratio"] = Feature("gqa_ratio", "GQA ratio", True, False, how=how, config=layout)
        dropped.append("gqa_ratio")
    return dropped


def heads(config) -> tuple[int, int] | None:
    """(query heads, key/value heads) of an upstream config, or None where it names no head counts."""
    c = _text_config(config)
    n = getattr(c, "num_attention_heads", None)
    kv = getattr(c, "num_key_value_heads", None) or n
    ok = all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (n, kv))
    return (n, kv) if ok else None


def idle(features: dict[str, Feature]) -> list[str]:
    """The declared features no parity pass had active, each as "name (how)"."""
    return [f"{name} ({f.how})" if f.how else name for name, f in features.items() if f.declared and not f.exercised]


def exercised(features: dict[str, Feature]) -> bool:
    return not idle(features)
