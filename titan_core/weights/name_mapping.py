"""A checkpoint's meta tensors through an adapter's `from_hf`, a bad tensor isolated, not hiding its layer.

Where the whole checkpoint does not map in one call, it is mapped one layer group at a time
(names sharing the prefix up to their first number, `model.layers.7.`). In a group that fails:

- a tensor that maps alone to names no other tensor of the group maps to (a rename) is kept;
- tensors that map alone onto a shared name (the experts of one stack, each a slice of it: a
  converter stacks them) form a set, and those that map only with others form one more; each
  set is mapped whole;
- in a set that fails, a single tensor whose removal lets the rest map to the model's own
  shapes is the extra one; otherwise the set is reported whole, with the adapter's message.

So one bad tensor is named without hiding its layer, and a stack short of an expert is named
as that stack, not as a stack of the experts that happen to pair up.
"""

from __future__ import annotations

import re
from typing import Any

import torch

_GROUP = re.compile(r"^(.*?\.\d+\.)")


def layer_groups(names) -> dict[str, list[str]]:
    """`names` by layer group: the prefix up to their first number (`model.layers.7.`; "" for a name
    with none, the embedding or the head), in the order first seen."""
    groups: dict[str, list[str]] = {}
    for name in names:
        m = _GROUP.match(name)
        groups.setdefault(m.group(1) if m else "", []).append(name)
    return groups


class CheckpointMapping:
    """The checkpoint's meta tensors `hf` through `adapter.from_hf`, against the model's `own`
    state dict: `native` (what they map to), `unmapped` (what does not map, with why), and, on
    demand, which checkpoint tensors a native tensor came from."""

    def __init__(self, adapter: Any, hf: dict[str, torch.Tensor], own: dict[str, torch.Tensor]):
        self.adapter, self.hf, self.own = adapter, hf, own
        self.native: dict[str, torch.Tensor] = {}
        self.unmapped: list[dict] = []
        self._alone: dict[str, dict | None] = {}
        self._groups = layer_groups(hf)
        self._by_group: dict[str, set[str]] | None = None
        try:
            self.native = self._from_hf(hf)
            return
        except Exception:  # the adapter may be a recipe's own file: anything it raises is a mapping failure
            pass
        self._by_group = {}
        for prefix, names in self._groups.items():
            self._by_group[prefix] = set(self._map_group(names))

    def _from_hf(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.adapter.from_hf(sd)
        if not isinstance(out, dict):
            raise TypeError(f"from_hf returned {type(out).__name__}, not a dict")
        return out

    def _map_group(self, names: list[str]) -> dict[str, torch.Tensor]:
        try:
            out = self._from_hf({k: self.hf[k] for k in names})
        except Exception:
            out = self._split(names)
        self.native.update(out)
        return out

    def _split(self, names: list[str]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for part in self._parts(names):
            alone = self.alone(part[0]) if len(part) == 1 else None
            if alone is not None:
                out.update(alone)
                continue
            try:
                out.update(self._from_hf({k: self.hf[k] for k in part}))
            except Exception as e:
                out.update(self._isolate(part, e))
        return out

    def _parts(self, names: list[str]) -> list[list[str]]:
        """`names` in the sets that map together (module docstring): tensors that map alone, joined
        where they map onto a shared name, and one set of those that map only with others."""
        together = [k for k in names if self.alone(k) is None]
        root = {k: k for k in names if k not in together}

        def find(k: str) -> str:
            while root[k] != k:
                k = root[k]
            return k

        producer: dict[str, str] = {}
        for k in root:
            for native in self.alone(k):
                if native in producer:
                    root[find(k)] = find(producer[native])
                else:
                    producer[native] = k
        sets: dict[str, list[str]] = {}
        for k in root:
            sets.setdefault(find(k), []).append(k)
        return [*sets.values(), *([together] if together else [])]

    def _isolate(self, part: list[str], error: Exception) -> dict[str, torch.Tensor]:
        """What of a failing set maps: all but one extra tensor, if that leaves the model's shapes."""
        for k in part:
            rest = [n for n in part if n != k]
            try:
                mapped = self._from_hf({n: self.hf[n] for n in rest})
            except Exception:
                continue
            if self._fits(mapped):
                self.unmapped.append({"native": None, "hf": [k], "shape": list(self.hf[k].shape), "why": _why(error)})
                return mapped
        self.unmapped.append({"native": None, "hf": sorted(part), "shape": None, "why": _why(error)})
        return {}

    def _fits(self, mapped: dict[str, torch.Tensor]) -> bool:
        """Every tensor mapped is the model's, in the model's shape."""
        own = self.own
        return all(k in own and tuple(v.shape) == tuple(own[k].shape) for k, v in mapped.items())

    def alone(self, name: str) -> dict[str, torch.Tensor] | None:
        """What one checkpoint tensor maps to by itself (None: it maps only with others)."""
        if name not in self._alone:
            try:
                self._alone[name] = self._from_hf({name: self.hf[name]})
            except Exception:
                self._alone[name] = None
        return self._alone[name]

    def ignored(self, name: str) -> bool:
        """A tensor the adapter drops (a derived buffer such as rotary_emb.inv_freq)."""
        return self.alone(name) == {}

    def sources(self, native: str) -> list[str]:
        """The checkpoint tensors `native` came from: those that map to it alone, else
        the tensors of its layer group that map only together."""
        if self._by_group is None:
            self._by_group = {p: set(self._from_group_quiet(n)) for p, n in self._groups.items()}
        for prefix, produced in self._by_group.items():
            if native in produced:
                names = self._groups[prefix]
                direct = [k for k in names if native in (self.alone(k) or {})]
                return direct or sorted(k for k in names if self.alone(k) is None)
        return []

    def _from_group_quiet(self, names: list[str]) -> dict[str, torch.Tensor]:
        try:
            return self._from_hf({k: self.hf[k] for k in names})
        except Exception:
            return {}


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"
