"""kernels.float8 (torchao float8 training, emulated on CPU): a layer within the documented bound of
nn.Linear, which linears convert and why the others do not, a tiny model trained through the
Trainer against the same bf16 run, and the refusals."""

import logging
import math
import sys
import typing

import pytest
import torch
from torch import nn
from tiny_flags import tiny_run_flags

from titan_core.config import load_config
from titan_core.models.common import swaps as registry
from titan_core.config.loader import ConfigError
from titan_core.config.sections import Kernels
from titan_core.models.common.swaps import SwapNotApplicable, apply_swaps, swap_applicability, swap_selection
from titan_core.kernels import KernelUnavailable, swaps_for
from titan_core.kernels.float8 import (
    E4M3_UNIT_ROUNDOFF,
    FLOAT8_GRAD_REL_L2,
    FLOAT8_LOSS_REL,
    FLOAT8_OUTPUT_REL_L2,
    FLOAT8_RECIPES,
    float8_swap,
)
from titan_core.kernels.float8_linear import Float8TrainingLinear, emulate_on
from titan_core.measure.numerics import rel, rel_l2
from titan_core.models import build_meta, resolve_args
from titan_core.train import run

IN, OUT, ROWS = 128, 64, 64
FLOOR = E4M3_UNIT_ROUNDOFF / 4
"""Below this the output was not rounded to float8 at all (a bf16 linear alone is off by ~0.003)."""


def _layer_run(module: nn.Module, x: torch.Tensor, cot: torch.Tensor):
    x = x.clone().requires_grad_()
    out = module(x)
    out.backward(cot)
    return out.detach(), x.grad, module.weight.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("recipe", FLOAT8_RECIPES)
def test_layer_within_bound_of_linear(recipe, dtype):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(OUT, IN, generator=gen) / math.sqrt(IN)
    x = torch.randn(ROWS, IN, generator=gen).to(dtype)
    cot = torch.randn(ROWS, OUT, generator=gen).to(dtype)
    plain = nn.Linear(IN, OUT, bias=False).to(dtype)
    source = nn.Linear(IN, OUT, bias=False).to(dtype)
    with torch.no_grad():
        plain.weight.copy_(w)
        source.weight.copy_(w)
    f8 = Float8TrainingLinear.from_linear(source, recipe)
    assert f8.emulated and f8.weight is source.weight  # CPU: torchao's emulation, the same parameter
    want = _layer_run(plain, x, cot)
    got = _layer_run(f8, x, cot)
    assert got[0].dtype == dtype
    e = rel_l2(got[0], want[0])
    assert FLOOR < e <= FLOAT8_OUTPUT_REL_L2[recipe], f"{recipe} output rel {e:.4f} vs {dtype} nn.Linear"
    for name, g, ref in zip(("input grad", "weight grad"), got[1:], want[1:]):
        e = rel_l2(g, ref)
        assert FLOOR < e <= FLOAT8_GRAD_REL_L2[recipe], f"{recipe} {name} rel {e:.4f} vs {dtype} nn.Linear"
    # and against the exact product (fp64): the bound holds for the float8 rounding itself
    exact = x.double() @ w.double().T
    e = rel_l2(got[0], exact)
    assert e <= FLOAT8_OUTPUT_REL_L2[recipe], f"{recipe} output rel {e:.4f} vs fp64"


def test_materialising_chooses_the_matmuls_and_keeps_names():
    with torch.device("meta"):
        lin = nn.Linear(32, 16)
    f8 = Float8TrainingLinear.from_linear(lin, "tensorwise")
    assert not f8.emulated  # unresolved on meta: no device yet
    assert [n for n, _ in f8.named_parameters()] == ["weight", "bias"]
    f8.to_empty(device="cpu")
    assert f8.emulated and all(c.emulate for c in f8.linear_mm_config)


