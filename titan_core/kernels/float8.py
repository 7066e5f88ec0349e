"""kernels.float8: the model's linear layers trained in float8 through torchao, one swap per recipe.

    kernels.float8 = none | tensorwise | rowwise      swaps `float8.tensorwise`, `float8.rowwise`

Each eligible `nn.Linear` becomes torchao's `Float8Linear` (`float8_linear.Float8TrainingLinear`,
the same parameters under the same names, so checkpoints, exports and init are unchanged): its
input and weight are scaled into float8 e4m3 (and the output gradient into e5m2 for tensorwise,
e4m3 for rowwise) for each of the three matmuls of a linear's forward and backward. tensorwise: one
scale per tensor; rowwise: one per row, rounded down to a power of two (torchao's recipes).

**Where it runs.** The matmuls are chosen when the weights are materialised (`to_empty`, `.to`):
    CUDA    torch._scaled_mm, which needs compute capability 8.9 or newer (Ada, Hopper, Blackwell);
            an older GPU is refused (KernelUnavailable). rowwise's fast kernel is CUTLASS's SM90 one;
            neither recipe has run on a GPU here. ROCm: left to torch's own check.
    CPU     torchao's emulation: the same float8 rounding and scales, the matmul in fp32. The
            numerics of the real path, for testing; slower than the plain linear, never faster.
    other   (tpu, ...) refused (KernelUnavailable): torchao's float8 training has no path there.
torchao is the [float8] extra, imported (1-2 s) only when `float8_swap` first registers a recipe's
swap, as `swaps_for` does for kernels.float8; without it that call raises KernelUnavailable.

**Which linears** (`skip_reason`, logged per module by `apply_swaps` and listed by
`titan_core.models.common.swaps.swap_selection`): every `nn.Linear` except the output head (`output`,
`lm_head`, or the module holding the model's `output_weight`: logits are the most
precision-sensitive matmul, and the loss head reads that weight with F.linear, so a swap there would
change nothing), the MoE router (a path part
containing `router`, or a linear from `dim` to `n_experts` of an MoE model, whatever its name: a
rounding that flips a top-k choice changes which experts run), and a linear whose in or out
features are not multiples of 16 (torch._scaled_mm's shape rule). A model's own subclass of
nn.Linear is skipped as its own. A model with no eligible linear is refused (SwapNotApplicable,
exit 2) with the reasons. torchao's own filter also skips small linears where float8 is slower on
an H100; that is a speed choice, left to tuning.

**Numerics: the bound** (`FLOAT8_OUTPUT_REL_L2`, `FLOAT8_GRAD_REL_L2`; rel_l2 of
titan_core.measure.numerics). e4m3 keeps 3 mantissa bits: a value rounded to nearest is off by at
most u = 2^-4 relative, and at the bottom of a binade (the worst place) the error is uniform on
[-u, u], RMS u/sqrt(3) = 0.0361. A linear's output sums products of two independently rounded
operands, so on fresh random inputs its relative L2 error is sqrt(2) x that RMS at most:
sqrt(2/3) u = 0.0510; a bf16 output rounding (RMS <= 2^-8/sqrt(3), counted twice against a bf16
reference) adds under 0.005: bound 0.06 for the output of both recipes. The gradients of
tensorwise round the output gradient to e5m2 (2 mantissa bits, u = 2^-3): sqrt((2^-6 + 2^-8)/3)
= 0.0807, plus the bf16 margin: 0.09; rowwise rounds it to e4m3: 0.06. Measured on CPU emulation
(256 -> 128 linear, 64 Gaussian rows, 5 seeds; fp32 and bf16; against fp64 and the bf16 linear):
output 0.037-0.038 both recipes (values spread over a binade: RMS ~0.026 an operand); input and
weight gradients tensorwise 0.059-0.060, rowwise 0.038-0.039. A tiny model trained 10 steps lands within
`FLOAT8_LOSS_REL` of the same bf16 run's final loss (measured, see the constant).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from torch import nn

from titan_core.config.loader import ConfigError
from titan_core.models.common.swaps import register_swap, registered_swaps
from titan_core.models.common.mapping_errors import KernelUnavailable

if TYPE_CHECKING:
    from titan_core.models.common.protocol import TrainableModel

FLOAT8_RECIPES = ("tensorwise", "rowwise")
"""The kernels.float8 values other than none; each is the swap `float8.<recipe>`."""

E4M3_UNIT_ROUNDOFF = 2.0**-4
"""Largest relative rounding error of float8 e4m3 (3 mantissa bits), round to nearest."""
E5M2_UNIT_ROUNDOFF = 2.0**-3
"""Largest relative rounding error of float8 e5m2 (2 mantissa bits)."""
_BF16_MARGIN = 0.005
"""A bf16 output rounding against a bf16 reference: 2 x 2^-8/sqrt(3) = 0.0045."""




def _rms(u: float) -> float:
    """RMS relative rounding error at the bottom of a binade, where it is uniform on [-u, u]."""
    return u / math.sqrt(3)


def _bound(rounding: float) -> float:
    return math.ceil(100 * (rounding + _BF16_MARGIN)) / 100


_TWO_E4M3 = math.sqrt(2) * _rms(E4M3_UNIT_ROUNDOFF)  # 0.0510: both operands e4m3
_E5M2_E4M3 = math.hypot(_rms(E5M2_UNIT_ROUNDOFF), _rms(E4M3_UNIT_ROUNDOFF))  # 0.0807: gradient e5m2, other e4m3

FLOAT8_OUTPUT_REL_L2 = {"tensorwise": _bound(_TWO_E4M3), "rowwise": _bound(_TWO_E4M3)}
"""{recipe: relative L2 bound of a float8 linear's output against nn.Linear on the same fresh
random inputs} (0.06 each; derived in the module docstring). The one place the tests and any
later comparison of the swap read it."""
FLOAT8_GRAD_REL_L2 = {"tensorwise": _bound(_E5M2_E4M3), "rowwise": _bound(_TWO_E4M3)}
"""{recipe: relative L2 bound of a float8 linear's input and weight gradients against nn.Linear's}
(tensorwise 0.09: its output gradient is e5m2; rowwise 0.06)."""
FLOAT8_LOSS_REL = 0.02
"""Final loss of a tiny model trained 10 steps with kernels.float8 against the same bf16 run
without it: |float8 - bf16| / bf16. Measured on CPU emulation (llama3, 2 layers, dim 64, vocab
256, bf16 parameters, lr 3e-3, one batch repeated so the loss falls 5.57 -> 4.0; seeds 0-11):
worst 0.0041 tensorwise, 0.0022 rowwise, 0.0045 over whole curves. 0.02 is 5x that, the size of
the bf16 loss-curve bound. Empirical: a trajectory has no closed-form error budget, and at lr
1e-2 the same runs drift apart (final loss up to 0.09 apart) although both converge."""

SHAPE_MULTIPLE = 16
"""torch._scaled_mm needs both dimensions of a float8 matmul's weight to be multiples of this."""
HEAD_NAMES = ("output", "lm_head")
"""Leaf names of the output head (native decoder, transformers)."""


