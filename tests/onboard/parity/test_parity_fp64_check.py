"""Parity's fp64 check (onboard/parity/check.py `_fp64_check`): a gradient over the grad tolerance
is judged against the upstream model run in fp64. A native gradient as close to it as upstream's own
fp32 one is rounding and excused; one further off is not; no gradient over the tolerance, no fp64 run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from onboard.parity.check import _fp64_check
from onboard.parity.compare import GradReport
from onboard.upstream.hf_model import build_upstream

pytestmark = pytest.mark.hf

NAME = "model.layers.1.mlp.down_proj.weight"


def _upstream_with_grads():
    import transformers as tf

    cfg = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=64, vocab_size=64)  # fmt: skip
    hf = build_upstream(cfg.to_dict(), seed=0).model
    tokens = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1))
    F.cross_entropy(hf(input_ids=tokens, use_cache=False).logits.flatten(0, 1), labels.flatten()).backward()
    return hf, tokens, labels


def test_a_native_gradient_as_close_to_fp64_as_upstreams_is_excused_and_one_further_is_not():
    hf, tokens, labels = _upstream_with_grads()
    theirs = dict(hf.named_parameters())[NAME].grad
    params = {"grad_rounding_factor": 2}
    same = _fp64_check(hf, GradReport(1.0, NAME, {NAME: 1.0}, mapped={NAME: theirs.clone()}), tokens, labels, params)
    assert same[NAME]["rounding"] is True and 0 < same[NAME]["reference_vs_fp64"] < 1e-5
    off = _fp64_check(hf, GradReport(1.0, NAME, {NAME: 1.0}, mapped={NAME: theirs * (1 + 1e-3)}), tokens, labels, params)
    assert off[NAME]["rounding"] is False and off[NAME]["candidate_vs_fp64"] > 1e-4
    # every gradient within the tolerance: nothing to judge, no fp64 run
    assert _fp64_check(hf, GradReport(0.0, NAME, {NAME: 0.0}, mapped={NAME: theirs}), tokens, labels, params) == {}
