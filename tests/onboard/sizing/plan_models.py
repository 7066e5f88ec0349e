"""titan_core's acceptance for a plan of a family's flavor without a workspace (what `onboard plan`
builds from a workspace's recipe): the recipe is the flavor with the plan's kernels and execution mode."""

from __future__ import annotations

from onboard.sizing.plan.accept import Acceptance
from titan_core.memory.estimate import ModelShape
from titan_core.config import from_dict
from titan_core.memory.estimate import TrainSetup
from titan_core.models.model_builder import build_meta_model, resolve_model_args


def accepting(family: str, flavor: str, target, kernels: TrainSetup, *, compiled: bool = True,
              recipe: dict | None = None) -> Acceptance:  # fmt: skip
    """plan_training's `accept` for `family`/`flavor` on `target`: a recipe of that model with `kernels`'
    loss / attention / moe / ce_chunk, per-block compile as `compiled` (plan_training's default: on) and the
    sections of `recipe` on top."""
    cfg = from_dict({
        "model": {"family": family, "flavor": flavor},
        "kernels": {"loss": kernels.loss, "attention": kernels.attention, "moe": kernels.moe,
                    "ce_chunk": kernels.ce_chunk},
        "compile": {"enable": compiled},
        **(recipe or {}),
    })  # fmt: skip
    args = resolve_model_args(cfg.model)
    model = build_meta_model(cfg.model, args)
    return Acceptance(cfg, args, model, ModelShape.from_model(model, args), target, kernels, [])
