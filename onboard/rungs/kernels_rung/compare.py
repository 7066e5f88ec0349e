"""Kernel against plain path: which kernels apply to a model (`applicable_kernels`), whether one
computes what the plain path computes (`compare_kernel`: loss, logits, every gradient), the peak
memory of one step with it (`step_peak`), and a bare model's forward + backward with it timed
against another choice (`measure_kernel`; the kernels rung times its keep decisions on the recipe's
whole training steps instead, onboard/rungs/kernels_rung/steps.py).

Each flag is compared with the plain path of its field (REFERENCE): the model built twice from the
same weights, once with the kernel's swap and once with the reference's. Errors are
titan_core.measure.numerics' relative L2; timings go through titan_core.measure.timing. The float8
flags (PRECISION_FIELDS) change the precision: `applicable_kernels` says where they run, and the
rung judges them by their own bound against bf16 (onboard/rungs/kernels_rung/float8_check.py), not here.
"""

from __future__ import annotations

import importlib.util
import re
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from titan_core.config.loader import ConfigError
from titan_core.config.sections import Kernels
from titan_core.models.common.swaps import apply_swaps, registered_swaps, swap_applicability
from titan_core.kernels.moe import grouped_mm_unsupported
from titan_core.models.common.mapping_errors import KernelUnavailable
from titan_core.kernels.swaps import DEFAULTS, swaps_for
from titan_core.data.base import Batch
from titan_core.measure.numerics import grad_noise, grad_rel_l2, rel_l2, rounding_check, worst_unexcused
from titan_core.measure.timing import Comparison, TimingProtocol, compare, timed
from titan_core.memory.tensor_peak import TensorPeak
from titan_core.models.common.args import ModelArgs
from titan_core.models.registry import build_meta
from titan_core.runtime import devices

from onboard.ladder.gates import comparison_line
from onboard.upstream.hf_model import perturb_constants

#: The plain path each kernel is compared with (float8's "none": the bf16 linears; a precision
#: change, judged by its own bound instead of the fp32 comparison, onboard/rungs/kernels_rung/float8_check.py).
REFERENCE = {"loss": "plain", "attention": "naive", "moe": "loop", "float8": "none"}
#: Every kernel flag, in the order they are reported: within a field, simplest first.
KERNEL_FLAGS = (
    "kernels.loss=fused_ce",
    "kernels.attention=sdpa",
    "kernels.attention=tokamax",
    "kernels.attention=flex",
    "kernels.attention=splash",
    "kernels.moe=dense",
    "kernels.moe=grouped_mm",
    "kernels.moe=tokamax",
    "kernels.float8=tensorwise",
    "kernels.float8=rowwise",
)
#: The fields whose values change the precision rather than compute the same thing: their rows are
#: judged against the bf16 recipe by their own bound (kernels_float8), never by the fp32 comparison.
PRECISION_FIELDS = ("float8",)


def parse_flag(flag: str) -> tuple[str, str]:
    """'kernels.moe=grouped_mm' -> ('moe', 'grouped_mm'), checked against the Kernels section."""
    m = re.fullmatch(r"kernels\.(\w+)=(\w+)", flag)
    if not m or m.group(1) not in REFERENCE:
        raise ConfigError(f"not a kernel flag: '{flag}' (expected kernels.<loss|attention|moe|float8>=<choice>)")
    field_name, choice = m.groups()
    allowed = typing.get_args(typing.get_type_hints(Kernels)[field_name])
    if choice not in allowed:
        raise ConfigError(f"'{choice}' is not a choice of kernels.{field_name} (one of {', '.join(allowed)})")
    return field_name, choice