def test_refused_where_no_float8_path(monkeypatch):
    with pytest.raises(KernelUnavailable, match="kernels.float8=rowwise is not available on xla"):
        emulate_on(torch.device("xla"), "rowwise")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    with pytest.raises(KernelUnavailable, match=r"compute capability 8.9 or newer.*A100 is 8.0"):
        emulate_on(torch.device("cuda", 0), "tensorwise")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    assert emulate_on(torch.device("cuda", 0), "tensorwise") is False  # torch._scaled_mm


def test_swaps_for_selects_one_swap_per_recipe():
    values = typing.get_args(typing.get_type_hints(Kernels)["float8"])
    assert tuple(v for v in values if v != "none") == FLOAT8_RECIPES
    assert swaps_for(Kernels(float8="none")) == []
    for recipe in FLOAT8_RECIPES:
        assert swaps_for(Kernels(float8=recipe)) == [f"float8.{recipe}"]
    with pytest.raises(ConfigError, match="kernels.float8 must be none or one of tensorwise, rowwise, got 'delayed'"):
        float8_swap("delayed")


def test_without_torchao_the_swap_says_how_to_install_it(monkeypatch):
    # a registry without the float8 swaps, and an import of the torchao module that fails
    monkeypatch.setattr(registry, "_REGISTRY", {k: v for k, v in registry._REGISTRY.items() if k[:7] != "float8."})
    monkeypatch.setitem(sys.modules, "titan_core.kernels.float8_linear", None)
    with pytest.raises(KernelUnavailable, match=r"needs torchao .*pip install 'titan-onboard\[float8\]'"):
        swaps_for(Kernels(float8="tensorwise"))


def test_filter_converts_eligible_linears_and_logs_the_rest(caplog):
    # head_dim 12: wk / wv are 24 x 64 (skipped), wq 48 x 64 and wo 64 x 48 convert; the router 64 -> 4 is skipped
    args = resolve_args("qwen3_moe", "debugmodel", dict(n_layers=1, dim=64, n_heads=4, n_kv_heads=2, head_dim=12,
                        vocab_size=256, n_experts=4, top_k=2, moe_hidden_dim=32))  # fmt: skip
    model = build_meta("qwen3_moe", args)
    taken, skipped = swap_selection(model, float8_swap("tensorwise"))
    assert taken == ["layers.0.attention.wq", "layers.0.attention.wo"]
    assert {p: why.split(":")[0] for p, why in skipped.items()} == {
        "layers.0.attention.wk": "weight 24x64",
        "layers.0.attention.wv": "weight 24x64",
        "layers.0.moe.router.gate": "MoE router",
        "output": "output head",
    }
    assert "not multiples of 16" in skipped["layers.0.attention.wk"]
    with caplog.at_level(logging.INFO, logger="titan_core.swaps"):
        claimed = apply_swaps(model, ["float8.tensorwise"])
    assert sorted(claimed) == sorted(taken)
    assert all(type(model.get_submodule(p)) is Float8TrainingLinear for p in taken)
    assert all(type(model.get_submodule(p)) is nn.Linear for p in skipped)
    for p, why in skipped.items():
        assert f"swap float8.tensorwise: skipped {p}: {why}" in caplog.text


class _OwnLinear(nn.Linear):
    """A model's own linear (say, one with a hook of its own): never replaced."""


class _HfStyle(nn.Module):
    """A tree named as transformers names it: the router is `mlp.gate`, the head `lm_head`."""

    swap_paths: dict = {}

    def __init__(self):
        super().__init__()
        self.args = resolve_args("qwen3_moe", "debugmodel", dict(dim=64, n_experts=4))
        self.mlp = nn.ModuleDict({"gate": nn.Linear(64, 4, bias=False), "up_proj": nn.Linear(64, 128)})
        self.proj = _OwnLinear(64, 64)
        self.lm_head = nn.Linear(64, 256, bias=False)


