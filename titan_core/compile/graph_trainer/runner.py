"""Run the captured step as the trainer's optimizer step: capture once, then one program per step.

`GraphTrainStep` owns the capture, the pass pipeline, the compile (none: the FX graph
itself; inductor: `compile_fx` over it) and the write-back, all as the `graph_trainer`
config section says. Optimizer state lives where
eager keeps it, in `optimizer.state[p]` (step, exp_avg, exp_avg_sq), so checkpoints and
a switch between eager and graph mode see one and the same state.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from titan_core.compile.graph_trainer import functional_optim as fo
from titan_core.compile.graph_trainer.capture import CapturedStep, capture_train_step, read_only_tensors, step_layout
from titan_core.compile.graph_trainer.params import local_tensor
from titan_core.compile.graph_trainer.passes import PassRecord, build_pipeline, run_passes
from titan_core.compile.graph_trainer.registry import PassSettings
from titan_core.compile.graph_trainer.scan import check_scannable
from titan_core.compile.graph_trainer.split import SplitProgram, split_forward_backward
from titan_core.config.sections import GraphTrainer
from titan_core.parallel.token_mean import global_valid_tokens

log = logging.getLogger("titan_core.graph_trainer")


@dataclass
class GraphStats:
    """What the step did so far: capture count, programs per step, times, pass records, host syncs."""

    captures: int = 0
    """How many times the step was traced (1 for a whole run: it is captured once)."""
    programs_per_step: list[int] = field(default_factory=list)
    """Compiled programs launched by each step (1 unsplit, 2 split)."""
    trace_time_s: float = 0.0
    passes_time_s: float = 0.0
    compile_time_s: float = 0.0
    """Backend compile time (inductor), paid on the first step."""
    pass_records: list[PassRecord] = field(default_factory=list)
    host_syncs: list = field(default_factory=list)


def _compile(gm, example_inputs, backend: str):
    """`example_inputs` are the capture's fake tensors: their fake mode carries the shape env
    inductor needs (with real inputs, a scanned graph fails in inductor with a
    data-dependent error)."""
    if backend == "none":
        return gm
    if backend == "inductor":
        from torch._inductor.compile_fx import compile_fx  # lazy: inductor (seconds to import) loads only when asked for

        return compile_fx(gm, example_inputs)
    raise ValueError(f"unknown graph_trainer.compile '{backend}' (none | inductor)")


class GraphTrainStep:
    """Replaces forward + backward + clip + optimizer.step() with one captured program."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        max_norm: float,
        grad_accum: int,
        config: GraphTrainer,
        on_host_sync: str = "raise",
        dp_world: int = 1,
    ):
        """`config` is the `graph_trainer` config section (its `enable` is not read here).

        on_host_sync: raise: the capture fails at a host sync; record: it goes on and
        lists them in `stats.host_syncs`.
        dp_world: data-parallel ranks; above 1 every step must be given the step's global
        valid-token count (`n_tokens`, titan_core/parallel/token_mean.py).
        """
        self.model, self.optimizer, self.config = model, optimizer, config
        self.on_host_sync = on_host_sync
        self.max_norm, self.grad_accum, self.dp_world = max_norm, grad_accum, dp_world
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.layout = None
        self.captured: CapturedStep | None = None
        self.program = None
        self.split: SplitProgram | None = None
        self.stats = GraphStats()
        # the pipeline is validated now so a bad pass name fails before any work
        self.pipeline = build_pipeline(disable=config.disable_passes, numerics_changing=config.numerics_changing)
        if config.scan_layers:  # refused here, before a run writes anything, not at the first step
            check_scannable(model)

    # ---- state ---------------------------------------------------------------------
    def _state(self):
        """optimizer.state entries, created as torch's AdamW creates them on its first step."""
        states = []
        for p in self.params:
            st = self.optimizer.state[p]
            if not st:
                st["step"] = torch.tensor(0.0, dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            states.append(st)
        return states

    def _scalars(self, step: int, device) -> list[torch.Tensor]:
        out = []
        for g, h in zip(self.optimizer.param_groups, self.layout.hypers):
            for value in fo.adamw_step_scalars(float(g["lr"]), step, h):
                out.append(torch.tensor(value, dtype=torch.float32, device=device))
        return out

    def inputs(self, batches, n_tokens: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The flat graph inputs for this step (parameters are read live, never copied in).

        n_tokens: valid labels of the whole step, summed over the data-parallel ranks
        (titan_core.parallel.token_mean.global_valid_tokens); None counts these batches' labels,
        which is the global count only when there is one data-parallel rank.
        """
        states = self._state()
        device = local_tensor(self.params[0]).device
        step = int(states[0]["step"]) + 1  # a CPU tensor: reading it does not wait for the device
        flat = [local_tensor(p.detach()) for p in self.params]
        flat += [local_tensor(t.detach()) for _, t in read_only_tensors(self.model)]
        flat += [local_tensor(s["exp_avg"]) for s in states] + [local_tensor(s["exp_avg_sq"]) for s in states]
        flat += self._scalars(step, device)
        for b in batches:
            present = b.present()
            if tuple(present) != self.layout.batch_fields:
                raise ValueError(f"batch fields {tuple(present)} differ from the captured {self.layout.batch_fields}")
            flat += [t.to(device, non_blocking=True) for t in present.values()]
        if n_tokens is None:
            if self.dp_world > 1:
                raise ValueError(
                    f"{self.dp_world} data-parallel ranks: pass the step's global valid-token count (n_tokens)"
                )
            n_tokens = global_valid_tokens([b.labels.to(device, non_blocking=True) for b in batches])
        flat.append(n_tokens.to(device, non_blocking=True))
        return flat

    # ---- capture -------------------------------------------------------------------
    def capture(self, batches, n_tokens: torch.Tensor | None = None) -> CapturedStep:
        self.layout = layout = step_layout(
            self.model, self.optimizer, batches[0], self.grad_accum, self.max_norm, dp_world=self.dp_world
        )
        example = self.inputs(batches, n_tokens)
        cap = capture_train_step(
            self.model, layout, example, scan_layers=self.config.scan_layers, on_host_sync=self.on_host_sync
        )
        settings = PassSettings(memory_policy=self.config.memory_policy, debug=self.config.debug_passes)
        t0 = time.perf_counter()
        cap.gm, records = run_passes(cap.gm, cap.example_inputs, self.pipeline, settings=settings)
        self.stats.passes_time_s = time.perf_counter() - t0
        self.stats.pass_records, self.stats.trace_time_s = records, cap.trace_time_s
        self.stats.host_syncs = cap.host_syncs
        self.stats.captures += 1
        self.captured = cap
        t0 = time.perf_counter()
        if self.config.split:
            self.split = split_forward_backward(cap.gm)
            self.split.compile(lambda gm, ex: _compile(gm, ex, self.config.compile))
        else:
            self.program = _compile(cap.gm, cap.example_inputs, self.config.compile)
        self.stats.compile_time_s = time.perf_counter() - t0
        return cap

    # ---- step ----------------------------------------------------------------------
    @torch.no_grad()
    def run(self, batches, n_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over the micro-batches; returns (summed loss, grad norm) on the device.

        n_tokens: as in `inputs` (the Trainer passes the all-reduced count).
        """
        if len(batches) != self.grad_accum:
            raise ValueError(f"expected {self.grad_accum} micro-batches, got {len(batches)}")
        if self.captured is None:
            self.capture(batches, n_tokens)
        flat = self.inputs(batches, n_tokens)
        if self.split is not None:
            out, programs = self.split(flat), 2
        else:
            out, programs = self.program(*flat), 1
        self.stats.programs_per_step.append(programs)
        loss, norm, new_p, new_m, new_v = self.layout.split_outputs(out)
        states = self._state()
        # write back in place: the module's parameters and the optimizer's state stay the same objects
        torch._foreach_copy_([local_tensor(p.detach()) for p in self.params], new_p)
        torch._foreach_copy_([local_tensor(st["exp_avg"]) for st in states], new_m)
        torch._foreach_copy_([local_tensor(st["exp_avg_sq"]) for st in states], new_v)
        for st in states:
            st["step"] += 1
        # the graph is the optimizer step; tell the LR scheduler one happened
        self.optimizer._opt_called = True
        return loss, norm