def _jax_unavailable(device_type: str) -> str | None:
    """Why JAX kernels cannot run on `device`, or None."""
    if not all(importlib.util.find_spec(m) is not None for m in ("jax", "tokamax")):
        return "needs jax and tokamax: pip install 'titan-onboard[jax]'"
    if device_type == "cuda":
        import jax  # lazy: the [jax] extra, imported only to ask it for a CUDA backend

        try:
            jax.devices("cuda")
        except RuntimeError:
            return "jax has no CUDA backend here, so it cannot take CUDA tensors: pip install 'jax[cuda12]'"
    return None


def _has_torchao() -> bool:
    return importlib.util.find_spec("torchao") is not None


def _float8_unavailable(device: torch.device | str, recipe: str) -> str | None:
    """Why kernels.float8=`recipe` cannot train on `device` (torchao missing, a device without float8
    matmuls: titan_core.kernels.float8_linear.emulate_on's rule), or None (CPU: torchao's emulation)."""
    if not _has_torchao():
        return f"kernels.float8={recipe} needs torchao: pip install 'titan-onboard[float8]'"
    device_type = device.split(":")[0] if isinstance(device, str) else device.type
    if device_type not in ("cpu", "cuda"):  # a string such as "tpu" parses only once its backend is loaded
        return (f"kernels.float8={recipe} is not available on {device_type}: torchao's float8 training runs "
                f"torch._scaled_mm on CUDA (compute capability 8.9+) or emulates it on CPU")  # fmt: skip
    if device_type == "cpu":
        return None
    from titan_core.kernels.float8_linear import emulate_on  # lazy: imports torchao (1-2 s)

    try:
        emulate_on(torch.device(device), recipe)
    except KernelUnavailable as e:
        return " ".join(str(e).split())
    return None


def applicable_kernels(
    args: ModelArgs,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    captured: bool = False,
    model: nn.Module | None = None,
) -> dict[str, str | None]:
    """{kernel flag: None if it applies to this model on this device, else the reason it does not}.

    `captured`: the recipe runs the step under torch.compile or the Graph Trainer.
    `model`: the model as built (a meta-device model is enough; nothing is replaced) when
    it is not the family's own class, e.g. one built from a ported model.py. A flag whose
    swaps, on either side of its comparison, meet a module of a class they do not replace
    (the model's own attention core, experts or loss head) does not apply, with the path
    and class as the reason; so does one whose swaps match no module of the model.
    """
    # A string is read without torch.device(): "tpu" only parses once torch_tpu is loaded.
    device_type = device.split(":")[0] if isinstance(device, str) else device.type
    is_moe = args.n_experts > 0
    no_jax = _jax_unavailable(device_type)
    dense = "dense model: no MoE layers to run experts for"
    kind = args.kind
    out: dict[str, str | None] = {
        "kernels.loss=fused_ce": f"a {kind.name} model's loss has no cross-entropy head for fused_ce to replace"
        if not kind.loss_head
        else None,
        "kernels.attention=sdpa": None,
        "kernels.attention=tokamax": no_jax,
        "kernels.attention=flex": {
            "cpu": "FlexAttention has no backward on CPU (torch 2.13), so it cannot train here",
            "tpu": "FlexAttention is not verified on TorchTPU; attention=splash is the TPU kernel",
        }.get(device_type),
        "kernels.attention=splash": f"splash is a TPU kernel; device is {device_type}"
        if device_type != "tpu"
        else f"splash masks causally always and a {kind.name} model's attention is bidirectional"
        if not kind.causal
        else None,
        "kernels.moe=dense": dense if not is_moe else None,
        "kernels.moe=grouped_mm": dense
        if not is_moe
        else grouped_mm_unsupported(device_type, dtype, args.dim, args.moe_hidden_dim, captured=captured),
        "kernels.moe=tokamax": dense if not is_moe else no_jax,
        "kernels.float8=tensorwise": _float8_unavailable(device, "tensorwise"),
        "kernels.float8=rowwise": _float8_unavailable(device, "rowwise"),
    }
    if model is not None:
        for flag in KERNEL_FLAGS:
            if flag.startswith("kernels.float8=") and not _has_torchao():
                continue  # its swap cannot even be registered to ask the model; out[flag] says so
            why = _model_refuses(model, flag)
            # the model's own module is the reason that holds on every device; a swap that
            # matches nothing only fills in where nothing else was said (a dense model's MoE)
            if why is not None and (out[flag] is None or not why.startswith("no module")):
                out[flag] = why
    return {flag: out[flag] for flag in KERNEL_FLAGS}


