"""onboard.rungs.kernels_rung.compare: which kernels apply, kernel vs plain path, timing through the protocol."""

import importlib.util

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch

from titan_core.config.loader import ConfigError
from titan_core.config.sections import Kernels
from onboard.rungs.kernels_rung.compare import applicable_kernels, compare_kernel, measure_kernel
from onboard.rungs.kernels_rung.compare import KERNEL_FLAGS, parse_flag
from titan_core.measure.timing import TimingProtocol
from timing_checks import check_comparison

from onboard.ladder.gates import interval_measured, load_checklist

QUICK = TimingProtocol(warmup=1, min_rounds=2, max_rounds=2)
from titan_core.models import build_meta, resolve_args

FP32_TOL = load_checklist("kernels").criterion("grads").threshold  # the kernels gate's fp32 bound

HAS_JAX = all(importlib.util.find_spec(m) for m in ("jax", "tokamax"))


def _args(family, **over):
    return resolve_args(family, "debugmodel", {"n_layers": 2, **over})


def test_applicable_kernels_dense_vs_moe():
    dense = applicable_kernels(_args("llama3"))
    assert list(dense) == list(KERNEL_FLAGS)
    assert dense["kernels.loss=fused_ce"] is None
    assert "dense model" in dense["kernels.moe=grouped_mm"] and "dense model" in dense["kernels.moe=tokamax"]
    assert "no backward on CPU" in dense["kernels.attention=flex"]
    assert "TPU kernel" in dense["kernels.attention=splash"]
    assert (dense["kernels.attention=tokamax"] is None) == HAS_JAX

    moe = applicable_kernels(_args("qwen3_moe"))
    assert moe["kernels.moe=grouped_mm"] is None
    assert (moe["kernels.moe=tokamax"] is None) == HAS_JAX
    on_tpu = applicable_kernels(_args("qwen3_moe"), device="tpu")  # a string: no torch_tpu needed to ask
    assert on_tpu["kernels.attention=splash"] is None
    assert "CPU and CUDA only" in on_tpu["kernels.moe=grouped_mm"]
    assert (
        "bf16 only under torch.compile"
        in applicable_kernels(_args("qwen3_moe"), captured=True)["kernels.moe=grouped_mm"]
    )
    assert applicable_kernels(_args("qwen3_moe"), dtype=torch.bfloat16, captured=True)["kernels.moe=grouped_mm"] is None
    odd = applicable_kernels(_args("qwen3_moe", moe_hidden_dim=250), dtype=torch.bfloat16)
    assert "moe_hidden_dim=250" in odd["kernels.moe=grouped_mm"]


def test_parse_flag():
    assert parse_flag("kernels.moe=grouped_mm") == ("moe", "grouped_mm")
    with pytest.raises(ConfigError, match="not a kernel flag"):
        parse_flag("compile.enable=true")
    with pytest.raises(ConfigError, match="one of plain, fused_ce"):
        parse_flag("kernels.loss=liger")


@pytest.mark.parametrize(
    "family,flag",
    [
        ("llama3", "kernels.loss=fused_ce"),
        ("glimmer", "kernels.attention=sdpa"),  # sliding windows + soft-cap + packed documents
        ("qwen3_moe", "kernels.moe=grouped_mm"),
    ],
)
def test_compare_kernel_passes_at_fp32_tolerance(family, flag):
    cmp = compare_kernel(family, _args(family), flag, batch=2, seq_len=40)
    assert (
        cmp.reference
        == {"loss": "kernels.loss=plain", "attention": "kernels.attention=naive", "moe": "kernels.moe=loop"}[
            flag.split("=")[0].split(".")[1]
        ]
    )
    assert cmp.loss_rel_err <= FP32_TOL and cmp.logits_rel_err <= FP32_TOL
    assert cmp.max_grad_rel_err <= FP32_TOL, cmp.worst_param
    assert set(cmp.grad_rel_err) == {n for n, _ in build_meta(family, _args(family)).named_parameters()}
    assert set(cmp.to_dict()) >= {"flag", "loss", "loss_reference", "max_grad_rel_err", "worst_param"}


def test_compare_kernel_catches_a_wrong_gradient(monkeypatch):
    """A kernel whose loss is right but whose gradient is 0.1% off must not pass."""
    from titan_core.kernels import fused_ce

    right = fused_ce._chunk_grads

    def off_by_a_little(p, *rest):
        right(p.mul_(1.001), *rest)

    monkeypatch.setattr(fused_ce, "_chunk_grads", off_by_a_little)
    cmp = compare_kernel("llama3", _args("llama3"), "kernels.loss=fused_ce", seq_len=16, base=Kernels(ce_chunk=8))
    assert cmp.loss_rel_err <= FP32_TOL
    assert cmp.max_grad_rel_err > 1e-4


