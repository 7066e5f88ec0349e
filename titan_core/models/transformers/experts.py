"""titan_core's experts kernels under transformers' MoE blocks (the transformers path).

transformers 5 keeps a MoE layer's experts in one module of 3-D tensors (`MixtralExperts`,
`Qwen3MoeExperts`, `Qwen2MoeExperts`, `OlmoeExperts` and most others):

    gate_up_proj [E, 2 * I, D]   (the SiLU branch's rows, then the linear branch's)     down_proj [E, D, I]
    forward(hidden_states [T, D], top_k_index [T, k], top_k_weights [T, k]) -> [T, D]
    = sum over the token's k experts e of  w_e * down_proj[e] @ (silu(g_e @ x) * (u_e @ x)),
      g_e, u_e = gate_up_proj[e].chunk(2)

`install_experts` finds those modules in the decoder blocks and, where one has exactly that
structure (`usual_structure_refusal` says why not otherwise), makes it compute through a
titan_core experts kernel: the module becomes an instance of a subclass of its own class
(so transformers' `_init_weights`, which tests `isinstance`, still initialises it, and its
parameters keep their names, shapes and objects: state dicts, parity and export unchanged)
whose forward hands views of its weights in the kernels' layout (w1 = g, w3 = u, w2 =
down_proj, each applied as `x @ w`) to a weightless kernel child, `<experts>.kernel`. That child
is the reference loop (`Experts`) by default and is what `kernels.moe` swaps: the model's
`swap_paths` maps the native `layers.*.moe.experts` onto it, so dense / grouped_mm / tokamax
land there exactly as on a native model.

A model whose experts are not of the usual structure (biases, a transposed or interleaved
layout, another activation or gating, another forward; one such module is enough, since
`kernels.moe` is one choice for the whole model) keeps transformers' modules as they are, the
reason in `ExpertsInstall.refusal` and the log; `swap_paths` then points at them, so a `kernels.moe` swap is refused
(`SwapNotApplicable`: the path and transformers' class) instead of being silently dropped.
"""

from __future__ import annotations

import ast
import inspect
import logging
import textwrap
from dataclasses import dataclass, field

import torch
from torch import nn

from titan_core.models.common.moe import Experts

log = logging.getLogger("titan_core.models.transformers")

KERNEL_CHILD = "kernel"
"""Attribute of an installed experts module that holds its (swappable) kernel."""
USUAL_FLAGS = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
               "has_post_expert_norm": False}  # fmt: skip
"""What `@use_experts_implementation` records on the module, as the kernels' layout needs it."""
PARAMS = ("gate_up_proj", "down_proj")


def _is_experts_class(cls: type) -> bool:
    """Decorated with transformers' `@use_experts_implementation` (its forward dispatches through it)."""
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    return code is not None and "experts_interface" in code.co_freevars


def _forward_ast(fn) -> str | None:
    """The AST of `fn`'s body without its docstring (None when its source cannot be read)."""
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except (OSError, TypeError, SyntaxError):
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    return ast.dump(ast.Module(body=body, type_ignores=[]))


_FORWARD_AST: dict[type, str | None] = {}


def _reference_forward() -> str | None:
    """The per-expert loop MixtralExperts runs (and, in transformers 5.24, 55 of its 67 experts classes)."""
    # transformers is the optional [hf] extra; this module only runs once a transformers model is built
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts  # lazy: the [hf] extra

    return _forward_body(MixtralExperts)


def _forward_body(cls: type) -> str | None:
    """`_forward_ast` of the forward transformers' decorator wraps (cached per class)."""
    if cls not in _FORWARD_AST:
        _FORWARD_AST[cls] = _forward_ast(getattr(cls.forward, "__wrapped__", cls.forward))
    return _FORWARD_AST[cls]