def _model_refuses(model: nn.Module, flag: str) -> str | None:
    """Why the swaps of `flag`'s comparison (kernel side, then plain side) cannot build from `model`."""
    field_name, choice = parse_flag(flag)
    names = _field_swaps(field_name, choice) + _field_swaps(field_name, REFERENCE[field_name])
    for name, why in swap_applicability(model, list(dict.fromkeys(names))).items():
        if why is not None:
            return f"{why} (swap '{name}')" if why.startswith("no module") else why
    return None


def _field_swaps(field_name: str, choice: str) -> list[str]:
    """The swaps `build_model_with` applies for `field_name` = `choice` on a section that is otherwise default."""
    return _swap_names(kernels_for(field_name, choice, None), field_name)


def _swap_names(kernels: Kernels, field_name: str | None = None) -> list[str]:
    """`swaps_for(kernels)`, plus the swap of `field_name`'s built-in choice (attention.sdpa) when it
    has one: a comparison then runs the module it names, not whatever the builder put there."""
    names = swaps_for(kernels)
    if field_name is not None and getattr(kernels, field_name) == DEFAULTS[field_name]:
        explicit = f"{field_name}.{DEFAULTS[field_name]}"
        if explicit in registered_swaps() and explicit not in names:
            names.append(explicit)
    return names


def build_model_with(
    family: str, args: ModelArgs, kernels: Kernels, device, dtype, *, state=None, build_meta_model=None,
    field_name: str | None = None,
) -> nn.Module:  # fmt: skip
    """The model with `kernels`' swaps, initialised (seed 0) on `device` in `dtype`, or loaded
    from `state`. `build_meta_model`: a meta-device builder instead of the family's class (a
    ported model.py); its own modules are refused (`SwapNotApplicable`), never replaced.
    `field_name`: the field a comparison is about; its built-in choice (attention=sdpa) is then
    swapped in explicitly, so that side runs the module it names."""
    model = build_meta_model() if build_meta_model is not None else build_meta(family, args)
    apply_swaps(model, _swap_names(kernels, field_name))
    model.to_empty(device=device)
    model.init_weights(seed=0)  # also fills the non-persistent buffers (RoPE frequencies)
    if state is None and args.kind.zero_output_at_init:
        # (flux's adaLN-Zero) zero modulation gates and output make every block the identity and the
        # output 0 whatever the attention computes, so a kernel compared there would agree vacuously;
        # parity's draw of the constant tensors makes every path live
        perturb_constants(model, seed=0)
    if state is not None:
        model.load_state_dict(state, strict=True)  # also proves the swap kept the state dict
    return model.to(dtype)


def kernels_for(field_name: str, choice: str, base: Kernels | None) -> Kernels:
    """`base` (default: the default section) with `field_name` set to `choice`."""
    kw = {} if base is None else asdict(base)
    kw[field_name] = choice
    return Kernels(**kw)


def make_batch(args: ModelArgs, *, batch: int, seq_len: int, seed: int, device, packed: bool = True) -> Batch:
    """Random tokens, labels with a few ignored positions and, when packed, two documents per row;
    for a model that makes its own samples (`args.own_samples`: flux's flow samples) those, at the
    model's own sample size when it has one."""
    own = args.own_samples(seed=seed, batch_size=batch, seq_len=args.sample_spec().seq_len or seq_len,
                           repeat_batch=True)  # fmt: skip
    if own is not None:
        return own.batch_at(0).to(device)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, args.vocab_size, (batch, seq_len + 1), generator=gen)
    inputs, labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    labels[:, :2] = -100
    segment_ids = None
    if packed:
        cut = torch.randint(1, seq_len, (batch, 1), generator=gen)
        segment_ids = (torch.arange(seq_len)[None, :] >= cut).long()
    return Batch(inputs, labels, segment_ids=segment_ids).to(device)


