"""An attention-score soft-cap as part of the core contract: the naive reference and flex
apply it, sdpa / tokamax / splash refuse it (the kernel does not apply to such a model), and
the library's `Attention(softcap=)` starts on a core that caps, so a Gemma-2-style port keeps
the library module and its kernels instead of a core of its own."""

import pytest
import torch
from kernel_helpers import FP32_TOL, MASKS, attention_inputs, rel_l2

from titan_core.models.common.swaps import apply_swaps
from titan_core.kernels.attention import FlexAttention, KernelRefusesModel, SplashAttention, TokamaxAttention
from titan_core.models.common.attention import Attention, NaiveAttention, SDPAttention
from titan_core.models.common.protocol import ModelBase


CAP = 1.5  # with scale 4 the raw scores reach several units, so the cap bites


def _inputs(mask="causal"):
    window, packed, kv_heads = MASKS[mask]
    q, k, v, seg = attention_inputs(kv_heads=kv_heads, packed=packed)
    return q, k, v, seg, window


def _by_hand(q, k, v, *, scale, cap, window, segment_ids):
    """softmax(cap * tanh(q k^T * scale / cap) + mask) v, written out in fp64."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.tanh(q @ k.transpose(-2, -1) * scale / cap) * cap
    n = q.shape[2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    keep = (j <= i) & ((i - j < window) if window else True)
    keep = keep[None, None]
    if segment_ids is not None:
        keep = keep & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


@pytest.mark.parametrize("mask", list(MASKS))
def test_naive_caps_the_scores(mask):
    q, k, v, seg, window = _inputs(mask)
    got = NaiveAttention()(q, k, v, scale=4.0, window=window, segment_ids=seg, softcap=CAP)
    want = _by_hand(q, k, v, scale=4.0, cap=CAP, window=window, segment_ids=seg)
    assert rel_l2(got.double(), want) <= FP32_TOL
    uncapped = NaiveAttention()(q, k, v, scale=4.0, window=window, segment_ids=seg)
    assert rel_l2(uncapped, got) > 1e-2  # the cap changed the answer: not a vacuous comparison


@pytest.mark.parametrize("mask", list(MASKS))
def test_flex_caps_like_the_reference(mask):
    q, k, v, seg, window = _inputs(mask)
    ref = NaiveAttention()(q, k, v, scale=4.0, window=window, segment_ids=seg, softcap=CAP)
    with torch.no_grad():  # no FlexAttention backward on CPU in torch 2.13
        got = FlexAttention()(q, k, v, scale=4.0, window=window, segment_ids=seg, softcap=CAP)
    assert rel_l2(got, ref) <= FP32_TOL


@pytest.mark.parametrize(
    "core", [SDPAttention(), TokamaxAttention(), SplashAttention(interpret=True)], ids=["sdpa", "tokamax", "splash"]
)
def test_kernels_that_cannot_cap_refuse(core):
    q, k, v, seg, window = _inputs()
    with pytest.raises(KernelRefusesModel, match="cannot soft-cap attention scores .* caps them at 1.5"):
        core(q, k, v, scale=4.0, window=window, segment_ids=seg, softcap=CAP)


class _Block(torch.nn.Module):
    def __init__(self, cap):
        super().__init__()
        self.attention = Attention(32, 4, 2, 8, softcap=cap)


class _Model(ModelBase):  # the swap registry reads a model's swap_paths / swap_refusals (TrainableModel)
    def __init__(self, cap):
        super().__init__()
        self.layers = torch.nn.ModuleDict({"0": _Block(cap)})


def _forward(model, x):
    from titan_core.models.common.layers import rope_cos_sin, rope_inv_freq

    pos = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    cos, sin = rope_cos_sin(rope_inv_freq(8, 10000.0), pos, torch.float32)
    return model.layers["0"].attention(x, cos, sin)


def test_a_capped_library_attention_takes_the_kernels_that_honour_the_cap():
    torch.manual_seed(0)
    model = _Model(CAP)
    assert isinstance(model.layers["0"].attention.core, NaiveAttention)  # the capping core, not sdpa
    with torch.no_grad():
        model.layers["0"].attention.wq.weight.mul_(20)  # scores large enough for the cap to matter
    x = torch.randn(2, 16, 32)
    ref = _forward(model, x)
    uncapped = _Model(None)
    uncapped.load_state_dict(model.state_dict())
    assert rel_l2(_forward(uncapped, x), ref) > 1e-2

    apply_swaps(model, ["attention.flex"])
    with torch.no_grad():
        assert rel_l2(_forward(model, x), ref) <= FP32_TOL
    apply_swaps(model, ["attention.sdpa"])
    with pytest.raises(KernelRefusesModel, match="kernels.attention=sdpa cannot soft-cap"):
        _forward(model, x)
