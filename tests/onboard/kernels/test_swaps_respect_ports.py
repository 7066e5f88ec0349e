"""Swaps respect a model's own modules: a kernel swap replaces only the library module at its
path (or another kernel for it), never a port's own class there (issue #11 item 4).

The port here is the llama3 debug model with every `layers.*.attention.core` replaced by a
soft-capping core of its own (Gemma-2 style): swapping in a library core would drop the cap.
"""

import logging

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch
from torch import nn

import titan_core.kernels  # noqa: F401  (registers the kernel swaps)
from onboard.ladder.gates import load_checklist
from titan_core.config.loader import ConfigError
from titan_core.models.common.swaps import (
    SwapNotApplicable,
    apply_swaps,
    register_swap,
    registered_swaps,
    swap_applicability,
)
from onboard.rungs.kernels_rung.compare import applicable_kernels, compare_kernel
from onboard.rungs.kernels_rung.compare import KERNEL_FLAGS
from titan_core.kernels.fused_ce import FusedCrossEntropyHead
from titan_core.kernels.moe import GroupedMMExperts
from titan_core.models import build_meta, resolve_args
from titan_core.models.common.attention import NaiveAttention, SDPAttention, attention_mask
from titan_core.models.common.layers import CrossEntropyHead
from titan_core.models.common.moe_static import DenseExperts

CAP = 5.0
FP32_TOL = load_checklist("kernels").criterion("grads").threshold  # the kernels gate's fp32 bound


class SoftcapCore(nn.Module):
    """A port's own attention core: scores soft-capped, cap * tanh(s / cap), before the mask."""

    def __init__(self, cap: float = CAP):
        super().__init__()
        self.cap = cap

    def forward(self, q, k, v, *, scale, window, segment_ids):
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.tanh((q @ k.transpose(-2, -1)) * scale / self.cap) * self.cap
        mask = attention_mask(q.shape[2], window=window, segment_ids=segment_ids, device=q.device)
        return torch.softmax(scores.masked_fill(~mask, float("-inf")).float(), dim=-1).to(q.dtype) @ v


class MySDPA(SDPAttention):
    """A subclass of a library core is the port's own class too: it may change what the core does."""


class OwnLossHead(CrossEntropyHead):
    pass


def _args(family="llama3", **over):
    return resolve_args(family, "debugmodel", {"n_layers": 2, **over})


def _port(args=None, core=SoftcapCore, layers=None):
    """The port's meta-device builder: the family model with its own core in `layers` (default all)."""
    args = args or _args()

    def build():
        model = build_meta("llama3", args)
        for i, layer in model.layers.items():
            if layers is None or int(i) in layers:
                layer.attention.core = core()
        return model

    return build


def _cores(model):
    return [type(layer.attention.core) for layer in model.layers.values()]


def test_a_kernel_swap_refuses_a_ports_own_attention_core():
    model = _port()()
    with pytest.raises(SwapNotApplicable, match=r"layers\.\*\.attention\.core is SoftcapCore") as err:
        apply_swaps(model, ["attention.naive"])
    assert "NaiveAttention" in str(err.value) and "SDPAttention" in str(err.value)  # what it does replace
    assert isinstance(err.value, ConfigError)  # a configuration error: the CLI exits 2
    assert _cores(model) == [SoftcapCore, SoftcapCore]  # nothing replaced


def test_refused_when_only_some_layers_are_the_ports_own():
    model = _port(layers={1})()
    with pytest.raises(SwapNotApplicable, match=r"layers\.1\.attention\.core is SoftcapCore"):
        apply_swaps(model, ["attention.sdpa"])
    assert _cores(model) == [SDPAttention, SoftcapCore]  # not half swapped


def test_a_subclass_of_a_library_core_is_the_ports_own():
    with pytest.raises(SwapNotApplicable, match="is MySDPA"):
        apply_swaps(_port(core=MySDPA)(), ["attention.naive"])


def test_kernels_replace_each_other():
    """A module some kernel put there (or a builder built as that kernel) takes its siblings."""
    model = _port(core=NaiveAttention)()
    apply_swaps(model, ["attention.flex"])
    apply_swaps(model, ["attention.sdpa"])
    assert _cores(model) == [SDPAttention, SDPAttention]

    moe = build_meta("qwen3_moe", _args("qwen3_moe"))
    apply_swaps(moe, ["moe.grouped_mm"])
    apply_swaps(moe, ["moe.dense"])  # registered in models/common, yet takes the kernel's experts
    assert {type(layer.moe.experts) for layer in moe.layers.values()} == {DenseExperts}
    apply_swaps(moe, ["moe.grouped_mm"])
    assert {type(layer.moe.experts) for layer in moe.layers.values()} == {GroupedMMExperts}


def test_a_ports_own_loss_head_is_not_replaced():
    model = build_meta("llama3", _args())
    model.loss_head = OwnLossHead(None)
    from titan_core.config.sections import Kernels
    from titan_core.kernels import swaps_for

    with pytest.raises(SwapNotApplicable, match="loss_head is OwnLossHead"):
        apply_swaps(model, swaps_for(Kernels(loss="fused_ce")))
    assert type(model.loss_head) is OwnLossHead
    plain = build_meta("llama3", _args())
    apply_swaps(plain, swaps_for(Kernels(loss="fused_ce")))
    apply_swaps(plain, swaps_for(Kernels(z_loss=1e-4)))  # the plain z-loss head replaces the fused one
    assert type(plain.loss_head).__name__ == "ZLossCrossEntropyHead"