def forward(model: nn.Module, b: Batch) -> torch.Tensor:
    """The model's output on a batch: a language model's logits, a flow model's predicted velocity
    (at the clean latents: the output, not the loss, is what is compared). The inputs `forward`
    takes are those its args' sample spec names (titan_core/models/common/kind.py)."""
    spec = model.args.sample_spec()
    kw = {k: b.inputs[k] for k in spec.forward_inputs}
    if spec.packed:
        kw["segment_ids"] = b.segment_ids
    return model(b.tokens, **kw)


@dataclass
class KernelComparison:
    """The model with one kernel vs the model with the plain path, same weights and batch."""

    flag: str
    reference: str
    loss: float
    loss_reference: float
    loss_rel_err: float
    logits_rel_err: float
    grad_rel_err: dict[str, float] = field(default_factory=dict)
    """Per parameter: relative L2 error of the kernel's gradient against the plain path's, both fp32."""
    rounding: dict[str, dict[str, float | bool]] = field(default_factory=dict)
    """Per parameter over the gradient tolerance, numerics.rounding_check of the kernel's gradient
    (candidate) against the plain path's (reference), both measured against the plain path in fp64."""
    rounding_factor: float = 0.0
    """A gradient over the tolerance is fp32 rounding when candidate_vs_fp64 <= this x reference_vs_fp64."""
    rounding_error: str | None = None
    """Why the fp64 check could not run (then nothing is excused)."""

    @property
    def excused(self) -> list[str]:
        """Parameters whose fp32 gradient error the fp64 check shows to be rounding: the kernel's
        gradient is as close to fp64 as the plain path's own, up to `rounding_factor`."""
        return [n for n, r in self.rounding.items() if r["rounding"]]

    @property
    def max_grad_rel_err(self) -> float:
        """The worst gradient error the gate judges: over the parameters not excused as rounding."""
        return worst_unexcused(self.grad_rel_err, self.rounding)[1]

    @property
    def max_grad_rel_err_raw(self) -> float:
        """The worst gradient error over every parameter, excused or not."""
        return max(self.grad_rel_err.values(), default=0.0)

    @property
    def worst_param(self) -> str:
        worst = worst_unexcused(self.grad_rel_err, self.rounding)[0]
        return worst or max(self.grad_rel_err, key=self.grad_rel_err.get, default="")

    def to_dict(self) -> dict:
        return {**asdict(self), "max_grad_rel_err": self.max_grad_rel_err, "worst_param": self.worst_param,
                "max_grad_rel_err_raw": self.max_grad_rel_err_raw, "excused": self.excused}  # fmt: skip