def skip_reason(module: nn.Linear, path: str, model: TrainableModel) -> str | None:
    """Why the float8 swaps leave the linear at `path` alone, or None to convert it."""
    parts = path.split(".")
    n, k = module.out_features, module.in_features
    has_head = getattr(type(model), "output_weight", None) is not None  # a property of the decoders; flux has none
    if parts[0] == "loss_head" or parts[-1] in HEAD_NAMES or (has_head and module.weight is model.output_weight):
        return "output head: its logits are the most precision-sensitive matmul, kept in the training dtype"
    experts = model.args.n_experts
    # the transformers path names its routers otherwise (Mixtral's, Qwen-MoE's): their shape tells them
    if any("router" in p for p in parts) or (experts and (k, n) == (model.args.dim, experts)):
        return "MoE router: a float8 rounding that flips a top-k choice changes which experts run"
    if n % SHAPE_MULTIPLE or k % SHAPE_MULTIPLE:
        return f"weight {n}x{k}: dims not multiples of {SHAPE_MULTIPLE} (torch._scaled_mm's shape rule)"
    return None


def float8_swap(recipe: str) -> str:
    """Register (once) and name the swap of `recipe` (`float8.<recipe>`); imports torchao."""
    if recipe not in FLOAT8_RECIPES:
        raise ConfigError(f"kernels.float8 must be none or one of {', '.join(FLOAT8_RECIPES)}, got {recipe!r}")
    name = f"float8.{recipe}"
    if name in registered_swaps():
        return name
    try:
        from titan_core.kernels.float8_linear import Float8TrainingLinear  # lazy: the [float8] extra (torchao)
    except ImportError as e:
        raise KernelUnavailable(
            f"kernels.float8={recipe} needs torchao ({e}): pip install 'titan-onboard[float8]'"
        ) from e
    register_swap(
        name,
        "*",  # every module; `replaces` narrows to nn.Linear and `skip_reason` filters those
        f"torchao float8 training, {recipe} scaling, of the eligible linear layers",
        replaces=nn.Linear,
        produces=Float8TrainingLinear,
        select=skip_reason,
    )(lambda old, path: Float8TrainingLinear.from_linear(old, recipe))
    return name
