"""TensorPeak counts what a step's tensors need at most at once, on CPU, at the dispatcher."""

import torch
import torch.nn.functional as F

from titan_core.memory.tensor_peak import TensorPeak

MIB = 1 << 20


def test_peak_sees_the_logits_of_a_cross_entropy_and_its_backward():
    tokens, dim, vocab = 512, 64, 4096
    x = torch.randn(tokens, dim, requires_grad=True)
    w = torch.randn(vocab, dim, requires_grad=True)
    y = torch.randint(0, vocab, (tokens,))
    logits_bytes = tokens * vocab * 4
    with TensorPeak() as p:
        F.cross_entropy(x @ w.t(), y).backward()
    # logits and log-softmax (saved for backward) are alive together, then their gradient
    assert 2 * logits_bytes <= p.peak_bytes <= 4 * logits_bytes
    # what is left: the two gradients, written during the mode
    assert p.live_bytes == x.numel() * 4 + w.numel() * 4


def test_freed_tensors_are_subtracted_and_views_are_not_counted_twice():
    with TensorPeak() as p:
        for _ in range(5):
            a = torch.ones(MIB // 4)  # 1 MiB each, the previous one freed when `a` is rebound
            b = a.view(2, -1)[0]
            del b
        del a
    assert p.peak_bytes == 2 * MIB  # the new `a` exists before the old one is released
    assert p.live_bytes == 0


def test_peak_is_zero_for_code_that_allocates_nothing_new():
    x = torch.randn(1000)
    with TensorPeak() as p:
        x.mul_(2)  # in place: the storage existed before the mode
    assert p.peak_bytes == 0


def test_wrapper_subclass_tensors_count_by_their_inner_storage():
    """torchao's float8 tensors wrap a float8 tensor and its scale and have no storage of their own:
    counted through their inner tensors, a float8 linear's step is seen (not an error) and keeps more
    alive than the plain one's (its float8 copies saved for backward)."""
    import pytest
    from torch import nn

    pytest.importorskip("torchao", reason="float8 tensors come from the [float8] extra (torchao)")
    from titan_core.kernels.float8_linear import Float8TrainingLinear

    peaks = {}
    for recipe in ("none", "tensorwise"):
        lin = nn.Linear(256, 256, bias=False)
        lin = lin if recipe == "none" else Float8TrainingLinear.from_linear(lin, recipe)
        x = torch.randn(512, 256, requires_grad=True)
        with TensorPeak() as p:
            lin(x).sum().backward()
        peaks[recipe] = p.peak_bytes
        assert p.live_bytes == x.numel() * 4 + lin.weight.numel() * 4  # the two gradients, whatever the path
    assert peaks["tensorwise"] > peaks["none"] >= 512 * 256 * 4
