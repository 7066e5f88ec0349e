"""The recipe of a run in another execution mode (compile, graph_trainer): the gate's recipe switched
to that mode (titan_core's set_execution_mode) with any of the mode's other fields a run asks for, and
the MoE experts a captured step can run (the reference loop syncs the host, so a capture runs the
dense experts instead, for the reason DENSE_WHY gives)."""

from __future__ import annotations

import copy
from pathlib import Path

from onboard.rungs.gate_recipe import compute_dtype, resolved_device_type
from titan_core.config.loader import set_key
from titan_core.config.execution_modes import set_execution_mode
from onboard.rungs.kernels_rung.compare import applicable_kernels
from titan_core.models.common.swaps import swap_applicability
from titan_core.models.model_builder import build_meta_model

DENSE_WHY = (
    "the recipe's MoE experts are the reference loop (kernels.moe = \"loop\"), which gathers each expert's tokens "
    "with torch.where: a host sync, a graph break under torch.compile and a data-dependent shape in a captured "
    'step; the capture-friendly experts (kernels.moe = "dense": dropless, static shapes, all experts on all '
    "tokens with a masked combine, n_experts / top_k x the expert FLOPs) compute the same sums"
)


def capture_moe(cfg, args) -> tuple[str | None, str]:
    """(kernels.moe choice to run a captured step with, or None to keep the recipe's; why).

    The reference loop is replaced, and so is a kernel that titan_core says cannot be
    traced here (torch._grouped_mm's meta function takes bf16 only); a capture problem
    with a kernel that claims it can is the finding the gate should report.
    """
    if not args.n_experts:
        return None, "dense model: no MoE experts"
    moe = cfg.kernels.moe
    if moe == "loop":
        own = swap_applicability(build_meta_model(cfg.model, args), ["moe.dense"])["moe.dense"]
        if own and not own.startswith("no module"):  # experts of the model's own class: no kernel swaps them
            return None, f"the model's own experts are captured as they are: {own}"
        return "dense", DENSE_WHY
    if moe != "dense":
        device = resolved_device_type(cfg.device.type)
        why = applicable_kernels(args, device=device, dtype=compute_dtype(cfg.training), captured=True).get(
            f"kernels.moe={moe}"
        )
        if why:
            return "dense", f'the recipe\'s kernels.moe = "{moe}" cannot be captured here ({why}); dense instead'
    return None, f'the recipe\'s kernels.moe = "{moe}" is kept'


def mode_config(base, out_dir: Path, *, mode: str = "eager", steps: int, deterministic: bool = False,
                moe: str | None = None, **sections):  # fmt: skip
    """The gate's recipe run in execution `mode` (every other mode off); `sections` maps a section
    ('compile', 'graph_trainer') to other fields to set there."""
    cfg = copy.deepcopy(base)
    set_execution_mode(cfg, mode)
    for section, fields in sections.items():
        for name, value in fields.items():
            set_key(cfg, f"{section}.{name}", value)
    if moe is not None:
        cfg.kernels.moe = moe
    cfg.training.steps = steps
    cfg.training.deterministic = deterministic
    cfg.metrics.output_dir = str(out_dir)
    return cfg
