"""Where the native model first leaves the upstream one.

Module correspondence comes from the workspace adapter itself, not from a hand-kept name
list: every upstream checkpoint tensor is filled with its own id, passed through
`from_hf`, and each native parameter then holds the ids of the upstream tensors it came
from (renames, transposes, splits and fusions all keep the values). A native module and
an upstream module correspond when the upstream one is the deepest module holding every
source of the native module's parameters and none of its mapped parameters feed another
native module. Both models then run with forward hooks on the paired modules, and the
outputs are compared in the native model's execution order.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from titan_core.measure.numerics import max_abs, rel_l2


def _common_prefix(paths: set[str]) -> str:
    parts = [p.split(".") for p in paths]
    out = []
    for group in zip(*parts):
        if len(set(group)) != 1:
            break
        out.append(group[0])
    return ".".join(out)


def parameter_sources(checkpoint: dict[str, torch.Tensor], from_hf: Callable[[dict], dict]) -> dict[str, set[str]]:
    """Native key -> the upstream checkpoint keys its values come from, through `from_hf`."""
    # tensors HF ties (lm_head and the embedding) stay one object, so the adapter sees the tie
    ids: dict[str, int] = {}
    tagged: dict[str, torch.Tensor] = {}
    by_storage: dict[tuple, str] = {}
    for key, t in checkpoint.items():
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if ident in by_storage:
            ids[key], tagged[key] = ids[by_storage[ident]], tagged[by_storage[ident]]
            continue
        by_storage[ident] = key
        ids[key] = len(by_storage)  # small integers are exact in fp32
        tagged[key] = torch.full(t.shape, float(ids[key]))
    key_of = {i: key for key, i in reversed(ids.items())}  # a shared id names its first key
    out = {}
    for key, value in from_hf(tagged).items():
        if not torch.is_tensor(value):
            continue
        found = {int(v) for v in torch.unique(value.float()).tolist() if float(v).is_integer()}
        out[key] = {key_of[i] for i in found if i in key_of}
    return out


def module_pairs(native: nn.Module, upstream: nn.Module, sources: dict[str, set[str]]) -> dict[str, str]:
    """native module name -> upstream module name, for modules that compute the same thing."""
    native_keys = [k for k in native.state_dict() if sources.get(k)]
    upstream_modules = dict(upstream.named_modules())
    feeds: dict[str, set[str]] = {}  # upstream key -> native keys built from it
    for key in native_keys:
        for src in sources[key]:
            feeds.setdefault(src, set()).add(key)
    by_upstream: dict[str, str] = {}
    for name, module in native.named_modules():
        if not name or isinstance(module, (nn.ModuleDict, nn.ModuleList)):
            continue  # containers have no forward to hook
        own = {k for k in native_keys if k.startswith(name + ".")}
        srcs = set().union(*(sources[k] for k in own)) if own else set()
        target = _common_prefix({s.rpartition(".")[0] for s in srcs}) if srcs else ""
        if not target or target not in upstream_modules:
            continue
        under = [s for s in feeds if s.startswith(target + ".")]
        if any(not feeds[s] <= own for s in under):
            continue  # the upstream module also feeds other native modules: not the same computation
        # several native modules may land on one upstream module (router and router.gate):
        # the deepest one is the most specific match
        if target not in by_upstream or len(name) > len(by_upstream[target]):
            by_upstream[target] = name
    return {n: u for u, n in by_upstream.items()}


def _first_tensor(out: Any) -> torch.Tensor | None:
    if torch.is_tensor(out):
        return out
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    return next((v for v in values if torch.is_tensor(v)), None)


class OutputRecorder:
    """Forward hooks that keep each named module's first input and output of one forward pass, in order."""

    def __init__(self, model: nn.Module, names: list[str]):
        self.outputs: dict[str, torch.Tensor] = {}
        self.inputs: dict[str, torch.Tensor] = {}
        self.choices: dict[str, torch.Tensor] = {}
        """A module's integer input beside its first (the experts an MoE's experts module is told to run)."""
        self.versions: dict[str, int] = {}
        self.order: list[str] = []
        modules = dict(model.named_modules())
        self._handles = [
            modules[n].register_forward_hook(self._hook(n), with_kwargs=True) for n in names if n in modules
        ]

    def _hook(self, name: str):
        def record(_module, args, kwargs, output):
            tensor = _first_tensor(output)
            if name in self.outputs or tensor is None:
                return
            # kept without copying (a copy per module doubled the run time); `versions` lets
            # compare_outputs refuse a tensor that was modified in place afterwards
            self.outputs[name] = tensor.detach()
            self.versions[name] = tensor._version
            # HF passes hidden_states by keyword; the first tensor argument is the module's input
            given = _first_tensor(args)
            given = given if given is not None else kwargs.get("hidden_states", _first_tensor(kwargs))
            if given is not None:
                self.inputs[name] = given.detach()
            ints = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t is not given
                    and not t.is_floating_point() and t.dtype != torch.bool]  # fmt: skip
            if len(ints) == 1:
                self.choices[name] = ints[0].detach()
            self.order.append(name)

        return record

    def intact(self, name: str) -> bool:
        return self.outputs[name]._version == self.versions[name]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()


