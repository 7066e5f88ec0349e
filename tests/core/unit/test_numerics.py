"""titan_core.measure.numerics: the one relative-error rule (a zero reference, NaN, float64
accumulation, curves). That both gates of onboard apply it: tests/onboard/parity/test_zero_reference_gates.py."""

from __future__ import annotations

import math

import pytest
import torch

from titan_core.measure.numerics import curve_max_rel, max_abs, rel, rel_l2


def test_zero_reference_rule():
    z = torch.zeros(3)
    assert rel_l2(z, z) == 0.0 and rel_l2(z + 1e-30, z) == math.inf
    assert rel_l2(None, None) == 0.0 and rel_l2(None, z) == 0.0 and rel_l2(z, None) == 0.0
    assert rel_l2(torch.ones(3), None) == math.inf and rel_l2(None, torch.ones(3)) == 1.0
    assert rel(0.0, 0.0) == 0.0 and rel(1e-30, 0.0) == math.inf and rel(2.0, 4.0) == 0.5
    assert rel_l2(torch.tensor([math.nan]), torch.ones(1)) == math.inf and rel(math.nan, 1.0) == math.inf


def test_float64_accumulation_and_max_abs():
    e = torch.tensor([3.0, 4.0])
    assert rel_l2(torch.tensor([3.0, 4.5]), e) == pytest.approx(0.1)
    assert max_abs(torch.tensor([3.0, 4.5]), e) == pytest.approx(0.5) and max_abs(torch.ones(0), torch.ones(0)) == 0.0
    big = torch.full((10,), 1e30, dtype=torch.float32)
    assert rel_l2(big * (1 + 2**-20), big) == pytest.approx(2**-20, rel=0.05)  # squares of 1e30 overflow float32
    with pytest.raises(ValueError, match="shapes differ"):
        rel_l2(torch.ones(2), torch.ones(3))


def test_curves():
    assert curve_max_rel([1.0, 2.2], [1.0, 2.0]) == (pytest.approx(0.1), 2)
    assert curve_max_rel([1.0], [1.0, 2.0]) == (math.inf, None) and curve_max_rel([], []) == (math.inf, None)
    assert curve_max_rel([1.0, math.nan], [1.0, 2.0]) == (math.inf, 2)


def test_rounding_check_excuses_a_candidate_as_close_to_fp64_as_the_reference():
    """A sum that cancels: 10,000 fp32 terms of about 1 summing to about 0.3. Two summation orders
    differ far above fp32's eps relative to the result; each is as far from the fp64 sum as the other.
    A candidate that is off by 1e-3 of itself is not rounding."""
    from titan_core.measure.numerics import rounding_check

    gen = torch.Generator().manual_seed(0)
    terms = torch.randn(10_000, generator=gen, dtype=torch.float64)
    terms[-1] -= terms.sum() - 0.3
    exact = terms.sum().reshape(1)
    forward = torch.zeros(1, dtype=torch.float32)
    for t in terms.float():
        forward += t
    backward = torch.zeros(1, dtype=torch.float32)
    for t in terms.float().flip(0):
        backward += t
    same = rounding_check(backward, forward, exact, 2.0)
    assert rel_l2(backward, forward) > 1e-6 and same["rounding"] is True
    assert same["candidate_vs_fp64"] > 0 and same["reference_vs_fp64"] > 0
    wrong = rounding_check(forward * (1 + 1e-3), forward, exact, 2.0)
    assert wrong["rounding"] is False and wrong["candidate_vs_fp64"] > 2 * wrong["reference_vs_fp64"]


def test_worst_unexcused_skips_what_the_rounding_check_excused():
    from titan_core.measure.numerics import worst_unexcused

    errors = {"a": 3e-5, "b": 2e-5, "c": 1e-6}
    assert worst_unexcused(errors, {}) == ("a", 3e-5)
    assert worst_unexcused(errors, {"a": {"rounding": True}, "b": {"rounding": False}}) == ("b", 2e-5)
    assert worst_unexcused({"a": 3e-5}, {"a": {"rounding": True}}) == (None, 0.0)
