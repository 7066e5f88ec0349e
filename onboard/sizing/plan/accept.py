"""The recipe a plan option would write, and titan_core's verdict on it: a plan writes only what
titan_core runs.

The search (plan/search.py) weighs layouts by memory and time; which combinations the trainer
runs is titan_core's to say, not the planner's. So each fitting option becomes the config its
recipe would hold (`planned_values`: the same values `onboard plan` writes, on the workspace's
recipe with the full model), and titan_core judges it:

- `titan_core.parallel.check_parallelism(cfg, world)`: every check that needs no process group
  (degrees against the world, ep / cp / pp against the execution mode, checkpoints, validation,
  the attention kernel, the transformers path, the pipeline schedule's microbatches), and under
  [lora] `titan_core.lora.inject.check_lora` (the degrees its adapters compose with);
- the checks that need the model, run on the full model on meta: `check_pipeline_model` under
  pp (the shared decoder, no tied embeddings, no MoE load-balancing loss across stages) and
  `check_expert_model` under ep (experts of titan_core's kind that ep divides). They run before
  the recipe's kernel swaps, which replace kernels, never the decoder's structure or its experts.

A refusal is kept with the option, titan_core's message on one line, and the option is never
chosen. `refused_features` asks the same of the training features a recipe leaves off
(checkpoints, validation, export, initial weights): what a user could not turn on with the chosen
layout, which the plan states.

    accept = Acceptance(cfg, args, model, shape, target, kernels, levers)
    plan = plan_training(..., accept=accept)              # accept(option) -> refusal or None
    levers = accept.levers_for(plan.chosen)                # what the written recipe holds
"""

from __future__ import annotations

import dataclasses
from typing import Any

from titan_core.config import ConfigError
from titan_core.config.loader import get_key
from titan_core.config.execution_modes import MODE_KEYS, execution_mode
from titan_core.config.sections import JobConfig
from titan_core.memory.estimate import ModelShape, TrainSetup
from titan_core.compile.graph_trainer.scan import check_scannable
from titan_core.lora.inject import check_lora
from titan_core.parallel import check_parallelism
from titan_core.parallel.expert_parallel import check_expert_model
from titan_core.parallel.mesh import Degrees
from titan_core.parallel.pipeline import check_pipeline_model

from onboard.sizing.plan.planner import Target, moe_kernel, offload_of
from onboard.sizing.plan.levers import Lever, merged, mode_levers
from onboard.sizing.plan.layout_memory import REGATHERING
from onboard.sizing.plan.search import Option

FEATURES = {
    "checkpoint.enable": True,
    "validation.enable": True,
    "checkpoint.export_hf": "EXPORT_DIR",
    "checkpoint.initial_hf": "CHECKPOINT",
}
"""What a recipe that trains the real model turns on (`onboard recipe`'s continue-training line does),
with a stand-in value: `refused_features` asks titan_core about each the recipe leaves off."""


def one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def with_values(cfg: JobConfig, values: dict[str, Any], sections_made: dict | None = None) -> JobConfig:
    """`cfg` with each "section.field" of `values` set; the sections it does not touch are shared with `cfg`
    (titan_core's checks only read a config, and a deep copy per candidate was most of a plan's time).
    `sections_made`: sections already made from `cfg` with the same fields, kept by the caller to be shared
    the same way (most candidates' device, mode and checkpointing sections are alike)."""
    sections: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        section, _, name = key.partition(".")
        sections.setdefault(section, {})[name] = value
    made = {}
    for name, fields in sections.items():
        key = (name, tuple(fields.items()))
        if sections_made is None or not _hashable(key):
            made[name] = dataclasses.replace(getattr(cfg, name), **fields)
            continue
        if key not in sections_made:
            sections_made[key] = dataclasses.replace(getattr(cfg, name), **fields)
        made[name] = sections_made[key]
    return dataclasses.replace(cfg, **made)


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def planned_values(o: Option, target: Target, seq_len: int, levers: list[Lever], *, offload: bool,
                   scan: bool) -> dict[str, Any]:  # fmt: skip
    """The recipe keys a plan writes for option `o`, in the recipe's order (workspace_plan.recipe_edits adds
    each one's reason, the full model's config file and the output folder); `levers`: the recipe's levers as
    decided for `o` (those that change, and graph_trainer.enable always, are written)."""
    s = o.layout
    out: dict[str, Any] = {
        "training.batch_size": o.batch, "training.seq_len": seq_len, "training.grad_accum": o.microbatches,
        "training.dtype": "float32",
        "training.mixed_precision_param": "float32" if target.device_type == "cpu" else "bfloat16",
        "training.mixed_precision_reduce": "float32",
        "parallelism.data_parallel": "simple_fsdp" if o.data_parallel == REGATHERING else o.data_parallel,
        "parallelism.reshard_after_forward": o.data_parallel == REGATHERING, "parallelism.dp_shard": s.dp_shard,
        "parallelism.dp_replicate": s.dp_replicate, "parallelism.tp": s.tp, "parallelism.ep": s.ep,
        "parallelism.cp": s.cp, "parallelism.pp": s.pp, "parallelism.sequence_parallel": False,
    }  # fmt: skip
    if s.pp > 1:
        out["parallelism.pp_schedule"] = s.pp_schedule
    out.update((lv.key, lv.plan) for lv in levers if lv.changed or lv.key == MODE_KEYS["graph_trainer"])
    if o.captured:
        out.update({"graph_trainer.memory_policy": o.policy, "graph_trainer.split": offload,
                    "graph_trainer.scan_layers": scan, "activation_checkpoint.mode": "none"})  # fmt: skip
    else:
        out.update(ac_values(o.policy))
    out["device.type"] = target.device_type
    return out