def test_swap_applicability_says_why_without_replacing():
    model = _port(layers={0})()
    got = swap_applicability(model, ["attention.naive", "moe.dense", "loss.fused_ce"])
    assert "layers.0.attention.core is SoftcapCore" in got["attention.naive"]
    assert got["moe.dense"] == "no module matches 'layers.*.moe.experts'"
    assert got["loss.fused_ce"] is None
    assert _cores(model) == [SoftcapCore, SDPAttention]


def test_every_library_swap_states_what_it_replaces_and_builds():
    from titan_core.config.sections import Kernels
    from titan_core.kernels import swaps_for

    swaps_for(Kernels(loss="fused_ce", z_loss=1e-3))  # the loss swaps register on first use
    swaps_for(Kernels(z_loss=1e-3))
    ours = {n: s for n, s in registered_swaps().items() if s.factory.__module__.startswith("titan_core.")}
    assert {"attention.naive", "moe.dense", "moe.grouped_mm"} <= set(ours)
    assert not [n for n, s in ours.items() if not s.replaces or not s.produces]


def test_a_factory_that_builds_an_undeclared_class_is_caught(monkeypatch):
    from titan_core.models.common import swaps as registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # the test swap goes with the test
    register_swap("test.liar", "layers.*.attention.core", replaces=SDPAttention, produces=NaiveAttention)(
        lambda old, path: SDPAttention()
    )
    with pytest.raises(TypeError, match="test.liar"):
        apply_swaps(build_meta("llama3", _args()), ["test.liar"])


def test_applicable_kernels_on_a_port_names_its_core():
    port = _port()()
    got = applicable_kernels(_args(), model=port)
    assert list(got) == list(KERNEL_FLAGS)
    for flag in (
        "kernels.attention=sdpa",
        "kernels.attention=tokamax",
        "kernels.attention=flex",
        "kernels.attention=splash",
    ):
        assert "layers.*.attention.core is SoftcapCore" in got[flag], flag
    assert got["kernels.loss=fused_ce"] is None  # the loss head is still the library's
    assert "dense model" in got["kernels.moe=dense"]  # the dense reason stays
    assert _cores(port) == [SoftcapCore, SoftcapCore]
    # the library model: as without a model
    assert applicable_kernels(_args(), model=build_meta("llama3", _args())) == applicable_kernels(_args())


def test_compare_kernel_on_a_port_refuses_instead_of_comparing_library_cores():
    with pytest.raises(SwapNotApplicable, match=r"layers\.\*\.attention\.core is SoftcapCore"):
        compare_kernel("llama3", _args(), "kernels.attention=sdpa", build_meta_model=_port(), seq_len=16)


def test_compare_kernel_on_a_port_still_compares_the_loss():
    from titan_core.config.sections import Kernels

    for base in (None, Kernels(ce_chunk=8)):  # only attention has a built-in swap to name: no loss.fused_ce twice
        cmp = compare_kernel(
            "llama3", _args(), "kernels.loss=fused_ce", build_meta_model=_port(), seq_len=16, base=base
        )
        assert cmp.loss_rel_err <= FP32_TOL and cmp.max_grad_rel_err <= FP32_TOL


def test_the_sdpa_side_of_a_comparison_runs_sdpa(caplog):
    """attention=sdpa is the built-in default (no swap in a recipe); a comparison still swaps it in,
    so a builder that put naive cores there does not get naive compared against naive."""
    with caplog.at_level(logging.INFO, logger="titan_core.swaps"):
        compare_kernel(
            "llama3", _args(), "kernels.attention=sdpa", build_meta_model=_port(core=NaiveAttention), seq_len=16
        )
    assert any(
        "attention.sdpa: layers.0.attention.core NaiveAttention -> SDPAttention" in r.message for r in caplog.records
    )


def test_loss_swap_keeps_the_heads_settings():
    model = build_meta("llama3", _args())
    model.loss_head = CrossEntropyHead(7.0, ignore_index=-1)
    from titan_core.config.sections import Kernels
    from titan_core.kernels import swaps_for

    apply_swaps(model, swaps_for(Kernels(loss="fused_ce")))
    assert isinstance(model.loss_head, FusedCrossEntropyHead)
    assert (model.loss_head.final_softcap, model.loss_head.ignore_index) == (7.0, -1)


PORT_MODEL_PY = """
import torch
from titan_core.models.common.attention import attention_mask
from titan_core.models.llama3.model import Llama3


class SoftcapCore(torch.nn.Module):
    def forward(self, q, k, v, *, scale, window, segment_ids):
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = torch.tanh((q @ k.transpose(-2, -1)) * scale / 5.0) * 5.0
        mask = attention_mask(q.shape[2], window=window, segment_ids=segment_ids, device=q.device)
        return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def build_model(args):
    model = Llama3(args)
    for layer in model.layers.values():
        layer.attention.core = SoftcapCore()
    return model
"""


def test_training_a_port_with_a_kernel_its_core_cannot_take_exits_2(tmp_path, capsys):
    from titan_core.train import main

    (tmp_path / "model.py").write_text(PORT_MODEL_PY)
    argv = [f"--model.module_file={tmp_path / 'model.py'}", "--model.family=llama3", "--kernels.attention=naive",
            "--training.steps=1", "--training.batch_size=1", "--training.seq_len=16", "--metrics.rich=false",
            f"--metrics.output_dir={tmp_path}", "--device.type=cpu"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "layers.*.attention.core is SoftcapCore" in err and "Traceback" not in err
