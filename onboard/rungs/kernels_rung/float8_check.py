"""kernels.float8 in the kernels rung: a precision change, judged by its own bound against the bf16
recipe rather than by the fp32 comparison every other kernel meets (DESIGN section 5). Not a rung.

float8 rounds each eligible linear's matmul operands to 3 (e4m3) or 2 (e5m2) mantissa bits, so no
float8 linear equals nn.Linear to 1e-5, as bf16 parameters do not equal fp32 ones at the
simple_fsdp rung. titan_core.kernels.float8 documents how far it may differ, and each recipe
(tensorwise, rowwise) is held to exactly those numbers, read there (one place):

1. per converted layer (`layer_check`): the layer with the model's initial weights in bf16 and
   fresh Gaussian inputs and output gradients (the setting of the bound's derivation),
   Float8TrainingLinear against the same nn.Linear in bf16: its output within
   FLOAT8_OUTPUT_REL_L2[recipe], its input and weight gradients within FLOAT8_GRAD_REL_L2[recipe]
   (relative L2, titan_core.measure.numerics);
2. the recipe's steps (`Float8Check.losses`): the gate's recipe (eager, its repeated batch) for
   params.float8_steps with kernels.float8 against the same steps without it, both in bf16: every
   step's loss within FLOAT8_LOSS_REL of the bf16 run's. A recipe that computes in fp32 is run in
   bf16 on both sides (training.dtype): float8's bound is against bf16, never fp32.

Which linears convert and which stay as they are, and why (output head, MoE router, a shape that is
not a multiple of 16), is titan_core's rule (`swap_selection`); the row lists both. A model with
no eligible linear, a device without float8 matmuls, or a model titan_core builds only in its init's
dtype (ShardedInitError: an init that returns to a parameter, e.g. Mamba's conv1d), is not_applicable with the
reason.

A recipe within both bounds that also runs in the recipe's execution mode (kernel_modes.mode_check)
is `eligible`: the keep rule (kernels_decide) times its whole steps against the recipe's value like
any kernel's and keeps it only when faster. On CPU the matmuls are torchao's emulation (float8
rounding, then an fp32 matmul): never faster than nn.Linear, so held there, and the row says why.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from onboard.ladder.measurements.kernels_measurements import KernelsMeasurements
from onboard.rungs import gate_recipe, train_run
from onboard.rungs.kernels_rung.compare import build_model_with, kernels_for, parse_flag
from onboard.rungs.kernels_rung.modes import mode_check
from titan_core.models.common.init_stand_in import ShardedInitError
from titan_core.models.common.swaps import SwapNotApplicable, swap_applicability, swap_selection
from titan_core.kernels import KernelUnavailable
from titan_core.kernels.float8 import FLOAT8_GRAD_REL_L2, FLOAT8_LOSS_REL, FLOAT8_OUTPUT_REL_L2, float8_swap
from titan_core.measure.numerics import curve_max_rel, rel_l2
from titan_core.models.registry import build_meta

RUNG = "kernels"
REFERENCE = "none"
"""The float8 value every recipe is judged against: the bf16 linears."""
PRECISION = "bf16"
"""The precision both sides of the check compute in, whatever the recipe's."""