def ac_values(policy: str) -> dict[str, Any]:
    """The [activation_checkpoint] keys of an eager or per-block compiled step keeping what `policy` keeps."""
    if policy == "full":
        return {"activation_checkpoint.mode": "full"}
    if policy == "default":
        return {"activation_checkpoint.mode": "selective", "activation_checkpoint.selective": "op"}
    return {"activation_checkpoint.mode": "none"}


class Acceptance:
    """titan_core's verdict on each option's recipe (module docstring); callable as `accept(option)`."""

    def __init__(self, cfg: JobConfig, args, model, shape: ModelShape, target: Target, kernels: TrainSetup,
                 levers: list[Lever]) -> None:  # fmt: skip
        """`cfg`: the workspace recipe with the full model (model.hf_config its config.json); `args`, `model`:
        the full model's arguments and meta model; `kernels`, `levers`: plan_levers.planning_kernels'."""
        self.cfg, self.args, self.model, self.shape = cfg, args, model, shape
        self.target, self.kernels, self.levers = target, kernels, levers
        self._mode_levers: dict[tuple[str, bool], list[Lever]] = {}
        self._model_refusals: dict[tuple[str, Any], str | None] = {}
        self._sections: dict[tuple[str, tuple], Any] = {}

    def levers_for(self, o: Option, *, compile_refused: str | None = None,
                   captured_refused: str | None = None) -> list[Lever]:  # fmt: skip
        """The recipe's levers as option `o` runs them: the target's kernels and `o`'s execution mode (the
        refusals, when given, of `o`'s layout compiled or captured go into the mode's reasons)."""
        def mode() -> list[Lever]:
            moe = moe_kernel(self.kernels, self.target, o.mode)
            return merged(self.levers + mode_levers(self.cfg, self.args, self.target, self.kernels, o.policy, moe,
                                                    mode=o.mode, compile_refused=compile_refused,
                                                    captured_refused=captured_refused))  # fmt: skip

        if compile_refused or captured_refused:
            return mode()
        key = (o.policy, o.mode)  # the values depend on these alone: one list per mode for every candidate
        if key not in self._mode_levers:
            self._mode_levers[key] = mode()
        return self._mode_levers[key]

    def config(self, o: Option) -> JobConfig:
        """The config of the recipe `o` would write (the values only; with the full model)."""
        values = planned_values(o, self.target, o.setup.seq_len, self.levers_for(o), offload=offload_of(o)[0],
                                scan=o.scan)  # fmt: skip
        return with_values(self.cfg, values, self._sections)

    def __call__(self, o: Option) -> str | None:
        """titan_core's one-line refusal of `o`'s recipe on `o`'s world, or None when it runs it."""
        try:
            cfg = self.config(o)
            degrees = check_parallelism(cfg, o.layout.world)
            check_lora(cfg, o.layout.world)  # [lora]'s own: the degrees and modes its adapters compose with
            self._check_model(cfg, degrees)
        except ConfigError as e:
            return one_line(e)
        return None

    def refused_features(self, o: Option) -> dict[str, str]:
        """{key: titan_core's refusal} of each FEATURES key `o`'s recipe leaves off that titan_core would
        refuse with `o`'s layout (what a user cannot turn on in that recipe)."""
        cfg, out = self.config(o), {}
        for key, on in FEATURES.items():
            if get_key(cfg, key):
                continue  # on in the recipe: the option was judged with it
            try:
                check_parallelism(with_values(cfg, {key: on}), o.layout.world)
            except ConfigError as e:
                out[key] = one_line(e)
        return out

    def _check_model(self, cfg: JobConfig, degrees: Degrees) -> None:
        """titan_core's model-level refusals for these degrees (each asked once per argument: they read the
        model, which every option shares)."""
        asks = []
        if execution_mode(cfg) == "graph_trainer" and cfg.graph_trainer.scan_layers:
            asks.append((("scan",), lambda: check_scannable(self.model)))
        if degrees.pp > 1:
            asks.append((("pipeline", cfg.model.family), lambda: check_pipeline_model(self.model, cfg.model.family)))
        if degrees.ep > 1:
            asks.append((("experts", degrees.ep), lambda: check_expert_model(self.model, degrees.ep)))
        for key, ask in asks:
            if key not in self._model_refusals:
                try:
                    ask()
                    self._model_refusals[key] = None
                except ConfigError as e:
                    self._model_refusals[key] = one_line(e)
            if self._model_refusals[key] is not None:
                raise ConfigError(self._model_refusals[key])
