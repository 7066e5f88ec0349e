"""The training loop: build everything from a JobConfig, then step.

Build order matters: the model is created on the meta device, swaps replace modules
while they cost nothing, then (several processes) it is parallelised on meta and only each
rank's shards are made real and initialised, one full parameter at a time, to the values the
one process's init gives (titan_core/parallel/sharded_init.py: no rank ever holds the whole
model); one process materialises and initialises the model as it is. The optimizer is
created last, over the parameters that will actually train (sharded DTensors under
SimpleFSDP / FSDP2).

The loop does not wait for the device at every step: it queues each step's work and reads
the values (loss, grad norm, and the step's time from `measure/step_clock.py`) only after a
step the log prints, the last one, a checkpoint's and the profiler's window (`_reads_after`),
so on an accelerator the next steps are queued while the current one runs. Every step still
gets its full row, filled in at that read; a non-finite loss or grad norm stops the run there, naming
its own step. `train_step()` is one step waited for, for callers that time single steps.
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from titan_core.runtime import cpu_bf16, devices, distributed
from titan_core.training.checkpoint import Checkpointer
from titan_core.training.hf_export import check_export_target, export_hf, tokenizer_files
from titan_core.training.hf_load import initial_weights, weights_line
from titan_core.training.lora_export import export_lora
from titan_core.compile import execution
from titan_core.config.dtypes import DTYPES, compute_dtype
from titan_core.config.execution_modes import execution_mode
from titan_core.config.sections import JobConfig
from titan_core.models.common.swaps import apply_swaps
from titan_core.data import build_data_loader, report_data
from titan_core.lora.export import check_adapter_target
from titan_core.lora.inject import LoraState, apply_lora, check_lora, planned_lora_params
from titan_core.lora.shard import shard_adapters
from titan_core.lora.tensor_parallel import adapter_split
from titan_core.kernels import swaps_for
from titan_core.memory.preflight import check_memory
from titan_core.memory.tensor_peak import TensorPeak, held_tensor_bytes
from titan_core.runtime import cpu_load
from titan_core.measure.metrics import MetricsLogger
from titan_core.models.model_builder import build_model_from_config, model_adapter
from titan_core.models.common.stats import model_flops_per_token
from titan_core.training.optim import build_lr_scheduler, build_optimizer
from titan_core.parallel import build_mesh, check_parallelism, clip_grad_norm_, dp_coordinates, parallelize
from titan_core.parallel.activation_checkpoint import apply_activation_checkpoint, check_activation_checkpoint
from titan_core.parallel.context_parallel import loss_group, loss_world, sequence_split
from titan_core.parallel.expert_parallel import dropped_rows, expert_dispatch
from titan_core.parallel.mesh import build_expert_mesh, dp_group
from titan_core.parallel.regather import regathering
from titan_core.models.common.init_stand_in import InitRecord
from titan_core.parallel.sharded_init import init_dtypes_of, materialise_sharded
from titan_core.measure.profiler import StepProfiler
from titan_core.measure.run_stats import RunStats
from titan_core.measure.step_clock import Lap, start_lap
from titan_core.training.pipeline_step import PipelineStep
from titan_core.parallel.token_mean import global_valid_tokens, micro_batch_term
from titan_core.training.validate import Validator


@dataclass
class TrainResult:
    metrics: list[dict]
    """One dict per optimizer step (see MetricsLogger)."""
    num_params: int
    flops_per_token: float
    device: str
    swaps: dict[str, str] = field(default_factory=dict)
    resumed_from: int | None = None
    weights_from: str = ""
    """Where the weights came from, as the log said: "resumed from step K", "loaded initial weights from
    DIR (...)" (checkpoint.initial_hf), or "" (initialised from the seed)."""
    output_dir: str = ""
    summary: object = None
    """A rich Table of every step (None when logging was off)."""
    world_size: int = 1
    """Processes that trained together."""
    data_parallel: str = "none"
    """parallelism.data_parallel of the run."""
    model_notes: list[str] = field(default_factory=list)
    """What of the model runs otherwise than through titan_core's kernels, a line each (the model's
    `notes`: e.g. the transformers path's layers that have no attention module)."""
    stopped: str | None = None
    """Why the run stopped before `training.steps`: a non-finite loss or grad norm, named with its step,
    the quantity and the last finite grad norm (`diverged_message`). None: it ran every step."""
    data: dict = field(default_factory=dict)
    """This rank's data report of a streamed source (titan_core/data/dataset.py `report`: rows read,
    documents, bad rows by reason); {} for the other sources."""

    @property
    def stats(self) -> RunStats:
        """Steady-window speed and memory of the run (raises on a run that logged no step)."""
        return RunStats.from_rows(self.metrics)

    @property
    def step_time_median_s(self) -> float:
        return self.stats.step_time_median_s