def _layer_run(module: nn.Module, x: torch.Tensor, cot: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(output, input gradient, weight gradient) of one forward + backward with output gradient `cot`."""
    x = x.clone().requires_grad_()
    out = module(x)
    out.backward(cot)
    return out.detach(), x.grad, module.weight.grad


def layer_check(model: nn.Module, converted: list[str], recipe: str, *, rows: int, seed: int = 0) -> dict[str, Any]:
    """Each converted linear of `model` (bf16, initialised) as Float8TrainingLinear against itself as
    nn.Linear on `rows` fresh Gaussian inputs and output gradients: the worst output and gradient
    relative L2 errors, where, and their bounds (FLOAT8_OUTPUT_REL_L2 / FLOAT8_GRAD_REL_L2[recipe])."""
    from titan_core.kernels.float8_linear import Float8TrainingLinear  # lazy: the [float8] extra (torchao)

    gen = torch.Generator().manual_seed(seed)
    worst = {"output": (0.0, None), "grad": (0.0, None)}
    emulated = None
    for path in converted:
        linear = model.get_submodule(path)
        w = linear.weight
        x = torch.randn(rows, linear.in_features, generator=gen).to(w.device, w.dtype)
        cot = torch.randn(rows, linear.out_features, generator=gen).to(w.device, w.dtype)
        f8 = Float8TrainingLinear.from_linear(copy.deepcopy(linear), recipe)
        emulated = f8.emulated
        want, got = _layer_run(copy.deepcopy(linear), x, cot), _layer_run(f8, x, cot)
        errors = {"output": rel_l2(got[0], want[0]),
                  "grad": max(rel_l2(got[1], want[1]), rel_l2(got[2], want[2]))}  # fmt: skip
        for kind, e in errors.items():
            if not e <= worst[kind][0]:  # NaN ranks worst
                worst[kind] = (e, path)
    return {
        "layer_output_rel": worst["output"][0], "layer_output_worst": worst["output"][1],
        "layer_output_bound": FLOAT8_OUTPUT_REL_L2[recipe],
        "layer_grad_rel": worst["grad"][0], "layer_grad_worst": worst["grad"][1],
        "layer_grad_bound": FLOAT8_GRAD_REL_L2[recipe],
        "layer_rows": rows, "emulated": emulated,
    }  # fmt: skip


def layer_over_bound(row: dict) -> float:
    """The row's worst layer error as a fraction of its bound (output or gradient): <= 1 within."""
    return max(row["layer_output_rel"] / row["layer_output_bound"], row["layer_grad_rel"] / row["layer_grad_bound"])


class Float8Check:
    """The float8 rows of one kernels attempt: one bf16 reference run shared by every recipe."""

    def __init__(self, ctx, cfg, *, device, builder, mode_kw: dict):
        self.ctx, self.cfg, self.device, self.builder, self.mode_kw = ctx, cfg, device, builder, mode_kw
        self.args = gate_recipe.model_args(cfg)
        self.steps = gate_recipe.param(RUNG, "float8_steps")
        self.rows = gate_recipe.param(RUNG, "float8_layer_rows")
        self._curves: dict[str, list[float]] = {}

    @property
    def dtype_why(self) -> str:
        if gate_recipe.compute_dtype(self.cfg.training) == torch.bfloat16:
            return "the recipe computes in bf16: both sides run it as it is"
        return ("the recipe computes in fp32; float8's bound is against bf16, so both sides run it with "
                "training.dtype = bfloat16")  # fmt: skip

    def _meta(self) -> nn.Module:
        return self.builder() if self.builder is not None else build_meta(self.cfg.model.family, self.args)

    def losses(self, value: str) -> list[float]:
        """The loss per step of the gate's recipe in bf16 with kernels.float8 = `value` (each run once)."""
        if value not in self._curves:
            cfg = gate_recipe.job_config(self.ctx)
            cfg.training.steps = self.steps
            if gate_recipe.compute_dtype(cfg.training) != torch.bfloat16:
                cfg.training.dtype = "bfloat16"
            cfg.kernels.float8 = value
            cfg.metrics.output_dir = str(self.ctx.attempt_dir / "float8" / value)
            _, result = train_run.train(self.ctx, cfg, f"kernels: float8 check, kernels.float8={value} ({PRECISION})")
            self._curves[value] = [r["loss"] for r in result.metrics]
        return self._curves[value]

    def row(self, flag: str) -> dict[str, Any]:
        """The rung's row of one float8 flag: not_applicable with why, raised, or compared (layers,
        loss, `passed` within both bounds, then the execution-mode check; `eligible`: may be timed)."""
        _, recipe = parse_flag(flag)
        try:
            return self._row(flag, recipe)
        except (SwapNotApplicable, KernelUnavailable) as e:
            self.ctx.log(f"kernels: {flag} not applicable: {e}")
            return {"status": "not_applicable", "reason": " ".join(str(e).split())}
        except ShardedInitError as e:  # the model, not the kernel: titan_core builds it in its init's dtype only
            why = f"float8 is judged against the bf16 recipe, and titan_core does not build this model in bf16: {e}"
            self.ctx.log(f"kernels: {flag} not applicable: {why}")
            return {"status": "not_applicable", "reason": " ".join(why.split())}
        except Exception as e:  # noqa: BLE001 -- recorded as this kernel's failure, which fails the gate
            self.ctx.log(f"kernels: {flag} raised {type(e).__name__}: {e}")
            return {"status": "raised", "error": f"{type(e).__name__}: {e}", "kept": False}

    def _row(self, flag: str, recipe: str) -> dict[str, Any]:
        swap = float8_swap(recipe)
        converted, unconverted = swap_selection(self._meta(), swap)
        if not converted:
            raise SwapNotApplicable(swap_applicability(self._meta(), [swap])[swap] or f"{swap} converts no linear")
        model = build_model_with(self.cfg.model.family, self.args, kernels_for("float8", REFERENCE, self.cfg.kernels),
                                 self.device, torch.bfloat16, build_meta_model=self.builder)  # fmt: skip
        row: dict[str, Any] = {"status": "compared", "eligible": False, "reference": f"kernels.float8={REFERENCE}",
                               "precision": PRECISION, "dtype_why": self.dtype_why,
                               "converted": converted, "unconverted": unconverted}  # fmt: skip
        row.update(layer_check(model, converted, recipe, rows=self.rows))
        del model
        row["matmuls"] = (
            "torchao's emulation (float8 rounding, then an fp32 matmul): never faster than nn.Linear"
            if row["emulated"] else "torch._scaled_mm"
        )  # fmt: skip
        curve, reference = self.losses(recipe), self.losses(REFERENCE)
        loss_rel, step = curve_max_rel(curve, reference)
        row.update(loss_rel=loss_rel, loss_rel_step=step, loss_bound=FLOAT8_LOSS_REL, loss_curve=curve,
                   loss_curve_reference=reference, layer_over_bound=layer_over_bound(row))  # fmt: skip
        within = {
            "loss": loss_rel <= FLOAT8_LOSS_REL,
            "layer output": row["layer_output_rel"] <= row["layer_output_bound"],
            "layer gradients": row["layer_grad_rel"] <= row["layer_grad_bound"],
        }
        row["passed"] = all(within.values())
        said = (f"loss {loss_rel:.1e} (bound {FLOAT8_LOSS_REL:g}, worst at step {step}), layer output "
                f"{row['layer_output_rel']:.3f} (bound {row['layer_output_bound']:g}), gradients "
                f"{row['layer_grad_rel']:.3f} (bound {row['layer_grad_bound']:g}) over {len(converted)} converted "
                f"linears, {len(unconverted)} left as they are")  # fmt: skip
        self.ctx.log(f"kernels: {flag} vs the bf16 recipe: {said}; {row['matmuls']}"
                     + ("" if row["passed"] else " -- OUTSIDE ITS BOUND"))  # fmt: skip
        if not row["passed"]:
            out = ", ".join(k for k, ok in within.items() if not ok)
            row["failed_why"] = f"leaves float8's documented bound of the bf16 recipe ({out}: {said})"
            row["reason"] = f"it {row['failed_why']}"
            return row  # outside its bound: never timed
        row["matches"] = f"within float8's bound of the bf16 recipe ({said})"
        try:
            check = mode_check(flag=flag, **self.mode_kw)
        except Exception as e:  # noqa: BLE001 -- it cannot even be traced in the recipe's mode: no candidate, said why
            mode = self.mode_kw.get("mode")
            check = {"mode": mode, "ok": False, "reason": f"{flag} fails in {mode}: {type(e).__name__}: {e}"}
        row["mode_check"] = check
        if not check["ok"]:
            self.ctx.log(f"kernels: {check['reason']}")
            row["reason"] = f"it does not run in the recipe's execution mode: {check['reason']}"
            return row
        row["eligible"] = True
        return row


def totals(rows: dict[str, dict]) -> KernelsMeasurements:
    """The kernels record's float8 part: how many float8 recipes were checked, and of the one the recipe holds
    after the rung (`kept`, set by kernels_decide.mark_rows) its loss error and layer error over its
    bound (inf: it raised), which flag, and the loss bound (FLOAT8_LOSS_REL, the checklist's threshold).

    Only the held one is judged: float8 is a precision change the recipe opts into, so a float8 recipe
    outside its bound is not a wrong kernel but one the recipe does not take (not eligible, never
    timed, its row says why). A recipe that holds no float8 trains none, so has no float8 error: 0."""
    mine = {f: r for f, r in rows.items() if parse_flag(f)[0] == "float8" and r["status"] != "not_applicable"}
    held = {f: r for f, r in mine.items() if r.get("kept")}
    # a row that raised before its check has no number: the worst (its whole steps raising later keeps its own)
    loss = {f: r.get("loss_rel", math.inf) for f, r in held.items()}
    layer = {f: r.get("layer_over_bound", math.inf) for f, r in held.items()}
    worst_loss = max(loss, key=lambda f: _worst(loss[f]), default=None)
    worst_layer = max(layer, key=lambda f: _worst(layer[f]), default=None)
    return KernelsMeasurements(
        float8_checked=len(mine),
        float8_loss_rel_bound=FLOAT8_LOSS_REL,
        worst_float8_loss_rel=loss[worst_loss] if worst_loss else 0.0,
        worst_float8_loss_kernel=worst_loss,
        worst_float8_layer_over_bound=layer[worst_layer] if worst_layer else 0.0,
        worst_float8_layer_kernel=worst_layer,
    )


def _worst(x: float) -> float:
    return math.inf if math.isnan(x) else x  # NaN ranks as the worst


def per_flag(short: str, r: dict) -> dict[str, Any]:
    """A checked float8 row's own numbers under its short name (float8_tensorwise_loss_rel, ...)."""
    if "loss_rel" not in r:
        return {}
    out = {f"{short}_{k}": r[k] for k in ("loss_rel", "loss_bound", "layer_output_rel", "layer_output_bound",
                                            "layer_grad_rel", "layer_grad_bound") if k in r}  # fmt: skip
    out[f"{short}_layers_converted"] = len(r.get("converted", ()))
    out[f"{short}_layers_unconverted"] = len(r.get("unconverted", ()))
    return out
