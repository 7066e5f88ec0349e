"""A kernel that cannot compute the model (sdpa under gemma2's soft-capped attention scores) is
recorded by the kernels rung as not applicable with its reason, not as a kernel that raised."""

from __future__ import annotations

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)

pytestmark = pytest.mark.hf

GEMMA2 = dict(model_type="gemma2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=128, vocab_size=256, sliding_window=32)  # fmt: skip


def test_sdpa_refuses_softcapped_gemma2_and_the_rung_says_not_applicable():
    from titan_core.kernels import KernelRefusesModel, KernelUnavailable
    from onboard.rungs.kernels_rung.compare import compare_kernel
    from titan_core.models.transformers import ADAPTER

    from onboard.rungs.kernels_rung import rung as kernels

    args = ADAPTER.args_from_hf(GEMMA2)[0]
    build = dict(family="transformers", args=args, device="cpu", batch=1, seq_len=16)
    with pytest.raises(KernelRefusesModel, match="attn_logit_softcapping") as e:
        compare_kernel(flag="kernels.attention=sdpa", **build)
    assert isinstance(e.value, KernelUnavailable)  # callers that catch the parent still do
    logged = []
    ctx = type("Ctx", (), {"log": staticmethod(logged.append)})()
    row = kernels._one_kernel(
        ctx, "kernels.attention=sdpa", build=build, criteria=kernels.tolerances(), mode_kw={}
    )
    assert row["status"] == "not_applicable" and "soft-cap" in row["reason"]
    m = kernels.summarise(
        {
            "kernels.attention=sdpa": row,
            "kernels.loss=fused_ce": {
                "status": "compared",
                "loss_rel_err": 0.0,
                "logits_rel_err": 0.0,
                "max_grad_rel_err": 0.0,
            },
        }
    )
    assert (m["kernels_raised"], m["kernels_not_applicable"], m["kernels_compared"]) == (0, 1, 1)
    assert "soft-cap" in m["attention_sdpa_not_applicable"]


def test_a_missing_extra_still_counts_as_raised(monkeypatch):
    from titan_core.kernels import KernelUnavailable

    from onboard.rungs.kernels_rung import rung as kernels

    def boom(**_):
        raise KernelUnavailable("kernels.attention=tokamax needs jax")

    monkeypatch.setattr(kernels, "compare_kernel", boom)  # the rung's own name for it (imported at module level)
    ctx = type("Ctx", (), {"log": staticmethod(lambda s: None)})()
    row = kernels._one_kernel(ctx, "kernels.attention=tokamax", build={}, criteria={}, mode_kw={})
    assert row["status"] == "raised" and "needs jax" in row["error"]