@dataclass
class _Queued:
    """A step whose work the device may still be running: what its row needs, values on the device."""

    step: int
    lr: float
    """The learning rate the step used (a host value)."""
    values: torch.Tensor
    """[loss, grad norm] on the device, fp32."""
    lap: Lap
    peak_mem_bytes: int
    """The allocator's (or the process's) peak when the step was queued: a host-side statistic."""
    extra: dict = field(default_factory=dict)
    """Further columns of the row, host values (ep > 1: moe_dropped_tokens)."""


def set_determinism(seed: int, deterministic: bool) -> None:
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


class Trainer:
    def __init__(self, cfg: JobConfig, *, quiet: bool = False):
        self.cfg = cfg
        self.rank, self.world_size, local_rank = distributed.current_ranks()
        self.degrees = check_parallelism(cfg, self.world_size)
        self.threads = cfg.device.threads
        """The intra-op threads this run took (device.threads, or the free cores with adapt_threads; 0: torch's)."""
        if cfg.device.threads:
            self.threads = self._threads(cfg.device, quiet)
            torch.set_num_threads(self.threads)
        self.device = devices.resolve_device(
            cfg.device.type, local_rank=local_rank, libtpu_init_flags=cfg.tpu.libtpu_init_flags
        )
        if self.device.type == "cpu" and compute_dtype(cfg.training) == torch.bfloat16:
            cpu_bf16.enable()  # before anything is built: this process's bf16 products, fp32 ones rounded once
        self.dist: distributed.DistState | None = None
        self.mesh = None
        if cfg.parallelism.data_parallel != "none":
            self.dist = distributed.init_distributed(self.device, cfg.parallelism.timeout_s)
        try:
            self._build(cfg, quiet=quiet)
        except BaseException:
            self.close()
            raise

    def _build(self, cfg: JobConfig, *, quiet: bool) -> None:
        set_determinism(cfg.training.seed, cfg.training.deterministic)
        self.out_dir = Path(cfg.metrics.output_dir)

        check_activation_checkpoint(cfg)  # before anything is built
        check_lora(cfg, self.world_size)
        self.family, self.args, model = build_model_from_config(cfg.model)
        # checkpoint.initial_hf's header check runs on meta: a checkpoint that does not fit stops the run here
        initial = initial_weights(cfg, model)
        if cfg.checkpoint.export_hf:  # a folder the export may not replace is refused before training, not after
            check = check_adapter_target if cfg.lora.enable and not cfg.lora.merged_export else check_export_target
            check(self._under_output(cfg.checkpoint.export_hf))
        built_params = sum(p.numel() for p in model.parameters())  # the recipe's model (a port's own layers too)
        self.model_notes = list(model.notes)
        self.swaps = apply_swaps(model, swaps_for(cfg.kernels))
        # refuse a run that cannot fit while the model still costs nothing (MemoryBudgetError: exit 2)
        planned = planned_lora_params(model, cfg.lora, model_adapter(cfg.model)) if cfg.lora.enable else -1
        self.memory_estimate = check_memory(cfg, model, self.args, self.device, self.degrees, lora_params=planned)
        self.pipeline: PipelineStep | None = None
        """pp > 1: this rank's pipeline stages and their schedule (titan_core/training/pipeline_step.py)."""
        self.sharded_init: InitRecord | None = None
        """How this rank's shards were initialised (the most full bytes held at once); None: one process."""
        dtype = DTYPES[cfg.training.dtype]
        if self.degrees.pp > 1:  # this rank materialises, initialises and shards its own stages only
            self.mesh = build_mesh(self.degrees, self.device.type)
            self.pipeline = PipelineStep(model, cfg, self.mesh, self.device,
                                         build_expert_mesh(self.degrees, self.device.type))  # fmt: skip
            self.sharded_init = self.pipeline.sharded_init
        elif self.dist is None:  # one process, no mesh: the whole model is this rank's
            model.to_empty(device=self.device)
            model.init_weights(seed=cfg.training.seed)
            model = model.to(dtype)
        else:  # sharded from the first byte: parallelised on meta, then only this rank's shards made real
            init_dtypes = init_dtypes_of(model)
            model = model.to(dtype)
            self.mesh = build_mesh(self.degrees, self.device.type)
            parallelize(model, cfg, self.mesh, build_expert_mesh(self.degrees, self.device.type))
            # a checkpoint to load next fills every parameter: only the buffers need the init then
            self.sharded_init = materialise_sharded(
                model, self.device, cfg.training.seed, init_dtypes=init_dtypes, cast_to=dtype, draw=initial is None
            )
        dp_rank, self.dp_world = 0, 1
        self.dp_group = None
        """The data-parallel peers the step's valid-token count is summed over (None: this rank alone)."""
        self.split = None
        """cp > 1: this rank's share of every row (titan_core/parallel/context_parallel.py); None otherwise."""
        self.loss_world = 1
        """Ranks holding distinct tokens of the global batch (dp x cp): the token mean's scale."""
        if self.dist is not None:
            dp_rank, self.dp_world = dp_coordinates(self.mesh)
            self.dp_group = dp_group(self.mesh)
            self.split = sequence_split(self.mesh)
            if self.split is not None:  # cp peers hold the other tokens of the same rows: they count too
                self.dp_group = loss_group(self.mesh)
        self.loss_world = loss_world(self.mesh) if self.split is not None else self.dp_world
        self.model = model
        self.ep_dispatch = expert_dispatch(model)
        """ep > 1: the experts' token dispatch, whose dropped rows each step's row counts (None otherwise)."""
        # each rank reads its own shards (of its own stages under pp)
        loaded = initial.load(model, stages=self.pipeline is not None) if initial is not None else None
        # [lora]: adapters on the loaded base (its load went by the native names, before peft renames them)
        self.lora: LoraState | None = None
        if cfg.lora.enable:
            split = adapter_split(cfg, self.mesh)  # tp > 1: each adapter split as its layer (lora/tensor_parallel.py)
            # peft's adapters are not sharded over dp yet: on several ranks they are sharded as the base is
            shard = (lambda m: shard_adapters(m, cfg, self.mesh)) if self.dist is not None else None
            self.lora = apply_lora(model, cfg.lora, model_adapter(cfg.model), seed=cfg.training.seed, split=split,
                                   shard=shard)  # fmt: skip
        self.checkpointed = apply_activation_checkpoint(model, cfg)
        """Module paths of the blocks whose activations are recomputed in the backward ([activation_checkpoint])."""
        # execution modes (titan_core/compile): per-block compile now, the Graph Trainer over the optimizer
        mode = execution_mode(cfg)
        self.compiled_modules = execution.apply_per_block_compile(model, cfg) if mode == "compile" else []

        self.optimizer = build_optimizer(self.model, cfg.optimizer)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, cfg.lr_scheduler, cfg.training.steps)
        self.graph_step = (
            execution.graph_train_step(self.model, self.optimizer, cfg, dp_world=self.loss_world)
            if mode == "graph_trainer"
            else None
        )
        self.data = build_data_loader(
            cfg, vocab_size=self.args.vocab_size, dp_rank=dp_rank, dp_world=self.dp_world,
            own_samples=self.args.own_samples,
        )
        # the held-out loss of [validation]; a held-out set with no batch is refused here, before step 1
        self.validator = Validator(cfg, vocab_size=self.args.vocab_size, dp_rank=dp_rank, dp_world=self.dp_world,
                                   dp_group=self.dp_group, device=self.device, own_samples=self.args.own_samples,
                                   split=self.split,
                                   held_out_sums=self.pipeline.held_out_sums if self.pipeline else None,
                                   micro_batches=cfg.training.grad_accum)  # fmt: skip
        self.checkpointer = Checkpointer.from_config(cfg)
        self.profiler = StepProfiler(cfg.profiler, self._under_output(cfg.profiler.folder), self.rank)
        self.logger = MetricsLogger(
            self.out_dir, log_freq=cfg.metrics.log_freq, use_rich=cfg.metrics.rich, enabled=self.rank == 0,
            console=not quiet, tensorboard=cfg.metrics.tensorboard,
        )
        self.num_params = built_params
        # the decoder formula of its args, unless the model counts its own (flux: per image token)
        self.flops_per_token = model_flops_per_token(model, cfg.training.seq_len, lora_params=planned)
        self.peak_flops = devices.peak_flops(self.device, DTYPES[cfg.training.mixed_precision_param])
        self.step = 0
        self.resumed_from: int | None = None
        if cfg.checkpoint.enable and cfg.checkpoint.resume:
            self.resumed_from = self.checkpointer.load_latest(
                model=self.model, optimizer=self.optimizer, lr_scheduler=self.lr_scheduler, data_loader=self.data
            )
            self.step = self.resumed_from or 0
        self.weights_from = weights_line(cfg, loaded, self.resumed_from)
        if self.weights_from and self.rank == 0 and not quiet:
            print(self.weights_from, file=sys.stderr)
        if self.lora is not None and self.rank == 0 and not quiet:
            print(self.lora.line(model), file=sys.stderr)

    def _export(self, out: Path) -> None:
        """checkpoint.export_hf: the HF export; under [lora] the PEFT adapter, or the merged model."""
        cfg = self.cfg
        if self.lora is not None:
            export_lora(self.model, self.lora, cfg, self.family, self.args, out, merged=cfg.lora.merged_export,
                        tokenizer=tokenizer_files(cfg.data))  # fmt: skip
            return
        export_hf(self.model, self.family, self.args, out, model_cfg=cfg.model,
                  shard_mb=cfg.checkpoint.export_shard_mb, tokenizer=tokenizer_files(cfg.data))  # fmt: skip

    def _threads(self, device_cfg, quiet: bool) -> int:
        """device.threads, or with adapt_threads the cores other processes leave free now (said)."""
        wanted = device_cfg.threads
        if wanted <= 1 or (quiet and not device_cfg.adapt_threads):
            return wanted
        free = cpu_load.free_cores()
        n = cpu_load.threads_for(wanted, free)
        if not device_cfg.adapt_threads:  # the recipe assumes idle cores: say so when they are not
            if n < wanted and self.rank == 0:
                print(f"warning: device.threads = {wanted} assumes {wanted} idle cores, but other processes leave "
                      f"{free:.1f} free now: each step may take several times longer (device.adapt_threads = true "
                      "takes the free ones)", file=sys.stderr)  # fmt: skip
            return wanted
        if n < wanted and self.rank == 0 and not quiet:
            print(f"device: {n} intra-op thread{'s' * (n > 1)}, not {wanted}: other processes leave "
                  f"{free:.1f} of this process's cores free now (device.adapt_threads)", file=sys.stderr)
        return n

    def close(self, *, together: bool = False) -> None:
        """Release the process group if this trainer created it (idempotent); `together`: every
        rank finished normally, so they leave the group at the same time."""
        distributed.teardown(self.dist, together=together)

    def _under_output(self, folder: str) -> Path:
        p = Path(folder)
        return p if p.is_absolute() else self.out_dir / p

    def _eager_update(self, cfg, batches, n_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, backward, clip and optimizer step over the step's micro-batches (on the device);
        returns (this rank's share of the global token-mean loss, grad norm) on the device."""
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for b in batches:
            with regathering(self.cfg):  # reshard_after_forward: gathered weights gathered again in the backward
                loss, ce = self.model.loss(b.tokens, b.labels, **b.loss_kwargs())
            term = micro_batch_term(loss, ce, b.labels, n_tokens, dp_world=self.loss_world, grad_accum=cfg.grad_accum)
            term.backward()
            total += term.detach().float()
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = clip_grad_norm_(params, cfg.max_norm, foreach=True)
        self.optimizer.step()
        return total, grad_norm

    def train_step(self) -> dict:
        """One optimizer step over `grad_accum` micro-batches, waited for; returns its metrics row.

        For callers that time or inspect single steps: it reads the step's values, so the host
        waits for the device here. `train` reads only at the steps `_reads_after` names."""
        return self._rows([self._launch()])[0]

    def _launch(self) -> _Queued:
        """Queue one optimizer step's work on the device; nothing here waits for it."""
        cfg = self.cfg.training
        lap = start_lap(self.device)
        lr = self.optimizer.param_groups[0]["lr"]
        batches = [next(self.data).to(self.device, non_blocking=True) for _ in range(cfg.grad_accum)]
        if self.ep_dispatch is not None:  # rows a validation pass dropped are not this step's
            self.ep_dispatch.take_dropped()
        if self.split is not None:  # context parallel: this rank's tokens of each row, at their true positions
            batches = [self.split(b) for b in batches]
        # the loss is the mean over the valid tokens of the whole global batch (titan_core/parallel/token_mean.py)
        n_tokens = global_valid_tokens([b.labels for b in batches], self.dp_group)
        counting = self.cfg.metrics.tensor_peak and not (self.graph_step is not None and self.step == 1)
        held = held_tensor_bytes(self.model, self.optimizer) if counting else 0
        with TensorPeak() if counting else nullcontext() as peak:
            if self.graph_step is not None:  # Graph Trainer: _eager_update's work as one captured program
                total, grad_norm = self.graph_step.run(batches, n_tokens)
            elif self.pipeline is not None:  # pp > 1: the schedule runs the micro-batches through the stages
                total, grad_norm = self.pipeline.update(self.model, self.optimizer, batches, n_tokens)
            else:
                total, grad_norm = self._eager_update(cfg, batches, n_tokens)
        self.lr_scheduler.step()
        if self.world_size > 1:
            # each rank's total is dp_world times its share of the global token mean (plus the
            # aux term); TP ranks of one dp rank hold the same value, so the mean over the
            # world is the global token mean; with pp > 1 only the last stage's ranks hold it (0 elsewhere)
            dist.all_reduce(total)
            total /= self.world_size // self.degrees.pp
        # a new tensor of the two scalars: a captured program may reuse its output buffers next step
        norm = grad_norm.detach().float().reshape(()).to(total.device)  # no grads: a CPU zero
        values = torch.stack([total.detach().float().reshape(()), norm])
        lap.stop()
        # (token, expert) rows the capacity dropped this step, every rank and MoE layer: a host value
        # (the dispatch reads its split sizes on the host anyway)
        extra = {} if self.ep_dispatch is None else {"moe_dropped_tokens": dropped_rows(self.ep_dispatch, self.device)}
        if counting:
            extra["tensor_peak_bytes"] = held + peak.peak_bytes
        return _Queued(self.step, lr, values, lap, devices.peak_memory_bytes(self.device), extra)

    def _rows(self, queued: list[_Queued]) -> list[dict]:
        """The metrics rows of queued steps: the one read of the device (it waits for their work)."""
        values = torch.stack([q.values for q in queued]).tolist()
        cfg = self.cfg.training
        tokens = cfg.batch_size * cfg.seq_len * cfg.grad_accum * self.dp_world
        rows = []
        for q, (loss, norm) in zip(queued, values):
            dt = q.lap.seconds()
            rows.append(
                {
                    "step": q.step,
                    "loss": loss,
                    "grad_norm": norm,
                    "lr": q.lr,
                    "tokens_per_s": tokens / dt,
                    "mfu": self.flops_per_token * tokens / dt / (self.peak_flops * self.world_size),
                    "peak_mem_bytes": q.peak_mem_bytes,
                    "step_time_s": dt,
                    **q.extra,
                }
            )
        return rows

    def _reads_after(self, step: int) -> bool:
        """Whether `train` reads the device's values after `step` (and so waits for its work):
        a step the log prints, the last step, one that saves a checkpoint (never a diverged
        state), and each step of the profiler's window (its trace holds finished work). The
        other steps are queued behind the running one; their rows are filled in at the next read.
        The same steps on every rank, so every rank stops at the same non-finite loss."""
        last = step == self.cfg.training.steps
        prof = self.cfg.profiler
        profiled = prof.enable and prof.start_step <= step < prof.start_step + prof.num_steps
        return last or profiled or self.logger.prints(step) or self.checkpointer.should_save(step, last)

    def _steps(self) -> str | None:
        """Step to `training.steps`; returns why the run stopped early (`diverged_message`), or None.

        A non-finite loss is seen at the next read, at most metrics.log_freq - 1 steps after it:
        the rows end at the step that diverged, and no checkpoint is saved after it."""
        queued: list[_Queued] = []
        last_norm: tuple[int, float] | None = None  # (step, grad norm) of the latest finite grad norm
        while self.step < self.cfg.training.steps:
            self.step += 1
            self.profiler.before_step(self.step)
            queued.append(self._launch())
            rows = self._rows(queued) if self._reads_after(self.step) else None
            self.profiler.after_step(self.step)
            self.validator.maybe_run(self.model, self.step)  # every rank: a sharded forward gathers
            if rows is None:
                continue
            queued = []
            for row in rows:
                row |= self.validator.columns(row["step"])  # val_loss, val_ppl, val_tokens after a validation
                self.logger.log(row)
                if math.isfinite(row["grad_norm"]):
                    last_norm = (row["step"], row["grad_norm"])
                if not (math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])):
                    # nothing useful follows a non-finite loss or grad norm (clipping by a NaN norm makes
                    # every weight NaN); every rank holds the same all-reduced values and reads at the
                    # same steps, so every rank stops here
                    return diverged_message(row["step"], row["loss"], last_norm, row["grad_norm"])
            self.checkpointer.maybe_save(
                self.step,
                model=self.model,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                data_loader=self.data,
                last=self.step == self.cfg.training.steps,
            )
        return None

    def train(self) -> TrainResult:
        devices.reset_peak_memory(self.device)
        completed = False
        stopped = None
        try:
            self.logger.start(after_step=self.step)  # a resumed run supersedes the rows after its checkpoint
            stopped = self._steps()
            if self.cfg.checkpoint.export_hf and stopped is None:  # every rank: gathering is collective
                self._export(self._under_output(self.cfg.checkpoint.export_hf))
            completed = True
        finally:
            self.profiler.close()
            self.logger.close()
            self.close(together=completed)
        return TrainResult(
            metrics=self.logger.rows,
            num_params=self.num_params,
            flops_per_token=self.flops_per_token,
            device=str(self.device),
            swaps=self.swaps,
            resumed_from=self.resumed_from,
            weights_from=self.weights_from,
            output_dir=str(self.out_dir),
            summary=self.logger.summary_table() if self.logger.enabled and self.logger.console_on else None,
            world_size=self.world_size,
            data_parallel=self.cfg.parallelism.data_parallel,
            model_notes=self.model_notes,
            stopped=stopped,
            data=report_data(self.data),
        )


def diverged_message(step: int, loss: float, last_norm: tuple[int, float] | None, grad_norm: float = 0.0) -> str:
    """One line for a run stopped by a non-finite loss or grad norm: the step, the quantity, the last finite grad norm."""
    if last_norm is None:
        norm = "no step had a finite grad norm"
    else:
        norm = f"the last finite grad norm was {last_norm[1]:.6g} (step {last_norm[0]})"
    what = f"the loss at step {step} is {loss!r}"
    if math.isfinite(loss):
        what = f"the grad norm at step {step} is {grad_norm!r} (loss {loss!r})"
    return (
        f"training diverged: {what}, so the run stopped there; {norm}; "
        "the usual cause is a learning rate too high for the model (optimizer.lr)"
    )
