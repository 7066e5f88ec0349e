"""The JAX bridge: turn a JAX function into a `torch.library` custom op with autograd.

    @jax_op("tokamax_attention", nondiff=("segment_ids",))
    def attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None,
                  *, scale: float, window: int) -> jax.Array: ...

    out = attention(q, k, v, None, scale=0.125, window=0)   # torch tensors in and out

The signature is the contract, the same one `torch.tpu.pallas.jax_op` reads: positional
parameters annotated `jax.Array` (or `jax.Array | None`) are tensors, keyword-only
parameters annotated int/float/bool/str (optionally `| None`) are static and become part
of the jit cache key. The return annotation is `jax.Array` or `tuple[jax.Array, ...]`.

Each bridged function becomes two custom ops, forward and backward, so that
`torch.compile(fullgraph=True)` and `make_fx` see two opaque nodes instead of Python
they cannot trace. The backward op re-runs the forward under `jax.vjp` (jit-compiled
together): JAX residuals cannot cross the op boundary as tensors, and recomputing is what
flash-style kernels do anyway. Fake (meta) implementations come from `jax.eval_shape`.

Two registrations exist per function, chosen per call by the inputs' device:
- `dlpack` (CPU, CUDA): zero-copy DLPack both ways, `jax.jit` cached by JAX per shapes,
  dtypes and static values. Requires a JAX backend for that device (jax[cuda] on GPUs).
- `tpu`: `torch.tpu.pallas.jax_op` (TorchTPU) registers the same JAX functions; it has
  no autograd of its own, so the same backward op is attached with `register_autograd`.
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

import jax
import torch

# torch and JAX dtypes the bridge passes through. int64 is absent on purpose: JAX runs with
# 32-bit integers unless x64 is enabled, so int64 inputs are narrowed to int32 first.
_TORCH_TO_JAX = {
    torch.float32: jax.numpy.float32,
    torch.float16: jax.numpy.float16,
    torch.bfloat16: jax.numpy.bfloat16,
    torch.float64: jax.numpy.float64,
    torch.int32: jax.numpy.int32,
    torch.int8: jax.numpy.int8,
    torch.uint8: jax.numpy.uint8,
    torch.bool: jax.numpy.bool_,
}
_JAX_TO_TORCH = {jax.numpy.dtype(v): k for k, v in _TORCH_TO_JAX.items()}
_STATIC_SCHEMA = {int: "int", float: "float", bool: "bool", str: "str"}


class BridgeError(RuntimeError):
    """A JAX function the bridge cannot register or call, with the reason."""


@dataclass(frozen=True)
class _Signature:
    tensors: tuple[str, ...]
    optional: frozenset[str]
    statics: tuple[tuple[str, str, Any], ...]  # (name, schema type, Python default or inspect's empty)
    n_out: int
    diff: tuple[int, ...]  # indices into `tensors` that get gradients


def _unwrap_optional(annotation) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _parse_signature(fn: Callable, nondiff: tuple[str, ...]) -> _Signature:
    sig = inspect.signature(fn, eval_str=True)
    tensors, optional, statics = [], set(), []
    for p in sig.parameters.values():
        base, is_opt = _unwrap_optional(p.annotation)
        if p.kind is p.POSITIONAL_OR_KEYWORD and base is jax.Array:
            tensors.append(p.name)
            if is_opt:
                optional.add(p.name)
        elif p.kind is p.KEYWORD_ONLY and base in _STATIC_SCHEMA:
            statics.append((p.name, _STATIC_SCHEMA[base] + ("?" if is_opt else ""), p.default))
        else:
            raise BridgeError(
                f"{fn.__name__}: parameter '{p.name}: {p.annotation}' is neither a positional jax.Array "
                "nor a keyword-only int/float/bool/str"
            )
    ret = sig.return_annotation
    if ret is jax.Array:
        n_out = 1
    elif typing.get_origin(ret) is tuple and all(a is jax.Array for a in typing.get_args(ret)):
        n_out = len(typing.get_args(ret))
    else:
        raise BridgeError(f"{fn.__name__}: return annotation must be jax.Array or tuple[jax.Array, ...], got {ret}")
    unknown = set(nondiff) - set(tensors)
    if unknown:
        raise BridgeError(f"{fn.__name__}: nondiff names {sorted(unknown)} are not tensor parameters")
    diff = tuple(i for i, n in enumerate(tensors) if n not in nondiff)
    bad = [tensors[i] for i in diff if tensors[i] in optional]
    if bad:
        raise BridgeError(f"{fn.__name__}: optional tensors {bad} must be listed in nondiff")
    return _Signature(tuple(tensors), frozenset(optional), tuple(statics), n_out, diff)


def _schema(sig: _Signature, extra_tensors: tuple[str, ...], returns: str) -> str:
    params = [f"Tensor{'?' if n in sig.optional else ''} {n}" for n in sig.tensors]
    params += [f"Tensor {n}" for n in extra_tensors]
    if sig.statics:
        params += ["*"] + [f"{t} {n}{_schema_default(d)}" for n, t, d in sig.statics]
    return f"({', '.join(params)}) -> {returns}"


def _schema_default(value: Any) -> str:
    """`=value` in schema syntax for a Python default (the op is then called like the function), else ''."""
    if value is inspect.Parameter.empty:
        return ""
    if value is None:
        return "=None"
    if isinstance(value, str):
        return f'="{value}"'
    return f"={value!r}"


def _to_jax(t: torch.Tensor | None):
    if t is None:
        return None
    if t.dtype == torch.int64:
        t = t.to(torch.int32)
    if t.dtype not in _TORCH_TO_JAX:
        raise BridgeError(f"the JAX bridge does not pass {t.dtype} tensors")
    try:
        return jax.dlpack.from_dlpack(t.detach().contiguous())
    except Exception as e:  # JAX raises several types here; all mean "no backend for this device"
        raise BridgeError(
            f"JAX cannot take a {t.device.type} tensor ({e}); JAX needs a backend for that device "
            "(CPU: plain jax; CUDA: jax[cuda12]); on TPU use torch_tpu tensors"
        ) from e


def _to_torch(arrays, inputs: list) -> list[torch.Tensor]:
    jax.block_until_ready(arrays)  # DLPack hands over the buffer; it must be written first
    ptrs = {t.data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    out = []
    for a in arrays:
        t = torch.from_dlpack(a)
        # A custom op may not return aliases of its inputs or of each other: JAX hands back
        # the same buffer when a function passes an input through (e.g. d(x + y)/dy = ct).
        if t.data_ptr() in ptrs:
            t = t.clone()
        ptrs.add(t.data_ptr())
        out.append(t)
    return out


def _fake_outputs(fn, sig: _Signature, args, kwargs) -> list[torch.Tensor]:
    device = next(t.device for t in args if isinstance(t, torch.Tensor))
    specs = []
    for t in args:
        if t is None:
            specs.append(None)
            continue
        # Symbolic sizes become their hints: the JAX kernel is compiled per concrete shape anyway.
        shape = tuple(int(s) for s in t.shape)
        dtype = torch.int32 if t.dtype == torch.int64 else t.dtype
        specs.append(jax.ShapeDtypeStruct(shape, _TORCH_TO_JAX[dtype]))
    outs = jax.eval_shape(lambda *a: fn(*a, **kwargs), *specs)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return [torch.empty(o.shape, dtype=_JAX_TO_TORCH[jax.numpy.dtype(o.dtype)], device=device) for o in outs]


def _vjp_function(fn: Callable, sig: _Signature) -> Callable:
    """JAX function (tensors..., cotangents..., **static) -> grads of the differentiable tensors."""
    n_in = len(sig.tensors)

    def backward(*args, **static):
        primals, cts = list(args[:n_in]), args[n_in:]

        def of_diff(*diff_args):
            full = list(primals)
            for i, a in zip(sig.diff, diff_args):
                full[i] = a
            return fn(*full, **static)

        out, pullback = jax.vjp(of_diff, *[primals[i] for i in sig.diff])
        outs = out if sig.n_out > 1 else (out,)
        cts = tuple(c.astype(o.dtype) for c, o in zip(cts, outs))
        return tuple(pullback(cts if sig.n_out > 1 else cts[0]))

    return backward


def _typed_backward(fn: Callable, sig: _Signature) -> Callable:
    """`_vjp_function` with an annotated signature, as `torch.tpu.pallas.jax_op` requires."""
    backward = _vjp_function(fn, sig)
    params = [
        inspect.Parameter(
            n,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=(jax.Array | None) if n in sig.optional else jax.Array,
        )
        for n in sig.tensors
    ]
    params += [
        inspect.Parameter(f"ct{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=jax.Array)
        for i in range(sig.n_out)
    ]
    fwd_params = inspect.signature(fn, eval_str=True).parameters
    params += [fwd_params[n].replace() for n, _, _ in sig.statics]
    backward.__signature__ = inspect.Signature(params, return_annotation=tuple[jax.Array, ...])
    backward.__name__ = f"{fn.__name__}_bwd"
    return backward


class BridgedOp:
    """A JAX function callable with torch tensors; see the module docstring."""

    def __init__(self, name: str, fn: Callable, nondiff: tuple[str, ...] = ()):
        self.name, self.fn = name, fn
        self.sig = _parse_signature(fn, nondiff)
        self._py_sig = inspect.signature(fn, eval_str=True)
        self._ops: dict[str, tuple[Any, Any]] = {}

    def __call__(self, *args, **kwargs):
        bound = self._py_sig.bind(*args, **kwargs)
        bound.apply_defaults()
        tensors = [bound.arguments[n] for n in self.sig.tensors]
        statics = {n: bound.arguments[n] for n, _, _ in self.sig.statics}
        device = next(t.device for t in tensors if t is not None)
        fwd, _ = self.ops("tpu" if device.type == "tpu" else "dlpack")
        return fwd(*tensors, **statics)

    def ops(self, target: str) -> tuple[Any, Any]:
        """(forward, backward) custom ops for `target` ('dlpack' or 'tpu'), built on first use."""
        if target not in self._ops:
            build = {"dlpack": self._build_dlpack, "tpu": self._build_tpu}[target]
            fwd, bwd = build()
            self._attach_autograd(fwd, bwd)
            self._ops[target] = (fwd, bwd)
        return self._ops[target]

    # ---- registrations ------------------------------------------------------------
    def _build_dlpack(self):
        sig, fn = self.sig, self.fn
        static_names = tuple(n for n, _, _ in sig.statics)
        fwd_jit = jax.jit(fn, static_argnames=static_names)
        bwd_fn = _vjp_function(fn, sig)
        bwd_jit = jax.jit(bwd_fn, static_argnames=static_names)
        cts = tuple(f"ct{i}" for i in range(sig.n_out))
        returns = "Tensor" if sig.n_out == 1 else "(" + ", ".join(["Tensor"] * sig.n_out) + ")"

        def fwd_impl(*args, **static):
            out = fwd_jit(*[_to_jax(a) for a in args], **static)
            res = _to_torch(out if sig.n_out > 1 else (out,), list(args))
            return res[0] if sig.n_out == 1 else tuple(res)

        def fwd_fake(*args, **static):
            res = _fake_outputs(fn, sig, args, static)
            return res[0] if sig.n_out == 1 else tuple(res)

        def bwd_impl(*args, **static):
            return _to_torch(bwd_jit(*[_to_jax(a) for a in args], **static), list(args))

        def bwd_fake(*args, **static):
            # Gradients have the shape and dtype of the inputs they belong to.
            return [torch.empty_like(args[i], memory_format=torch.contiguous_format) for i in sig.diff]

        fwd = torch.library.custom_op(
            f"titan::{self.name}", fwd_impl, mutates_args=(), schema=_schema(sig, (), returns)
        )
        fwd.register_fake(fwd_fake)
        bwd = torch.library.custom_op(
            f"titan::{self.name}_bwd", bwd_impl, mutates_args=(), schema=_schema(sig, cts, "Tensor[]")
        )
        bwd.register_fake(bwd_fake)
        return fwd, bwd

    def _build_tpu(self):
        if "torch_tpu" not in sys.modules:
            raise BridgeError(
                f"{self.name}: the TPU registration needs torch_tpu imported (device.type = tpu does it; "
                "install with pip install 'titan-onboard[tpu]')"
            )
        tpu_jax_op = torch.tpu.pallas.jax_op  # present once torch_tpu is imported

        fwd = tpu_jax_op(f"titan_tpu::{self.name}")(self.fn)
        bwd = tpu_jax_op(f"titan_tpu::{self.name}_bwd")(_typed_backward(self.fn, self.sig))
        return fwd, bwd

    def _attach_autograd(self, fwd, bwd) -> None:
        sig = self.sig
        n_in = len(sig.tensors)

        def setup_context(ctx, inputs, output, keyword_only_inputs=None):
            outs = output if sig.n_out > 1 else (output,)
            ctx.save_for_backward(*inputs)
            ctx.static = dict(keyword_only_inputs or {})
            ctx.out_meta = [(o.shape, o.dtype) for o in outs]

        def backward(ctx, *grads):
            saved = ctx.saved_tensors
            device = next(t.device for t in saved if t is not None)
            cts = [
                torch.zeros(shape, dtype=dtype, device=device) if g is None else g.to(dtype).contiguous()
                for g, (shape, dtype) in zip(grads, ctx.out_meta)
            ]
            res = bwd(*saved, *cts, **ctx.static)
            out: list = [None] * n_in
            for i, g in zip(sig.diff, res):
                out[i] = g
            return tuple(out)

        if sig.statics:
            fwd.register_autograd(
                backward,
                setup_context=lambda ctx, inputs, keyword_only_inputs, output: setup_context(
                    ctx, inputs, output, keyword_only_inputs
                ),
            )
        else:
            fwd.register_autograd(
                backward, setup_context=lambda ctx, inputs, output: setup_context(ctx, inputs, output)
            )


def jax_op(name: str, *, nondiff: tuple[str, ...] = ()) -> Callable[[Callable], BridgedOp]:
    """Decorator: a JAX function -> a `BridgedOp` callable with torch tensors (see module docstring).

    `name` becomes `titan::<name>` (and `titan_tpu::<name>` on TPU); `nondiff` names tensor
    parameters that get no gradient (integer ids, masks).
    """

    def deco(fn: Callable) -> BridgedOp:
        return BridgedOp(name, fn, tuple(nondiff))

    return deco