def test_compare_kernel_carries_base_settings_to_both_sides():
    plain = compare_kernel("llama3", _args("llama3"), "kernels.loss=fused_ce", seq_len=16)
    z = compare_kernel("llama3", _args("llama3"), "kernels.loss=fused_ce", seq_len=16, base=Kernels(z_loss=0.1))
    assert z.loss_rel_err <= FP32_TOL and z.max_grad_rel_err <= FP32_TOL
    assert abs(z.loss - plain.loss) > 1e-3  # z-loss was applied (to both sides)


def test_measure_kernel_reports_time_and_memory():
    """Fused CE in 32-token chunks never holds the [256, vocab] logits the plain loss keeps (and
    their log-softmax, and their gradient): its step peaks lower, as counted tensor bytes."""
    args = _args("llama3", n_layers=1)
    out = measure_kernel(
        "llama3", args, "kernels.loss=fused_ce", batch=4, seq_len=64, protocol=QUICK, base=Kernels(ce_chunk=32)
    )
    assert out["reference"] == "kernels.loss=plain"
    t = out["timing"]
    # 2 rounds: the interval says something (printed) or is too wide to (not measured, no interval printed)
    shown = "CI" if interval_measured(t["ci_low"], t["ci_high"]) else "interval not measured"
    assert t["rounds"] == 2 and shown in out["describe"]
    check_comparison(t, QUICK.min_effect)  # the outcome is the one its interval gives
    assert (t["candidate_median_s"], t["baseline_median_s"]) == (
        out["with_kernel"]["step_time_s"],
        out["with_reference"]["step_time_s"],
    )
    logits = 4 * 64 * args.vocab_size * 4
    plain, fused = out["with_reference"]["peak_memory_bytes"], out["with_kernel"]["peak_memory_bytes"]
    assert plain >= 2 * logits  # logits and log-softmax alive together
    assert fused < plain - logits


@pytest.mark.skipif(not HAS_JAX, reason="needs jax and tokamax (the [jax] extra)")
def test_measure_kernel_does_not_claim_memory_for_a_jax_kernel():
    out = measure_kernel("llama3", _args("llama3", n_layers=1), "kernels.attention=tokamax", seq_len=16, protocol=QUICK)
    assert out["with_kernel"]["peak_memory_bytes"] is None
    assert "outside torch" in out["with_kernel"]["peak_memory_note"]
    assert out["with_reference"]["peak_memory_bytes"] > 0


def test_measure_kernel_against_another_kernel():
    out = measure_kernel(
        "llama3", _args("llama3", n_layers=1), "kernels.attention=sdpa", against="naive", seq_len=16, protocol=QUICK
    )
    assert out["reference"] == "kernels.attention=naive" and out["timing"]["rounds"] == 2


def test_a_gradient_over_the_tolerance_is_judged_against_the_plain_path_in_fp64():
    """With the tolerance set below fp32 rounding, every differing gradient of sdpa (a correct kernel)
    goes to the fp64 check: each is as close to the fp64 plain path as the fp32 plain path is, so
    each is excused and the judged error is 0; the raw error and both sides' fp64 errors stay on record."""
    cmp = compare_kernel("llama3", _args("llama3"), "kernels.attention=sdpa", seq_len=32, grad_tolerance=1e-12)
    over = {n for n, e in cmp.grad_rel_err.items() if e > 1e-12}
    assert over and set(cmp.rounding) == over and cmp.rounding_error is None
    for n, r in cmp.rounding.items():
        assert 0 < r["reference_vs_fp64"] < FP32_TOL and r["candidate_vs_fp64"] <= cmp.rounding_factor * r["reference_vs_fp64"], n
        assert r["rounding"] is True
    assert set(cmp.excused) == over and cmp.max_grad_rel_err == 0.0 < cmp.max_grad_rel_err_raw
    # without a tolerance no fp64 run happens and every gradient is judged as measured
    plain = compare_kernel("llama3", _args("llama3"), "kernels.attention=sdpa", seq_len=32)
    assert plain.rounding == {} and plain.max_grad_rel_err == plain.max_grad_rel_err_raw == cmp.max_grad_rel_err_raw


def test_a_gradient_further_from_fp64_than_the_plain_path_is_not_excused():
    from onboard.rungs.kernels_rung.compare import KernelComparison

    cmp = KernelComparison(
        flag="kernels.attention=sdpa", reference="kernels.attention=naive", loss=1.0, loss_reference=1.0,
        loss_rel_err=0.0, logits_rel_err=0.0, grad_rel_err={"a": 3e-5, "b": 8e-5, "c": 1e-6},
        rounding={"a": {"candidate_vs_fp64": 2e-5, "reference_vs_fp64": 1.5e-5, "rounding": True},
                  "b": {"candidate_vs_fp64": 9e-5, "reference_vs_fp64": 1.6e-5, "rounding": False}},
        rounding_factor=2.0,
    )  # fmt: skip
    assert cmp.excused == ["a"] and cmp.max_grad_rel_err == 8e-5 and cmp.worst_param == "b"
    assert cmp.to_dict()["max_grad_rel_err_raw"] == 8e-5
