"""Pipeline parallelism: the shared decoder cut into stages, run by a torch.distributed.pipelining schedule.

The decoder's blocks (`model.layers`, a ModuleDict in execution order) are split into stages,
as evenly as the layer count allows (earlier stages take the remainder) or as
`parallelism.pp_layers` says. The first stage also holds the token embedding; the last the
final norm, the output head and the loss head, which the schedule's `loss_fn` runs on the
last stage's output. Stage i lives on pp rank i % pp: one stage per rank, two with
`interleaved1F1B`. Micro-batches are the step's `training.grad_accum` micro-batches. With tied
embeddings the last stage holds a copy of the embedding weight for its head: the two copies start
equal (the same init draw), their gradients are summed between the first and the last pp rank before
the optimizer step (so both take the one-process step), and the norm counts the weight once.

A rank never holds the whole model: its stages are sharded with SimpleFSDP on meta over the
data-parallel dimensions of the mesh (the `pp` dimension left out), so its gradients are reduced
per micro-batch, as without pipelining, and only those shards are made real (`cut_stages`). The
weights still equal the single-process initialisation, which draws every parameter in order
from one generator: the sharded init (sharded_init.py) draws the other stages' parameters too,
one at a time, and drops them with their modules.

    check_pipeline(cfg, degrees)             # ConfigError for what pipelining does not support here
    pipe = build_pipeline(model, cfg, mesh, device, scale)  # after build_mesh, before the optimizer
    losses = pipe.run(tokens, labels, positions=..., segment_ids=...)   # one step's forward + backward
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from titan_core.config.dtypes import DTYPES
from titan_core.config.loader import ConfigError
from titan_core.config.execution_modes import execution_mode
from titan_core.config.sections import JobConfig
from titan_core.models.common.decoder import Transformer
from titan_core.models.common.layers import rope_cos_sin
from titan_core.models.common.moe import load_balancing_loss
from titan_core.parallel.mesh import Degrees
from titan_core.models.common.init_stand_in import InitRecord
from titan_core.parallel.sharded_init import init_dtypes_of, materialise_sharded
from titan_core.parallel.apply import parallelize
from titan_core.parallel.local import local_tensor
from titan_core.models.model_builder import resolve_model_args

STAGES_PER_RANK = {"gpipe": 1, "1F1B": 1, "interleaved1F1B": 2}
"""Stages each pp rank holds, per `parallelism.pp_schedule`."""


def n_stages(cfg: JobConfig) -> int:
    return cfg.parallelism.pp * STAGES_PER_RANK[cfg.parallelism.pp_schedule]


def stage_layer_counts(n_layers: int, stages: int, pp_layers: list) -> list[int]:
    """Decoder layers per stage: `pp_layers` as given (checked), else an even split, the first
    `n_layers % stages` stages taking one more (the last stage also runs the output head and the loss)."""
    if pp_layers:
        # a TOML list holds ints; `--parallelism.pp_layers=1,3` gives the strings "1", "3"
        pp_layers = [int(n) if isinstance(n, str) and n.isdigit() else n for n in pp_layers]
        if len(pp_layers) != stages or not all(type(n) is int and n >= 1 for n in pp_layers):
            raise ConfigError(
                f"parallelism.pp_layers = {pp_layers} must hold {stages} whole numbers >= 1, one per stage "
                "(pp, times 2 for interleaved1F1B)"
            )
        if sum(pp_layers) != n_layers:
            raise ConfigError(
                f"parallelism.pp_layers = {pp_layers} sums to {sum(pp_layers)}, but the model has {n_layers} layers"
            )
        return list(pp_layers)
    if n_layers < stages:
        raise ConfigError(
            f"parallelism.pp: {stages} pipeline stages need at least one layer each, but the model has {n_layers}"
        )
    return [n_layers // stages + (i < n_layers % stages) for i in range(stages)]


def stage_layer_ids(layer_names: list[str], counts: list[int]) -> list[list[str]]:
    """The block names of each stage: consecutive runs of `layer_names` of `counts` lengths."""
    out, start = [], 0
    for n in counts:
        out.append(layer_names[start : start + n])
        start += n
    return out


def local_stages(pp_rank: int, pp: int, stages: int) -> list[int]:
    """The stage indices pp rank `pp_rank` runs (torch's loop placement: stage i on rank i % pp)."""
    return list(range(pp_rank, stages, pp))


def check_schedule(schedule: str, grad_accum: int, pp: int) -> None:
    """The micro-batch count each schedule accepts (torch.distributed.pipelining's own rules)."""
    if schedule == "1F1B" and grad_accum < pp:
        raise ConfigError(
            f"training.grad_accum = {grad_accum} micro-batches: pp_schedule 1F1B needs at least pp = {pp}"
        )
    if schedule == "interleaved1F1B":
        rounds = max(1, grad_accum // pp)
        if grad_accum % rounds:
            raise ConfigError(
                f"training.grad_accum = {grad_accum} micro-batches: pp_schedule interleaved1F1B needs a count "
                f"below pp = {pp} or a multiple of max(1, grad_accum // pp) = {rounds} (e.g. a multiple of pp)"
            )


def check_pipeline(cfg: JobConfig, degrees: Degrees) -> None:
    """Every refusal of pp > 1 that needs no built model: what it composes with, the layer split
    (the layer count read from the recipe's model config), the schedule's micro-batch count."""
    p = cfg.parallelism
    if degrees.pp == 1:
        if p.pp_layers:
            raise ConfigError(f"parallelism.pp_layers = {p.pp_layers} splits pipeline stages: it needs pp > 1")
        return
    if p.data_parallel != "simple_fsdp":
        raise ConfigError(f"parallelism.pp = {degrees.pp} needs data_parallel = 'simple_fsdp', not '{p.data_parallel}'")
    unsupported = (
        (cfg.model.module_file, "model.module_file (a port): pp > 1 splits the shared decoder only"),
        (execution_mode(cfg) == "graph_trainer", "graph_trainer.enable (the Graph Trainer)"),
        (cfg.checkpoint.export_hf, "checkpoint.export_hf (the export gathers the whole model)"),
    )
    for on, what in unsupported:
        if on:
            raise ConfigError(f"parallelism.pp > 1 does not support {what}: turn it off or set pp = 1")
    stage_layer_counts(resolve_model_args(cfg.model).n_layers, n_stages(cfg), p.pp_layers)
    check_schedule(p.pp_schedule, cfg.training.grad_accum, degrees.pp)


def check_pipeline_model(model: nn.Module, family: str) -> None:
    """ConfigError unless `model` is the shared decoder run as written (its blocks, embedding and
    heads are what a stage holds)."""
    cls = type(model)
    if not isinstance(model, Transformer) or cls.hidden is not Transformer.hidden or cls.loss is not Transformer.loss:
        raise ConfigError(
            f"parallelism.pp > 1 splits the shared decoder (titan_core/models/common/decoder.py); model family "
            f"'{family}' builds {cls.__name__}, which is not run through it"
        )


def cut_stages(
    model: Transformer, layer_names: list[str], *, first: bool, last: bool, device, seed: int,
    dtype: torch.dtype, mesh: DeviceMesh | None, cfg: JobConfig | None = None, expert_mesh: DeviceMesh | None = None,
    draw: bool = True,
) -> InitRecord:
    """Keep, shard and initialise only the parts of the meta `model` this rank runs (in place).

    The parts this rank runs are parallelised on meta as the whole model would be (`parallelize` with
    `cfg` over `mesh`, the mesh without `pp`; no `mesh`: kept whole, as one process of the stage would
    hold them); the sharded init
    (sharded_init.py) then draws every parameter in the one-process order and keeps this rank's
    slices, so the other stages' parameters are drawn and dropped, never held together; their
    modules are deleted afterwards. `draw` False (a checkpoint fills every parameter next): no draws,
    only the buffers computed.
    """
    keep = set(layer_names)
    tied = model.output is None  # the head reads the embedding's weight: the last stage holds a copy of it
    placed = {"tok_embeddings": first or (last and tied), "norm": last, "output": last}
    foreign = tuple(f"layers.{k}." for k in model.layers if k not in keep)
    foreign += tuple(f"{name}." for name, _ in model.named_children() if not placed.get(name, True))
    dropped = frozenset(n for n, _ in model.named_parameters() if n.startswith(foreign))
    init_dtypes = init_dtypes_of(model)
    model.to(dtype)
    if mesh is not None:  # the other stages' parts too (their plans apply), but SimpleFSDP leaves them
        parallelize(model, cfg, mesh, expert_mesh, skip=dropped)
    record = materialise_sharded(model, device, seed, init_dtypes=init_dtypes, cast_to=dtype, dropped=dropped,
                                 draw=draw)  # fmt: skip
    for k in [k for k in model.layers if k not in keep]:
        del model.layers[k]
    if not placed["tok_embeddings"]:
        model.tok_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return record


class DecoderStage(nn.Module):
    """One stage of the shared decoder: the blocks `layer_names` of `model`, with the embedding on
    the first stage and the final norm, output head and loss head on the last. It holds `model`'s
    own modules, so parameter names (and SimpleFSDP's gathering) are those of the whole model.

    forward(tokens or hidden states, positions=None, segment_ids=None) -> hidden states (final-normed
    on the last stage); `cross_entropy(h, labels)` is the model's loss head on them. Every stage
    computes RoPE from the positions itself, as `Transformer.hidden` does once. A model with an MoE
    load-balancing loss passes its routing statistics along too: forward(h, stats, ...) -> (h, stats),
    each stage adding its layers' to the running sum (zeros [2, n_experts] on the first), in layer order
    as `Transformer.hidden` sums them, so the last stage holds every layer's and computes the loss.
    """

    def __init__(self, model: Transformer, layer_names: list[str], *, first: bool, last: bool):
        super().__init__()
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = nn.ModuleDict({k: model.layers[k] for k in layer_names})
        self.norm = model.norm if last else None
        # the output head's weight holder: the head, or with tied embeddings the embedding (its copy here)
        self.output = (model.output if model.output is not None else model.tok_embeddings) if last else None
        self.loss_head = model.loss_head if last else None
        self.register_buffer("inv_freq", model.inv_freq, persistent=False)
        args = model.args
        self.moe_layers = sum(args.layer_is_moe(i) for i in range(args.n_layers)) if args.aux_loss_coef else 0
        """MoE layers of the whole model when its load-balancing loss is on (0: no statistics passed)."""
        self.n_experts = args.n_experts if self.moe_layers else 0

    def forward(self, x, stats=None, positions=None, segment_ids=None):
        h = x if self.tok_embeddings is None else self.tok_embeddings(x)
        if positions is None:
            positions = torch.arange(h.shape[1], device=h.device).expand(h.shape[0], -1)
        cos, sin = rope_cos_sin(self.inv_freq, positions, h.dtype)
        if self.moe_layers and stats is None:  # the first stage: 0 + the first layer's is that layer's, exactly
            stats = torch.zeros(2, self.n_experts, dtype=torch.float32, device=h.device)
        for block in self.layers.values():
            h, layer_stats = block(h, cos, sin, segment_ids)
            if self.moe_layers:
                stats = stats + layer_stats
        h = h if self.norm is None else self.norm(h)
        return (h, stats) if self.moe_layers else h

    def cross_entropy(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss_head(h, self.output.weight, labels)


@dataclass
class Pipeline:
    """This rank's stages and the schedule that runs them."""

    stages: list[DecoderStage]
    """This rank's stage modules, in stage order."""
    stage_indices: list[int]
    schedule: object
    group: object
    """The pp process group (ranks holding the other stages of the same rows)."""
    first: bool
    """Whether this rank holds stage 0 (it is given the tokens)."""
    last: bool
    """Whether this rank holds the last stage (it is given the labels and computes the loss)."""
    sharded_init: InitRecord
    """How the stages' shards were initialised (sharded_init.py)."""
    tied: nn.Parameter | None = None
    """Tied embeddings: this rank's copy of the embedding weight the first stage reads and the last
    stage's head reads (None: untied, or a rank holding neither stage)."""
    tie_group: object = None
    """The ranks holding the two copies of `tied` for the same rows (the first and the last pp rank)."""

    def sum_tied_grads(self) -> None:
        """Give both copies of a tied weight the sum of their gradients (the one-process gradient of the
        shared weight), so the two optimizers take the same step and the copies stay equal."""
        if self.tied is not None and self.tied.grad is not None:
            dist.all_reduce(local_tensor(self.tied.grad), group=self.tie_group)

    @property
    def counted_elsewhere(self) -> tuple[nn.Parameter, ...]:
        """Parameters whose gradient another pp rank also holds and counts in the global norm (the last
        stage's copy of a tied weight): clipped here, counted once."""
        return (self.tied,) if self.tied is not None and self.last and not self.first else ()

    def run(self, tokens: torch.Tensor, labels: torch.Tensor, **kwargs) -> list[torch.Tensor]:
        """One step's forward and backward over the micro-batches stacked on dim 0 (the schedule
        splits them back); kwargs (positions, segment_ids) go to every stage. Returns each
        micro-batch's loss on the last stage, [] elsewhere. Gradients accumulate into .grad."""
        losses: list[torch.Tensor] = []
        args = (tokens,) if self.first else ()
        self.schedule.step(
            *args,
            target=labels if self.last else None,
            losses=losses if self.last else None,
            return_outputs=False,
            **kwargs,
        )
        return losses

    def evaluate(self, tokens: torch.Tensor, labels: torch.Tensor, **kwargs) -> list[torch.Tensor]:
        """`run`'s forward only (no backward, no gradients): each micro-batch's loss_fn value on the
        last stage, [] elsewhere."""
        losses: list[torch.Tensor] = []
        args = (tokens,) if self.first else ()
        with torch.no_grad():
            self.schedule.eval(*args, target=labels if self.last else None, losses=losses if self.last else None,
                               **kwargs)  # fmt: skip
        return losses


def pp_submesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh of this rank's stage replicas: every dimension but `pp` (SimpleFSDP shards over it)."""
    return mesh[tuple(n for n in mesh.mesh_dim_names if n != "pp")]


def build_pipeline(
    model: Transformer,
    cfg: JobConfig,
    mesh: DeviceMesh,
    device: torch.device,
    scale: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    expert_mesh: DeviceMesh | None = None,
) -> Pipeline:
    """Cut the meta `model` to this rank's stages (in place: it keeps only their modules),
    materialise, initialise, cast and shard them, and build the schedule.

    `scale(loss, ce, labels)`: a micro-batch's loss term from its loss (with any load-balancing term)
    and mean cross-entropy (the caller's token-mean rule); the schedule differentiates it, and the sum
    over micro-batches is the step loss.
    """
    check_pipeline_model(model, cfg.model.family)
    p = cfg.parallelism
    pp = mesh.size(mesh.mesh_dim_names.index("pp"))
    pp_rank = mesh.get_local_rank("pp")
    stages = n_stages(cfg)
    names = list(model.layers.keys())
    per_stage = stage_layer_ids(names, stage_layer_counts(len(names), stages, p.pp_layers))
    mine = local_stages(pp_rank, pp, stages)
    first, last = 0 in mine, stages - 1 in mine
    local_layers = [k for i in mine for k in per_stage[i]]
    record = cut_stages(model, local_layers, first=first, last=last, device=device, seed=cfg.training.seed,
                        dtype=DTYPES[cfg.training.dtype], mesh=pp_submesh(mesh), cfg=cfg, expert_mesh=expert_mesh,
                        draw=not cfg.checkpoint.initial_hf)  # fmt: skip
    modules = [DecoderStage(model, per_stage[i], first=i == 0, last=i == stages - 1) for i in mine]
    group = mesh.get_group("pp")
    pipe_stages = [
        PipelineStage(m, stage_index=i, num_stages=stages, device=device, group=group) for m, i in zip(modules, mine)
    ]
    head = modules[-1]  # the last stage, when this rank holds it

    def loss_fn(out, labels: torch.Tensor) -> torch.Tensor:
        h, stats = out if head.moe_layers else (out, None)
        ce = head.cross_entropy(h, labels)
        if stats is None:
            return scale(ce, ce, labels)
        # the model's own loss (Transformer.loss): one load-balancing term over every layer's statistics
        return scale(ce + model.args.aux_loss_coef * load_balancing_loss(stats, head.moe_layers), ce, labels)

    n = cfg.training.grad_accum
    # scale_grads=False: each micro-batch's term is already its share of the step's mean (`scale`)
    if p.pp_schedule == "interleaved1F1B":
        schedule = ScheduleInterleaved1F1B(pipe_stages, n_microbatches=n, loss_fn=loss_fn, scale_grads=False)
    else:
        cls = Schedule1F1B if p.pp_schedule == "1F1B" else ScheduleGPipe
        schedule = cls(pipe_stages[0], n_microbatches=n, loss_fn=loss_fn, scale_grads=False)
    pipe = Pipeline(modules, mine, schedule, group, first, last, record)
    if model.output is None and model.args.tie_embeddings:
        pipe.tie_group = tie_group(mesh, pp)
        if first or last:
            pipe.tied = model.tok_embeddings._parameters["weight"]
    return pipe


def tie_group(mesh: DeviceMesh, pp: int):
    """The process group of this rank's first and last pp ranks (the same coordinates on every other
    dimension): where a tied embedding's two copies live. Collective: every rank calls it."""
    if pp == 2:
        return mesh.get_group("pp")
    ranks = mesh.mesh.reshape(pp, -1)  # pp is the mesh's outermost dimension (mesh.py)
    mine = None
    for j in range(ranks.shape[1]):
        pair = [int(ranks[0, j]), int(ranks[-1, j])]
        group = dist.new_group(pair)  # every rank creates every pair's group, in the same order
        if dist.get_rank() in pair:
            mine = group
    return mine
