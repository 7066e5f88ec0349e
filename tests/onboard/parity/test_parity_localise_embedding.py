"""Localisation before the first block: an embedding step is named as the embedding, an
embedding's token-id input is compared exactly, and a scale the two sides merely apply in
different places is not a divergence (issue #11, item 8)."""

from __future__ import annotations

import torch
from torch import nn

from onboard.parity.localise import OutputRecorder, compare_outputs, localise

PAIRS = {"emb": "emb", "blk": "blk", "blk.norm": "blk.norm", "blk.a": "blk.a"}


class Norm(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Block(nn.Module):
    """Pre-norm residual block: its normed input hides a scale of the stream from blk.norm."""

    def __init__(self):
        super().__init__()
        self.norm, self.a = Norm(), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.a(self.norm(x))


class ScaledEmbedding(nn.Embedding):
    def __init__(self, scale_inside: float):
        super().__init__(16, 8)
        self.scale_inside = scale_inside

    def forward(self, ids):
        return super().forward(ids) * self.scale_inside


class Toy(nn.Module):
    def __init__(self, inside: float = 1.0, after: float = 1.0):
        super().__init__()
        self.emb, self.blk, self.after = ScaledEmbedding(inside), Block(), after

    def forward(self, ids):
        return self.blk(self.emb(ids) * self.after)


def _localise(native: nn.Module, upstream: nn.Module):
    upstream.load_state_dict(native.state_dict())
    ids = torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), OutputRecorder(native, list(PAIRS)) as n, OutputRecorder(upstream, list(PAIRS.values())) as u:
        native(ids), upstream(ids)
    rows = compare_outputs(n, u, PAIRS)
    return rows, *localise(rows, n, u, PAIRS, 1e-5)


def test_a_multiplier_after_the_embedding_is_named_as_the_embedding_not_the_block():
    rows, first, why = _localise(Toy(), Toy(after=12.0))  # the port forgot upstream's multiplier
    assert next(r for r in rows if r.native == "emb").rel_l2 == 0.0  # the embedding's own output agrees
    assert first.native == "emb" and first.rel_l2 > 0.5  # the rel error is the block input's
    assert "input of blk already differs" in why and "embedding scale or multiplier" in why


def test_a_wrong_scale_inside_the_embedding_is_named_with_its_integer_input_compared_exactly():
    rows, first, why = _localise(Toy(inside=1.0), Toy(inside=3.0))
    assert first.native == "emb" and "receives the same input" in why


def test_a_scale_applied_after_the_embedding_instead_of_inside_it_is_not_a_divergence():
    rows, first, why = _localise(Toy(after=3.0), Toy(inside=3.0))
    emb = next(r for r in rows if r.native == "emb")
    assert emb.rel_l2 > 0.5 and emb.relocated and "not a divergence" in emb.note
    assert first is None and why is None


def test_integer_outputs_are_compared_exactly():
    class Ids(nn.Module):
        def __init__(self, shift: int):
            super().__init__()
            self.shift = shift

        def forward(self, ids):
            return ids + self.shift

    class Wrap(nn.Module):
        def __init__(self, shift):
            super().__init__()
            self.ids = Ids(shift)

        def forward(self, ids):
            return self.ids(ids)

    ids = torch.arange(6).reshape(1, 6)
    for shift, expected in ((0, 0.0), (1, float("inf"))):
        native, upstream = Wrap(0), Wrap(shift)
        with OutputRecorder(native, ["ids"]) as n, OutputRecorder(upstream, ["ids"]) as u:
            native(ids), upstream(ids)
        (row,) = compare_outputs(n, u, {"ids": "ids"})
        assert row.rel_l2 == expected and row.note == "integer output"