def test_filter_knows_routers_heads_and_own_linears_by_shape_name_and_class():
    taken, skipped = swap_selection(_HfStyle(), float8_swap("rowwise"))
    assert taken == ["mlp.up_proj"]
    assert {p: why.split(":")[0] for p, why in skipped.items()} == {
        "mlp.gate": "MoE router",  # 64 -> n_experts, whatever its name
        "proj": "_OwnLinear is the model's own subclass, not replaced",
        "lm_head": "output head",
    }


def test_model_without_eligible_linear_is_refused(tmp_path):
    # dim 24, head_dim 12, ffn 40: no linear has both dims multiples of 16
    sizes = dict(n_layers=1, dim=24, n_heads=2, n_kv_heads=2, ffn_hidden_dim=40, vocab_size=64)
    small = "--model.overrides={" + ", ".join(f"{k} = {v}" for k, v in sizes.items()) + "}"
    model = build_meta("llama3", resolve_args("llama3", "debugmodel", sizes))
    why = swap_applicability(model, [float8_swap("rowwise")])["float8.rowwise"]
    assert why is not None and why.startswith("every candidate is skipped") and "not multiples of 16" in why
    cfg = load_config(None, [small, *tiny_run_flags(tmp_path, steps=1, batch_size=1), "--kernels.float8=rowwise"])
    with pytest.raises(SwapNotApplicable, match=r"swap 'float8.rowwise' does not apply to this model: every candidate"):
        run(cfg, quiet=True)


TINY = "--model.overrides={n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, ffn_hidden_dim = 128, vocab_size = 256}"


def _train(tmp_path, float8: str):
    flags = tiny_run_flags(tmp_path / float8, steps=10, batch_size=4)
    cfg = load_config(None, [TINY, *flags, "--training.dtype=bfloat16", "--data.repeat_batch=true",
                             f"--kernels.float8={float8}"])  # fmt: skip
    return run(cfg, quiet=True)


@pytest.fixture(scope="module")
def bf16_losses(tmp_path_factory):
    return [m["loss"] for m in _train(tmp_path_factory.mktemp("bf16"), "none").metrics]


@pytest.mark.parametrize("recipe", FLOAT8_RECIPES)
def test_tiny_model_trains_close_to_bf16(tmp_path, recipe, bf16_losses):
    result = _train(tmp_path, recipe)
    losses = [m["loss"] for m in result.metrics]
    assert len(losses) == 10 and all(math.isfinite(v) for v in losses + [m["grad_norm"] for m in result.metrics])
    # every block linear (2 layers x wq wk wv wo w1 w2 w3) converted; the output head not
    assert len(result.swaps) == 14 and set(result.swaps.values()) == {f"float8.{recipe}"}
    assert "output" not in result.swaps
    assert losses[-1] < losses[0] - 1.0 and bf16_losses[-1] < bf16_losses[0] - 1.0  # both learn the repeated batch
    e = rel(losses[-1], bf16_losses[-1])
    assert e <= FLOAT8_LOSS_REL, f"{recipe} final loss {losses[-1]:.4f} vs bf16 {bf16_losses[-1]:.4f}: rel {e:.4f}"


def _sm89():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not _sm89(), reason="the real float8 matmuls (torch._scaled_mm) need a CUDA GPU of SM89+")
@pytest.mark.parametrize("recipe", FLOAT8_RECIPES)
def test_real_kernels_on_cuda_within_bound(recipe):
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(256, 512, generator=gen) / math.sqrt(512)).cuda().bfloat16()
    x = torch.randn(256, 512, generator=gen).cuda().bfloat16()
    plain = nn.Linear(512, 256, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        plain.weight.copy_(w)
    f8 = Float8TrainingLinear.from_linear(plain, recipe)
    assert not f8.emulated
    with torch.no_grad():
        e = rel_l2(f8(x), x @ w.T)
    assert FLOOR < e <= FLOAT8_OUTPUT_REL_L2[recipe]
