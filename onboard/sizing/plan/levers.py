"""The recipe's levers re-decided for a plan's target.

A workspace's recipe holds what the ladder earned on this machine, often on a twin: an
experts kernel chosen so a 16-expert twin can be captured, kernels a CPU timing kept at the
twin's vocabulary, the CPU's thread count. Carried as they are to a full-size model on
another device, they cost what the gates never saw (the dense experts run every one of 128
experts on every token) or mean nothing there (a CPU thread count on a TPU host). So the
plan decides each of them again for the target and says why; `onboard plan --check` then
runs the recipe it writes, levers and precision as written, on the twin.

    kernels, levers = planning_kernels(cfg, args, target)    # before the plan: what its memory model assumes
    levers += mode_levers(cfg, args, target, kernels, policy) # after it: the execution mode and the experts it runs

Each `Lever` is one recipe key: the recipe's value, the plan's, and why. A lever whose value
does not change is listed only where the recipe's value was earned here and the plan keeps it
for a reason of its own (a CPU target keeps what this CPU measured).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from titan_core.config.execution_modes import MODE_KEYS, execution_mode
from titan_core.config.sections import Kernels
from titan_core.kernels.moe import grouped_mm_unsupported
from titan_core.memory.estimate import TrainSetup
from titan_core.models.common.args import TransformerArgs

ROUTED_MOE = {"cuda": "grouped_mm", "tpu": "tokamax"}
"""The routed, static-shape experts kernel of an accelerator: torch._grouped_mm in bf16 on CUDA,
tokamax's ragged_dot (Pallas) through the JAX bridge on a TPU. Not run here: the plan says so."""
CPU_STATIC_MOE = "dense"
"""The one experts kernel a compiled or captured step can trace on a CPU in fp32 (grouped_mm's
meta function takes bf16 only)."""
CE_CHUNK_DEFAULT = Kernels().ce_chunk


@dataclass(frozen=True)
class Lever:
    """One recipe key as the plan decides it for its target."""

    key: str
    """Dotted recipe key, e.g. "kernels.moe"."""
    recipe: Any
    """The workspace recipe's value (what the ladder earned here)."""
    plan: Any
    """The value the plan's recipe holds."""
    why: str
    """One line: why the plan holds that value on its target."""

    @property
    def changed(self) -> bool:
        return self.plan != self.recipe

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "recipe": self.recipe, "plan": self.plan, "changed": self.changed, "why": self.why}


def _is_moe(args: TransformerArgs) -> bool:
    return args.n_experts > 0


# ---- before the plan: the kernels its memory model assumes --------------------------------------
def planning_kernels(cfg, args: TransformerArgs, target, *, twin_args: TransformerArgs | None = None,
                     scores_pinned: bool = False):
    """(TrainSetup whose loss / attention / moe / ce_chunk the plan's memory model uses, levers).

    `cfg`: the workspace recipe; `args`: the full model; `twin_args`: the twin the gates ran, if any
    (its sizes go into the reasons). The experts kernel here is the one an eager or per-block
    compiled step runs on the target; a captured option still swaps the reference loop for a
    static-shape kernel (`plan.moe_kernel`), and `mode_levers` writes the one the chosen option runs."""
    base = TrainSetup.from_config(cfg)
    levers: list[Lever] = []
    moe = _moe_lever(cfg, args, target, twin_args)
    if moe is not None:
        base = replace(base, moe=moe.plan)
        if moe.changed or target.device_type == "cpu":
            levers.append(moe)
    for lever in (_attention_lever(cfg, target, scores_pinned), _loss_lever(cfg, args, target, twin_args),
                  _ce_chunk_lever(cfg, args, target, twin_args), _threads_lever(cfg, target)):  # fmt: skip
        if lever is None:
            continue
        levers.append(lever)
        if lever.key.startswith("kernels."):
            base = replace(base, **{lever.key.removeprefix("kernels."): lever.plan})
    return base, levers


def _twin_experts(twin_args: TransformerArgs | None) -> str:
    return f"the twin's {twin_args.n_experts} experts" if twin_args is not None else "the experts"


