"""What the execution-mode rungs (`compile`, `graph_trainer`) share: the recipe run in this
process under another execution mode, the MoE experts a captured step can use, and the
eager evidence every number is put beside.

Not a rung (no RUNG): the engine only imports modules named after DESIGN section 1's rungs.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from pathlib import Path

from onboard.errors import BadInput
from onboard.rungs.base import RungContext
from onboard.rungs.simple_fsdp import median_step_time, rel, resolved_device_type  # noqa: F401  (for the mode rungs)

DENSE_WHY = (
    "the recipe's MoE experts are the reference loop (kernels.moe = \"loop\"), which gathers each expert's tokens "
    "with torch.where: a host sync, a graph break under torch.compile and a data-dependent shape in a captured "
    "step; the capture-friendly experts (kernels.moe = \"dense\": dropless, static shapes, all experts on all "
    "tokens with a masked combine, n_experts / top_k x the expert FLOPs) compute the same sums"
)


@contextlib.contextmanager
def process_threads(n: int = 0):
    """Run with `n` intra-op threads (0: leave them), then give the process its own count back.

    torch's thread count is process-wide and a Trainer sets it from [device] threads, so
    without this one in-process run would hand its count to the next.
    """
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compute_dtype(training):
    """The dtype the recipe computes in: it decides which kernels can run (e.g. grouped_mm)."""
    import torch

    bf16 = "bfloat16" in (training.dtype, training.mixed_precision_param)
    return torch.bfloat16 if bf16 else torch.float32


def model_args(ctx: RungContext, cfg):
    """The recipe's resolved architecture; a recipe that does not resolve is bad input."""
    from titan_core.config import ConfigError
    from titan_core.model_builder import resolve_model_args

    try:
        return resolve_model_args(cfg.model)
    except ConfigError as e:
        raise BadInput(f"{ctx.workspace.recipe_path}: {e}") from None


def capture_moe(cfg, args) -> tuple[str | None, str]:
    """(kernels.moe choice to run a captured step with, or None to keep the recipe's; why).

    The reference loop is replaced, and so is a kernel that titan_core says cannot be
    traced here (torch._grouped_mm's meta function takes bf16 only); a capture problem
    with a kernel that claims it can is the finding the gate should report.
    """
    from titan_core.kernels import applicable_kernels

    if not args.n_experts:
        return None, "dense model: no MoE experts"
    moe = cfg.kernels.moe
    if moe == "loop":
        return "dense", DENSE_WHY
    if moe != "dense":
        device = resolved_device_type(cfg.device.type)
        why = applicable_kernels(args, device=device, dtype=compute_dtype(cfg.training), captured=True).get(f"kernels.moe={moe}")
        if why:
            return "dense", f"the recipe's kernels.moe = \"{moe}\" cannot be captured here ({why}); dense instead"
    return None, f"the recipe's kernels.moe = \"{moe}\" is kept"


def mode_config(base, out_dir: Path, *, steps: int, deterministic: bool = False, moe: str | None = None, **sections):
    """The eager gate's recipe for another execution mode: `sections` maps 'compile' /
    'graph_trainer' to the fields to set there; the other mode is switched off."""
    cfg = copy.deepcopy(base)
    cfg.compile.enable = False
    cfg.graph_trainer.enable = False
    for section, fields in sections.items():
        for name, value in fields.items():
            setattr(getattr(cfg, section), name, value)
    if moe is not None:
        cfg.kernels.moe = moe
    cfg.training.steps = steps
    cfg.training.deterministic = deterministic
    cfg.metrics.output_dir = str(out_dir)
    return cfg


@contextlib.contextmanager
def quiet_mesh_pickling():
    """Silence torch's DeviceMesh pickling warning for the duration of a compile.

    Dynamo's cache keys pickle the SimpleFSDP mesh; torch then warns, once per block and
    step, that a mesh pickled before its process groups existed cannot find them. Here
    the groups exist before anything is compiled (titan_core creates them, also at world
    size 1), so the warning is noise that would bury the rung's progress lines.
    """
    logger = logging.getLogger("torch.distributed.device_mesh")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def build_trainer(ctx: RungContext, cfg):
    """A titan_core Trainer on the repeated batch (the eager gate's data); a config error is bad input."""
    from titan_core.config import ConfigError
    from titan_core.trainer import Trainer

    try:
        return Trainer(cfg, quiet=True, repeat_batch=True)
    except ConfigError as e:
        raise BadInput(f"{ctx.workspace.recipe_path}: {e}") from None


def train(ctx: RungContext, cfg, label: str):
    """(trainer, result) of one in-process run of `cfg`; the rows land in cfg.metrics.output_dir."""
    ctx.log(f"{label}: {cfg.training.steps} steps -> {cfg.metrics.output_dir}")
    with process_threads():
        trainer = build_trainer(ctx, cfg)
        with quiet_mesh_pickling():
            result = trainer.train()
    if not result.metrics:
        raise RuntimeError(f"{label}: training ran no step")
    return trainer, result


def beside_eager(m: dict, evidence: dict, *, step_time_s: float, peak_mem_bytes: int) -> None:
    """Add the eager rung's step time and peak memory, and the ratios, to the measurements."""
    ev = evidence.get("eager") or {}
    m["eager_step_time_median_s"] = ev.get("step_time_median_s")
    m["eager_peak_mem_bytes"] = ev.get("peak_mem_bytes")
    if ev.get("step_time_median_s"):
        m["speedup_vs_eager"] = ev["step_time_median_s"] / step_time_s
    if ev.get("peak_mem_bytes"):
        m["peak_mem_vs_eager"] = peak_mem_bytes / ev["peak_mem_bytes"]


def eager_step1_loss(ctx: RungContext) -> float:
    """The eager rung's exact step-1 loss (the ladder runs this rung only after eager passed)."""
    ev = ctx.evidence.get("eager")
    if not ev or "step1_loss_repr" not in ev:
        raise RuntimeError("no passed eager evidence to compare with: run the eager rung first")
    return float(ev["step1_loss_repr"])