@dataclass
class Row:
    native: str
    upstream: str
    rel_l2: float | None
    max_abs: float | None
    note: str = ""
    relocated: bool = False
    """The output differs only by where a step sits: the next compared module's input agrees
    (a port that scales after its embedding where upstream scales inside it)."""

    def diverged(self, tol: float) -> bool:
        return not self.relocated and self.rel_l2 is not None and (math.isnan(self.rel_l2) or self.rel_l2 > tol)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare_outputs(native_rec: OutputRecorder, upstream_rec: OutputRecorder, pairs: dict[str, str]) -> list[Row]:
    """One row per paired module that ran, in native execution order."""
    rows = []
    for name in native_rec.order:
        up = pairs[name]
        a, b = native_rec.outputs[name], upstream_rec.outputs.get(up)
        if b is None:
            rows.append(Row(name, up, None, None, "upstream module did not run"))
        elif not (native_rec.intact(name) and upstream_rec.intact(up)):
            rows.append(Row(name, up, None, None, "output was modified in place after the module returned"))
        elif a.numel() != b.numel():
            rows.append(Row(name, up, None, None, f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"))
        elif not (a.is_floating_point() and b.is_floating_point()):  # ids or indices: equal or not
            same = a.shape == b.shape and torch.equal(a, b.reshape(a.shape))
            rows.append(Row(name, up, 0.0 if same else math.inf, 0.0 if same else math.inf, "integer output"))
        else:
            b = b.reshape(a.shape)
            rows.append(Row(name, up, rel_l2(a, b), max_abs(a, b)))
    return rows


def first_divergence(rows: list[Row], tol: float) -> Row | None:
    """The first row, in execution order, whose rel. L2 error exceeds `tol` (or is NaN)."""
    return next((r for r in rows if r.diverged(tol)), None)


def _inputs_of(name: str, native_rec: OutputRecorder, upstream_rec: OutputRecorder, pairs):
    a, b = native_rec.inputs.get(name), upstream_rec.inputs.get(pairs.get(name, ""))
    if a is None or b is None or a.numel() != b.numel():
        return None, None
    return a, b.reshape(a.shape)


def _same_input(name: str, native_rec: OutputRecorder, upstream_rec: OutputRecorder, pairs, tol: float) -> bool | None:
    a, b = _inputs_of(name, native_rec, upstream_rec, pairs)
    if a is None:
        return None
    if not (a.is_floating_point() and b.is_floating_point()):
        return torch.equal(a, b)  # token ids, positions: equal or not, never a relative error
    return not rel_l2(a, b) > tol


def _same_choice(name: str, native_rec: OutputRecorder, upstream_rec: OutputRecorder, pairs) -> bool | None:
    """Whether the module was given the same integer choice on both sides (the experts each token runs,
    compared as sets per token: top-k order is not a difference); None where either side has none."""
    a, b = native_rec.choices.get(name), upstream_rec.choices.get(pairs.get(name, ""))
    if a is None or b is None or a.numel() != b.numel() or a.dim() == 0:
        return None
    k = a.shape[-1]
    return torch.equal(a.reshape(-1, k).sort(-1).values, b.reshape(-1, k).long().sort(-1).values.to(a.dtype))


def _is_ids_module(name: str, native_rec: OutputRecorder) -> bool:
    given = native_rec.inputs.get(name)
    return given is not None and not given.is_floating_point()


def mark_relocated(rows: list[Row], native_rec, upstream_rec, pairs, tol: float) -> None:
    """An embedding whose output differs while the next compared module's input agrees: the
    two sides apply a step (Gemma's sqrt(dim) scale) at different places, not a divergence."""
    for i, row in enumerate(rows):
        if not row.diverged(tol) or not _is_ids_module(row.native, native_rec):
            continue
        if not _same_input(row.native, native_rec, upstream_rec, pairs, tol):
            continue
        after = next((r for r in rows[i + 1 :] if not r.native.startswith(row.native + ".")), None)
        if after is not None and _same_input(after.native, native_rec, upstream_rec, pairs, tol):
            row.relocated = True
            row.note = (
                f"output differs but {after.native} receives the same input on both sides: a step (e.g. an "
                "embedding scale) sits after this module here and inside it upstream; not a divergence"
            )


def attribute(
    first: Row, rows: list[Row], native_rec: OutputRecorder, upstream_rec: OutputRecorder, pairs, tol: float
) -> tuple[Row, str]:
    """The module to blame for the first divergent output, and why.

    When the first divergent module's own input already differs, the error arose between
    compared modules, inside an enclosing one (RoPE and attention scores sit between
    attention.wv and attention.wo): blame the nearest diverged ancestor that was compared.
    """
    same = _same_input(first.native, native_rec, upstream_rec, pairs, tol)
    if same is None:
        return first, f"{first.native} is the first compared output that differs; everything compared before it agrees"
    if same and _same_choice(first.native, native_rec, upstream_rec, pairs) is False:
        parent = next((r for r in sorted(rows, key=lambda r: -len(r.native))
                       if first.native.startswith(r.native + ".") and r.diverged(tol)), None)  # fmt: skip
        if parent is not None:
            return parent, (
                f"{first.native} receives the same hidden states on both sides but is told to run other experts: "
                f"the routing inside {parent.native} (the choice made from the router's scores, e.g. a "
                "score-correction bias, group limits, top-k) differs"
            )
    if same:
        return first, f"{first.native} receives the same input on both sides and returns a different output"
    # walk out through the diverged ancestors whose input differs too: the error is inside the
    # first one whose input agrees, or, if none does, before the outermost one
    outer = first
    for parent in sorted(
        (r for r in rows if first.native.startswith(r.native + ".") and r.diverged(tol)), key=lambda r: -len(r.native)
    ):
        if _same_input(parent.native, native_rec, upstream_rec, pairs, tol) is not False:
            return parent, (
                f"the input of {first.native} already differs: the error is inside {parent.native}, "
                "between its compared sub-modules (e.g. RoPE, QK-norm, attention scores, routing)"
            )
        outer = parent
    start = next(i for i, r in enumerate(rows) if r.native == outer.native or r.native.startswith(outer.native + "."))
    before = next((r for r in reversed(rows[:start]) if r.rel_l2 is not None), None)
    if before is None or before.diverged(tol):
        return outer, f"the input of {outer.native} already differs, from code before it that no compared module covers"
    a, b = _inputs_of(outer.native, native_rec, upstream_rec, pairs)
    row = Row(before.native, before.upstream, rel_l2(a, b), max_abs(a, b), f"the input of {outer.native}")
    return row, (
        f"{before.native}'s output agrees but the input of {outer.native} already differs: the step between them "
        "differs (an embedding scale or multiplier applied after the embedding, outside any compared module)"
    )


def localise(rows: list[Row], native_rec, upstream_rec, pairs, tol: float) -> tuple[Row | None, str | None]:
    """The module to blame for the first divergence and why; (None, None) when all agree."""
    mark_relocated(rows, native_rec, upstream_rec, pairs, tol)
    first = first_divergence(rows, tol)
    if first is None:
        return None, None
    return attribute(first, rows, native_rec, upstream_rec, pairs, tol)


def divergence(rows: list[Row], native_rec, upstream_rec, pairs, tol: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the first_divergence_* and modules_compared measurements, results.json's `localisation`) of the rows."""
    first, why = localise(rows, native_rec, upstream_rec, pairs, tol)
    m = {"first_divergence_module": first.native if first else None,
         "first_divergence_upstream": first.upstream if first else None,
         "first_divergence_rel_l2": first.rel_l2 if first else None,
         "modules_compared": sum(r.rel_l2 is not None for r in rows)}  # fmt: skip
    record = {"tolerance_rel_l2": tol, "first": {**first.as_dict(), "why": why} if first else None,
              "divergent": [r.as_dict() for r in rows if r.diverged(tol)][:5], "table": [r.as_dict() for r in rows]}
    return m, record