def _moe_lever(cfg, args: TransformerArgs, target, twin_args) -> Lever | None:
    """The experts kernel of an eager or per-block compiled step on the target; None for a dense model
    (no experts: kernels.moe is never written for one)."""
    if not _is_moe(args):
        return None
    have = cfg.kernels.moe
    # per-block compile traces the experts: the loop's torch.where breaks the graph
    static = execution_mode(cfg) == "compile"
    if target.device_type == "cpu":
        if have == "loop" and static:
            return Lever("kernels.moe", have, CPU_STATIC_MOE, "per-block compile needs static-shape experts; "
                         f"{CPU_STATIC_MOE} is the one a CPU traces in fp32")  # fmt: skip
        on_twin = ""
        if twin_args is not None:
            on_twin = f" (on the twin's {twin_args.n_experts} experts; the full model has {args.n_experts})"
        return Lever("kernels.moe", have, have, f"a CPU target: the choice this CPU's gates verified stands{on_twin}")
    if have == "loop" and not static:
        return Lever("kernels.moe", have, have, "the eager step runs the reference loop the gates verified")
    routed, why_not = _routed_moe(args, target)
    if routed is None:
        return Lever("kernels.moe", have, have, f"no routed experts kernel on {target.kind}: {why_not}")
    if have == routed:
        return Lever("kernels.moe", have, have, f"the routed kernel of {target.kind}")
    why = f"{_why_not_here(have, args, twin_args)}; {routed} is {target.kind}'s routed static-shape kernel"
    return Lever("kernels.moe", have, routed, why + " (not run here: verify it on the target)")


def _why_not_here(have: str, args: TransformerArgs, twin_args) -> str:
    """Why the recipe's experts kernel does not carry over to an accelerator."""
    if have == "dense":
        return (
            f"dense was chosen so {_twin_experts(twin_args)} capture on a CPU; on the full model it runs all "
            f"{args.n_experts} experts on every token ({args.n_experts / args.top_k:g}x the expert FLOPs of "
            f"top-{args.top_k}) and holds every expert's activations"
        )
    return {
        "loop": "per-block compile needs static-shape experts (the loop's torch.where breaks the graph)",
        "grouped_mm": "torch._grouped_mm has no TPU kernel",
        "tokamax": "tokamax was timed through the JAX bridge on this CPU; torch._grouped_mm is CUDA's own",
    }[have]


def _routed_moe(args: TransformerArgs, target) -> tuple[str | None, str]:
    """(the target's routed experts kernel, or None; why not). Accelerator plans compute in bf16."""
    routed = ROUTED_MOE[target.device_type]
    if routed == "grouped_mm":
        why = grouped_mm_unsupported("cuda", torch.bfloat16, args.dim, args.moe_hidden_dim, captured=True)
        if why:
            return None, why
    return routed, ""


def _attention_lever(cfg, target, scores_pinned: bool = False) -> Lever | None:
    """naive materialises [heads, seq, seq] scores; tokamax on CUDA would be JAX on the GPU: sdpa instead. A
    model whose every attention layer keeps the naive core (`scores_pinned`: soft-capped scores) keeps it."""
    have = cfg.kernels.attention
    if target.device_type == "cpu":
        return None
    if scores_pinned and have == "naive":
        return Lever("kernels.attention", have, have, "every attention layer caps its scores, which only the naive "
                     "core applies: sdpa would change nothing; the memory model counts the [heads, seq, seq] "
                     "scores")  # fmt: skip
    if have == "naive":
        return Lever("kernels.attention", have, "sdpa", "naive (the reference) holds every [seq, seq] score; "
                     "sdpa keeps O(seq) per query at the target's sequence")  # fmt: skip
    if have == "tokamax" and target.device_type == "cuda":
        return Lever("kernels.attention", have, "sdpa", "tokamax was timed through the JAX bridge on this CPU; "
                     "on CUDA sdpa is torch's own flash attention")  # fmt: skip
    return None


def _loss_lever(cfg, args: TransformerArgs, target, twin_args) -> Lever | None:
    """The plain loss holds [tokens, vocab] fp32 logits: at the full vocabulary the fused loss is planned."""
    if target.device_type == "cpu" or cfg.kernels.loss != "plain" or not args.kind.loss_head:
        return None
    timed = f"at the twin's vocabulary of {twin_args.vocab_size}" if twin_args is not None else "on this CPU"
    why = (f"the plain loss was kept by a CPU timing {timed}; at {args.vocab_size} it holds [tokens, vocab] "
           "fp32 logits, which fused_ce computes in chunks")  # fmt: skip
    return Lever("kernels.loss", "plain", "fused_ce", why)