def compare_kernel(
    family: str,
    args: ModelArgs,
    flag: str,
    *,
    batch: int = 2,
    seq_len: int = 64,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    packed: bool = True,
    base: Kernels | None = None,
    build_meta_model: Callable[[], nn.Module] | None = None,
    grad_tolerance: float | None = None,
    rounding_factor: float = 2.0,
) -> KernelComparison:
    """Loss, logits and every parameter's gradient with `flag` vs with its plain path.

    `grad_tolerance`: where an fp32 gradient's error is over it, the plain path runs once more in
    fp64 and both sides' gradients are measured against that (`fp64_check`): in a model whose fp32
    rounding is itself above the tolerance (attention scores unscaled, a parameter whose gradient
    is a sum that cancels), a kernel as close to fp64 as the plain path is not wrong.

    `base` carries the other kernel settings (ce_chunk, z_loss, the other fields) of the
    recipe; only the flag's own field differs between the two models.
    `build_meta_model`: builds the model on the meta device instead of the family's class
    (a ported model.py); called once per model, so it must return a fresh module each time.
    A module of the model's own class where a swap of the comparison goes (a custom
    attention core, say) raises `SwapNotApplicable` instead of being replaced;
    `applicable_kernels(..., model=)` says so beforehand.
    """
    field_name, choice = parse_flag(flag)
    ref = build_model_with(
        family, args, kernels_for(field_name, REFERENCE[field_name], base), device, dtype,
        build_meta_model=build_meta_model, field_name=field_name,
    )  # fmt: skip
    ker = build_model_with(
        family, args, kernels_for(field_name, choice, base), device, dtype, state=ref.state_dict(),
        build_meta_model=build_meta_model, field_name=field_name,
    )  # fmt: skip
    b = make_batch(args, batch=batch, seq_len=seq_len, seed=seed, device=device, packed=packed)
    labels = b.labels

    def run(model):
        loss, _ = model.loss(b.tokens, b.labels, **b.loss_kwargs())
        # the trainable parameters: a frozen one (AFMoE's router bias) has no gradient to compare
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, [p for _, p in trained], allow_unused=True)
        with torch.no_grad():
            logits = forward(model, b)
        return loss.detach(), logits, dict(zip([n for n, _ in trained], grads))

    loss_r, logits_r, grads_r = run(ref)
    loss_k, logits_k, grads_k = run(ker)
    noise = grad_noise(grads_r.values(), labels.numel())
    grad_err = {n: grad_rel_l2(grads_k[n], grads_r[n], noise) for n in grads_r}
    over = [n for n, e in grad_err.items() if grad_tolerance is not None and not e <= grad_tolerance]
    rounding, rounding_error = {}, None
    if over and dtype == torch.float32:
        try:
            exact = run(ref.to(torch.float64))[2]
            rounding = {n: rounding_check(grads_k[n], grads_r[n], exact[n], rounding_factor) for n in over}
        except Exception as e:  # noqa: BLE001 -- no fp64 on this device: nothing is excused, and the row says why
            rounding_error = f"{type(e).__name__}: {e}"
    return KernelComparison(
        flag=flag,
        reference=f"kernels.{field_name}={REFERENCE[field_name]}",
        loss=loss_k.item(),
        loss_reference=loss_r.item(),
        loss_rel_err=rel_l2(loss_k, loss_r),
        logits_rel_err=rel_l2(logits_k, logits_r),
        # a gradient both sides compute at the reference's fp32 rounding level is zero in exact
        # arithmetic (BART's key bias: softmax cancels it), and agrees: the parity rule
        grad_rel_err=grad_err,
        rounding=rounding,
        rounding_factor=rounding_factor,
        rounding_error=rounding_error,
    )


def _step_peak(model, b: Batch, device: torch.device) -> int:
    """Peak memory of one forward + backward: the allocator's on accelerators, counted tensors on CPU."""
    if device.type == "cpu":
        with TensorPeak() as peak:
            loss, _ = model.loss(b.tokens, b.labels, **b.loss_kwargs())
            loss.backward()
        return peak.peak_bytes
    devices.reset_peak_memory(device)
    loss, _ = model.loss(b.tokens, b.labels, **b.loss_kwargs())
    loss.backward()
    devices.synchronize(device)
    return devices.peak_memory_bytes(device)


#: choices whose work runs in JAX: their buffers live in JAX's allocator, which torch cannot see
JAX_BACKED = {"tokamax", "splash"}


def jax_backed(kernels: Kernels) -> list[str]:
    """The "field=choice" of `kernels` that run in JAX (an empty list: torch sees every buffer)."""
    return [f"{f}={getattr(kernels, f)}" for f in ("attention", "moe") if getattr(kernels, f) in JAX_BACKED]