def usual_structure_refusal(module: nn.Module) -> str | None:
    """Why the titan_core experts kernels cannot compute `module` (transformers' experts), or None when they can."""
    # transformers is the optional [hf] extra; the module was built by it, so it is installed
    from transformers.activations import SiLUActivation  # lazy: the [hf] extra
    from transformers.integrations import moe as hf_moe  # lazy: the [hf] extra

    cls = type(module)
    name = cls.__name__
    if not _is_experts_class(cls):
        return f"{name} is not a transformers experts class (@use_experts_implementation) of 3-D expert weights"
    bad = [f"{k}={getattr(module, k, None)}" for k, v in USUAL_FLAGS.items() if getattr(module, k, None) != v]
    if bad:
        return f"{name} has {', '.join(bad)}; the kernels take gate_up_proj concatenated, no bias, no post-norm"
    own = dict(module.named_parameters(recurse=False))
    if sorted(own) != sorted(PARAMS):
        return f"{name} holds parameters {', '.join(sorted(own)) or 'none'}, not exactly {' and '.join(PARAMS)}"
    gate_up, down = own["gate_up_proj"], own["down_proj"]
    if gate_up.ndim != 3 or down.ndim != 3 or tuple(gate_up.shape) != (down.shape[0], 2 * down.shape[2], down.shape[1]):
        return (
            f"{name}: gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)} are not "
            "[E, 2I, D] and [E, D, I]"
        )
    extra = [n for n, _ in module.named_buffers()] + [n for n, _ in module.named_children() if n != "act_fn"]
    if extra:
        return f"{name} holds {', '.join(extra)} besides its two weights and act_fn"
    act = getattr(module, "act_fn", None)
    if type(act) not in (SiLUActivation, nn.SiLU):
        return f"{name}'s activation is {type(act).__name__}; the kernels compute SiLU-gated experts (SwiGLU)"
    if getattr(cls, "_apply_gate", None) is not getattr(hf_moe, "_default_apply_gate", object()):
        return f"{name} overrides _apply_gate; the kernels compute silu(g) * u of the two halves of gate_up_proj"
    mine = _forward_body(cls)
    if mine is None or mine != _reference_forward():
        return f"{name}'s forward is not the usual per-expert loop (MixtralExperts.forward's), so it may compute more"
    return None


class _KernelExperts:
    """Mixed in before transformers' experts class: the forward through `self.kernel`."""

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        # each weight read once (an all-gather under SimpleFSDP); views, so gradients reach the parameters
        down = self.down_proj.transpose(1, 2)  # [E, I, D]: applied as x @ w, the kernels' layout
        gate_up = self.gate_up_proj.transpose(1, 2)  # [E, D, 2I]
        inter = down.shape[1]
        w = (gate_up[..., :inter], gate_up[..., inter:], down)
        # the kernels combine in x's dtype (Mixtral's router hands fp32 weights to bf16 tokens)
        return getattr(self, KERNEL_CHILD)(hidden_states, top_k_weights.to(hidden_states.dtype), top_k_index, w)


_CLASSES: dict[type, type] = {}


def kernel_class(cls: type) -> type:
    """The subclass of transformers' experts class `cls` that computes through its kernel child (one per class)."""
    if cls not in _CLASSES:
        names = {"__module__": __name__, "__qualname__": f"{cls.__qualname__}OnKernel"}
        _CLASSES[cls] = type(f"{cls.__name__}OnKernel", (_KernelExperts, cls), names)
    return _CLASSES[cls]


@dataclass
class ExpertsInstall:
    """What `install_experts` did to a model's decoder blocks."""

    installed: list[str] = field(default_factory=list)
    """Block-relative paths (`<layer>.mlp.experts`) now computing through a titan_core kernel."""
    swap_pattern: str | None = None
    """Where the native `layers.*.moe.experts` swaps go in this tree; None: no experts modules."""
    refusal: str | None = None
    """Why the experts were left as transformers' own (None when installed or when there are none)."""


def _candidates(blocks: nn.ModuleList) -> dict[str, nn.Module]:
    """{"<layer>.<path>": module} of the experts containers: transformers' experts classes, and any
    other module named `experts` (a list of expert MLPs), outermost only."""
    found: dict[str, nn.Module] = {}
    for i, block in enumerate(blocks):
        taken: list[str] = []
        for path, mod in block.named_modules():
            if not path or any(path.startswith(t + ".") for t in taken):
                continue
            if _is_experts_class(type(mod)) or path.rsplit(".", 1)[-1] == "experts":
                found[f"{i}.{path}"] = mod
                taken.append(path)
    return found


def install_experts(blocks: nn.ModuleList, prefix: str) -> ExpertsInstall:
    """Put titan_core's experts kernel under every experts module of `blocks` (at `prefix`.<i>),
    if all of them have the usual structure; otherwise change nothing. See the module docstring."""
    found = _candidates(blocks)
    if not found:
        return ExpertsInstall()
    rels = sorted({p.split(".", 1)[1] for p in found})
    refusals = {p: why for p, m in found.items() if (why := usual_structure_refusal(m))}
    if refusals:
        path, why = next(iter(refusals.items()))
        rel = path.split(".", 1)[1]
        log.info("transformers experts left as they are (%d module(s)): %s", len(refusals), why)
        return ExpertsInstall(swap_pattern=f"{prefix}.*.{rel}", refusal=f"{prefix}.{path}: {why}")
    for path, mod in found.items():
        mod.__class__ = kernel_class(type(mod))
        setattr(mod, KERNEL_CHILD, Experts.without_weights())
    pattern = f"{prefix}.*.{rels[0]}.{KERNEL_CHILD}" if len(rels) == 1 else f"{prefix}.*.{KERNEL_CHILD}"
    return ExpertsInstall(installed=sorted(found, key=lambda p: int(p.split(".")[0])), swap_pattern=pattern)