def _ce_chunk_lever(cfg, args: TransformerArgs, target, twin_args) -> Lever | None:
    """A chunk tuned by a CPU timing at the twin's vocabulary goes back to the default on an accelerator."""
    have = cfg.kernels.ce_chunk
    if target.device_type == "cpu" or have == CE_CHUNK_DEFAULT:
        return None
    timed = f"the twin's vocabulary of {twin_args.vocab_size}" if twin_args is not None else "this CPU"
    return Lever("kernels.ce_chunk", have, CE_CHUNK_DEFAULT, f"tuned by a CPU timing at {timed}; the default "
                 f"for {args.vocab_size} on {target.kind}")  # fmt: skip


def _threads_lever(cfg, target) -> Lever | None:
    """This CPU's intra-op thread count means nothing on an accelerator's host."""
    have = cfg.device.threads
    if not have:
        return None
    if target.device_type == "cpu":
        if target.count == 1:
            return Lever("device.threads", have, have, "tuned on this host for one process, as the plan runs it")
        return Lever("device.threads", have, 0, f"tuned on this host for one process; {target.count} processes "
                     "share its cores (0: torch's default for each)")  # fmt: skip
    return Lever("device.threads", have, 0, f"this CPU's thread count (tuned here); {target.kind} hosts are not "
                 "this machine (0: torch's default)")  # fmt: skip


# ---- after the plan: the execution mode of the chosen option -------------------------------------
def mode_levers(cfg, args: TransformerArgs, target, kernels: TrainSetup, policy: str, moe: str, *,
                mode: str, compile_refused: str | None = None, captured_refused: str | None = None) -> list[Lever]:
    """The execution mode (one of per-block compile and the Graph Trainer, never both) and the experts
    kernel of the chosen option (`policy`: its memory policy; `moe`: what it runs, `plan.moe_kernel`;
    `mode`: eager | compile | graph_trainer | scan; `compile_refused`: titan_core's refusal of the same
    layout compiled, when the plan runs it uncompiled for that; `captured_refused`: its refusal of the same
    layout's captured step, when the plan runs it eager)."""
    captured = mode in ("graph_trainer", "scan")
    where = f"the plan's {mode} step, memory policy {policy}"
    step = "the Graph Trainer's captured step" if captured else "an eager step"
    if not captured and captured_refused:
        step += f"; titan_core refuses the captured step with the chosen layout ({captured_refused})"
    have = execution_mode(cfg)
    levers = [Lever(MODE_KEYS["graph_trainer"], have == "graph_trainer", captured, f"{where}: {step}")]
    if captured and have == "compile":
        levers.append(Lever(MODE_KEYS["compile"], True, False, f"{where} is the Graph Trainer's, a second execution "
                            "mode titan_core refuses beside per-block compile (graph_trainer.compile = "
                            f"{cfg.graph_trainer.compile!r} says how the captured step is compiled)"))  # fmt: skip
    elif have == "compile" and mode == "eager":
        why = (f"titan_core refuses per-block compile with the chosen layout ({compile_refused}): the eager step "
               "runs uncompiled, as the eager rung verified" if compile_refused else
               "the plan's chosen eager step runs uncompiled, as the eager rung verified")  # fmt: skip
        levers.append(Lever(MODE_KEYS["compile"], True, False, why))
    elif have == "compile":
        levers.append(Lever(MODE_KEYS["compile"], True, True, "the eager step runs per-block compile, as the compile "
                            "rung verified"))  # fmt: skip
    if _is_moe(args) and moe != kernels.moe:
        levers.append(Lever("kernels.moe", cfg.kernels.moe, moe, f"{where}: a captured step needs static-shape "
                            f"experts; {moe} is {target.kind}'s (not run here: verify it on the target)"))  # fmt: skip
    return levers


def merged(levers: list[Lever]) -> list[Lever]:
    """One lever per key, the later decision winning (the mode's experts over the eager step's)."""
    out: dict[str, Lever] = {}
    for lever in levers:
        out.pop(lever.key, None)
        out[lever.key] = lever
    return list(out.values())