def step_peak(
    family: str, args: ModelArgs, field_name: str, choice: str, *, batch: int = 2, seq_len: int = 64,
    device: torch.device | str = "cpu", base: Kernels | None = None, packed: bool = True,
    build_meta_model: Callable[[], nn.Module] | None = None,
) -> tuple[int | None, str | None]:  # fmt: skip
    """(peak bytes, None) of one fp32 forward + backward of the model with kernels.<field_name> =
    `choice` (the rest of `base` kept), measured as `_step_peak` measures it, so two choices
    measured here are measured alike; (None, why) when the model runs a JAX-backed kernel in any
    field: JAX allocates outside torch, so a torch peak would look smaller than the step's."""
    kernels = kernels_for(field_name, choice, base)
    jax = jax_backed(kernels)
    if jax:
        return None, f"{', '.join(jax)} allocates in JAX, outside torch: its peak cannot be seen"
    device = torch.device(device)
    model = build_model_with(family, args, kernels, device, torch.float32, build_meta_model=build_meta_model,
                             field_name=field_name)  # fmt: skip
    b = make_batch(args, batch=batch, seq_len=seq_len, seed=0, device=device, packed=packed)
    return _step_peak(model, b, device), None


def measure_kernel(
    family: str,
    args: ModelArgs,
    flag: str,
    *,
    against: str | None = None,
    batch: int = 2,
    seq_len: int = 64,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    base: Kernels | None = None,
    build_meta_model: Callable[[], nn.Module] | None = None,
    protocol: TimingProtocol | None = None,
) -> dict:
    """One training step (forward + backward) with the kernel against `against` (default: the
    field's plain path), timed by the protocol, and the peak memory of each.

    Both models are built first; their steps then run interleaved (titan_core.measure.timing), so
    the machine's load falls on both alike. `timing` is the protocol's `Comparison` (ratio
    = kernel time / other time, its interval, `faster` / `slower` / `indistinguishable`).
    Peak memory: the device allocator's peak on accelerators; on CPU the most tensor bytes
    alive at once during one more, untimed step (`TensorPeak`: the resident set cannot see a
    step's tensors once malloc reuses pages). None for a JAX-backed kernel (tokamax, splash):
    JAX allocates outside torch, so its peak would look smaller than it is; `peak_memory_note` says so.
    `build_meta_model`: as in `compare_kernel` (a ported model.py builds the model).
    """
    device = torch.device(device)
    field_name, choice = parse_flag(flag)
    other = against or REFERENCE[field_name]
    parse_flag(f"kernels.{field_name}={other}")
    b = make_batch(args, batch=batch, seq_len=seq_len, seed=0, device=device)
    models = {
        pick: build_model_with(
            family,
            args,
            kernels_for(field_name, pick, base),
            device,
            dtype,
            build_meta_model=build_meta_model,
            field_name=field_name,
        )  # fmt: skip
        for pick in (choice, other)
    }

    def step(model):
        def run():
            model.zero_grad(set_to_none=True)
            loss, _ = model.loss(b.tokens, b.labels, **b.loss_kwargs())
            loss.backward()

        return timed(run, sync=lambda: devices.synchronize(device))

    timing: Comparison = compare(step(models[choice]), step(models[other]), protocol)
    out = {"flag": flag, "reference": f"kernels.{field_name}={other}", "timing": timing.to_dict()}
    for name, pick, median in (("with_kernel", choice, timing.candidate_median_s),
                               ("with_reference", other, timing.baseline_median_s)):  # fmt: skip
        side = {"step_time_s": median, "peak_memory_bytes": None}
        if pick in JAX_BACKED:
            side["peak_memory_note"] = "JAX allocates this kernel's buffers outside torch: not measured"
        else:
            models[pick].zero_grad(set_to_none=True)
            side["peak_memory_bytes"] = _step_peak(models[pick], b, device)
        out[name] = side
    out["describe"] = comparison_line(timing, flag, out["reference"])
    return out
