"""The compile rung's declared measurements (its checklist judges only these)."""

from __future__ import annotations

from dataclasses import dataclass

from onboard.ladder.contract import ABSENT
from onboard.ladder.measurements.training_measurements import ModeRun


@dataclass(kw_only=True)
class CompileMeasurements(ModeRun):
    """The compile rung's measurements: graph breaks per compiled module, and the compiled run's numbers."""

    graph_breaks: int = ABSENT
    """Graph breaks dynamo reports over every compiled module, blocks and loss head (count)."""
    graph_breaks_in_blocks: int = ABSENT
    """Those in the decoder blocks (count)."""
    graph_breaks_in_loss_head: int = ABSENT
    """Those in the loss head (count)."""
    modules_compiled: int = ABSENT
    """Modules compiled as one graph each: every block and the loss head (count)."""
    modules_with_breaks: list[str] = ABSENT
    """The module paths that broke (e.g. ["layers.0", "layers.1"])."""
    first_break: str | None = ABSENT
    """The first module that broke and dynamo's first reason ("<module>: <reason>"); None: none did."""
    steps_run: int = ABSENT
    """Optimizer steps the compiled run logged."""
    step1_loss_repr: str = ABSENT
    """The compiled step-1 loss, as its repr (nats per token)."""
    baseline_step1_loss_repr: str = ABSENT
    """The eager rung's step-1 loss it is compared with, as its repr."""
    step1_loss_rel_err: float = ABSENT
    """|compiled - eager| / |eager| step-1 loss (fraction): rounding only, or a compile that changes the model."""
    last_loss_rel_vs_eager: float | None = ABSENT
    """The same at the last step (rounding compounds over the steps: shown, not judged); None when
    eager ran another number of steps."""
    backend: str = ABSENT
    """The recipe's compile.backend (inductor, aot_eager, ...)."""
    fullgraph: bool = ABSENT
    """The recipe's compile.fullgraph."""
