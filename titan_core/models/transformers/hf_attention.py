"""titan_core's attention kernels as transformers attention implementations (`AttentionInterface`).

A transformers attention module computes q, k, v, applies RoPE, then calls
`ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module, q, k, v, mask, scaling=,
dropout=, sliding_window=, softcap=, **kwargs)` and expects `(out [b, s, heads, d], weights)`.
`register_hf_attention()` registers, under names transformers accepts as `attn_implementation`:

    titan          the kernel the attention module holds as `module.core` (the transformers path
                   of titan_core puts a swappable core there, so `kernels.attention` selects it)
    titan_<name>   one fixed kernel: sdpa, naive, and flex, tokamax, splash once titan_core.kernels
                   is imported (for plain transformers use)

Each call is translated to the core contract (titan_core/models/common/attention.py):
`scaling` -> scale, `sliding_window` -> window (both keep keys with q - k < window),
`segment_ids` (a keyword the caller passes down the model's forward) -> packed documents,
`softcap` -> softcap (the naive reference and flex cap scores; sdpa, tokamax and splash refuse),
`s_aux` / `sinks` -> attention sinks, `position_bias` -> an additive score bias (the naive
reference only; the others refuse), and so is a mask the module makes of its own (`makes_own_mask`)
and the keys a sparse-attention indexer chose (`indices`, DeepSeek-V3.2's kin).
What a kernel cannot honour is refused with the reason (KernelRefusesModel), never dropped:
an attention-score soft-cap, sinks or a score bias it cannot apply, dropout while training, a
non-causal module, keys that are not one per query position with no mask of the module's own
over them (DeepSeek-V4 masks its compressed entries itself: the naive core runs that mask alone),
a sparse selection it does not read (`block_indices`). The padding mask transformers builds is not read: the
kernels mask causally (and by window and document) themselves, and titan_core's data marks
untrained tokens in the labels, not with padding masks. No mask is built for these names
either (they are not in transformers' mask interface, so it skips mask creation), but for
`titan_masked`: the layers of a model that compute attention inline read transformers' masks.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from typing import Callable

import torch
from torch import nn

from titan_core.models.common.attention import NaiveAttention, SDPAttention
from titan_core.models.common.mapping_errors import KernelRefusesModel, KernelUnavailable
from titan_core.models.common.swaps import registered_swaps

# The models layer sits below kernels, so the kernels' cores are found through the swap registry
# (titan_core.kernels registers `attention.<name>` on import), not imported from there.
OWN_CORES: dict[str, type[nn.Module]] = {"sdpa": SDPAttention, "naive": NaiveAttention}
"""The library's own cores, there without titan_core.kernels."""
MODULE_CORE = "titan"
"""The implementation that calls the attention module's own `core` (the transformers path)."""
MASKED_CORE = "titan_masked"
"""`titan` for a model that also computes attention inline in some layers (BLOOM, MPT, a hybrid's
older blocks): the same cores, and transformers builds its eager (additive) masks for those layers."""
NAIVE_ONLY = {"s_aux": "sinks", "sinks": "sinks", "position_bias": "bias"}
"""Keywords transformers passes that change what attention computes, which only the naive reference
implements -> its own keyword: attention sinks (GPT-OSS `s_aux`), an additive position bias (Inkling)."""
SELECTED_KEYS = "indices"
"""The keyword a sparse-attention layer (DeepSeek-V3.2, GLM-MoE-DSA, Dots3 and their kin) hands the
keys its indexer chose for each query in ([b, s, k]) where the implementation is not eager or sdpa
(a sparse kernel reads them; the eager path folds them into the mask instead): `titan` adds them
as a score bias (`selected_keys_bias`), which the naive core applies and the others refuse."""
SELECTED_BLOCKS = ("block_indices",)
"""Sparse selections by key block (MiniMax-M3's indexer), which no core reads: refused (`call_core`), never dropped."""


OWN_MASK = re.compile(r"(?<!\w)attention_mask=(?!(?:attention_mask|causal_mask|None|\w*encoder\w*|\w*cross\w*)\b)\w+")
"""An interface call handed a mask other than the one the module was given (Doge's
`attention_mask=attn_mask`, made from its own parameters); cross-attention's masks do not count
(a causal LM does not run it)."""


@functools.lru_cache(maxsize=None)
def forward_source(cls: type) -> str:
    """The source of `cls.forward`, read once per class; "" where there is none (a C or dynamically
    made class: not one of transformers')."""
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return ""


REBOUND_MASK = re.compile(r"^\s*attention_mask = (?!(?:\w*encoder\w*|None)\b)", re.M)
"""The module's forward binds `attention_mask` anew before the call: the mask it hands on is the
given one narrowed by the model itself (a sparse-attention indexer's selection: DeepSeek-V3.2's
`attention_mask & ~index_mask`, Qwen4-Exp's chosen blocks, GLM-5-Next's top-k mask), which the
kernels' own causal masking would drop. An assignment, not a keyword argument (transformers' files are
formatted: ` = ` binds, `=` passes); an encoder's mask taken for cross-attention does not count."""


def makes_own_mask(cls: type) -> bool:
    """Whether `cls.forward` hands the attention interface a mask of its own making (OWN_MASK,
    REBOUND_MASK)."""
    src = forward_source(cls)
    return OWN_MASK.search(src) is not None or REBOUND_MASK.search(src) is not None


UNMASKED_CALL = re.compile(r"attention_interface\(\s*self,\s*\w+,\s*\w+,\s*\w+,\s*None\b")
"""An interface call that hands a literal `None` mask: attention the model means to be unmasked,
over something other than the sequence (Inkling2's attention residual, over a position's earlier
block outputs)."""


def unmasked_by_design(cls: type) -> bool:
    """Whether `cls.forward` calls the attention interface with no mask at all (UNMASKED_CALL)."""
    return UNMASKED_CALL.search(forward_source(cls)) is not None


def own_eager(module: nn.Module) -> Callable | None:
    """The `eager_attention_forward` of the modeling file that wrote the module's forward: the
    attention as transformers wrote it for this model (None where the file has none). The file of
    `forward`, not of the class: SimpleFSDP's parametrization subclasses the module elsewhere."""
    fn = getattr(sys.modules.get(type(module).forward.__module__), "eager_attention_forward", None)
    return fn if callable(fn) else None


def is_causal_attention(module: nn.Module) -> bool:
    """The module's own word on whether it attends causally: `is_causal`, or `is_decoder` where a class
    leaves is_causal False on its decoder's self-attention and masks causally through the mask alone
    (BigBird-Pegasus). A decoder layer's cross-attention says is_decoder too, but a causal LM never
    calls it (and called, its keys are not one per query position: refused)."""
    return getattr(module, "is_causal", True) is not False or getattr(module, "is_decoder", False) is True


def attention_kernels() -> dict[str, type[nn.Module]]:
    """kernels.attention name -> core class: the library's own and every `attention.<name>` swap registered
    so far (importing any titan_core.kernels module registers the others). The names are `titan_<name>`."""
    out = dict(OWN_CORES)
    for name, swap in registered_swaps().items():
        if name.startswith("attention.") and len(swap.produces) == 1:
            out.setdefault(name.removeprefix("attention."), swap.produces[0])
    return out


def kernel_name(core: nn.Module) -> str:
    """kernels.attention name of a core (its class name for a foreign one)."""
    return next((n for n, cls in attention_kernels().items() if type(core) is cls), type(core).__name__)


def _refusal(core: nn.Module, module: nn.Module, what: str) -> KernelRefusesModel:
    # the kernel's name is looked up here, on a refusal, not on every (possibly compiled) call
    return KernelRefusesModel(f"kernels.attention={kernel_name(core)}: {type(module).__name__} {what}")


def call_core(
    core: nn.Module,
    module: nn.Module,
    query,
    key,
    value,
    *,
    scaling=None,
    dropout=0.0,
    sliding_window=None,
    softcap=None,
    **kwargs,
) -> torch.Tensor:
    """Run `core` for a transformers attention module's call; returns [b, s, heads, d]."""
    if not is_causal_attention(module):
        raise _refusal(core, module, "is not causal; titan_core's kernels are")
    whole_mask = False
    if key.shape[-2] != query.shape[-2]:
        covered = _mask_covers(module, kwargs.get("position_bias"), key.shape[-2])
        whole_mask = covered and kwargs.get("segment_ids") is None
        if not whole_mask:  # packed documents are separated by position, which these keys have none of
            why = ("in packed documents (segment_ids), which its own mask does not separate" if covered
                   else "with no mask of its own over them")  # fmt: skip
            raise _refusal(
                core, module, f"attends {key.shape[-2]} keys from {query.shape[-2]} queries "
                f"(compressed or memory entries beside the sequence) {why}; titan_core's kernels mask by position, "
                "one key per query position",
            )
    if dropout and module.training:
        raise _refusal(
            core, module, f"asks for attention dropout {dropout}; no titan_core kernel "
            "applies dropout (set the attention dropout to 0 in config.json: attention_dropout, attn_pdrop, ...)",
        )
    for selection in (SELECTED_KEYS, *SELECTED_BLOCKS):  # `titan` turns chosen keys into a bias first
        if kwargs.get(selection) is not None:
            raise _refusal(
                core, module, f"hands its attention `{selection}` (what its sparse-attention "
                "indexer chose for each query), which this kernel does not read: the selection would be lost",
            )
    extra = {"softcap": float(softcap)} if softcap else {}  # a core that cannot cap refuses it
    for key_name, ours in NAIVE_ONLY.items():
        if kwargs.get(key_name) is not None:
            if not isinstance(core, NaiveAttention):
                raise _refusal(
                    core, module, f"passes `{key_name}` (attention {ours}), which only kernels.attention=naive computes"
                )
            extra[ours] = kwargs[key_name]
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    window = int(sliding_window) if sliding_window else None
    if whole_mask:  # the module's mask says which key each query sees, the extra entries included
        extra["causal"], window = False, None
    segment_ids = kwargs.get("segment_ids")
    out = core(query, key, value, scale=scale, window=window, segment_ids=segment_ids, **extra)
    return out.transpose(1, 2).contiguous()


def module_core_attention(module, query, key, value, attention_mask, **kwargs):
    """`titan` and `titan_masked`: the attention module's own core. The mask transformers builds is
    causal, window and padding, which the cores apply themselves; a mask the module makes of its own
    (Doge's, from its parameters: the model marks such a module `makes_own_mask` when it gives it its
    core) is part of the model, an additive score bias the naive core adds and the others refuse.
    A non-causal module that calls with no mask at all (`unmasked_by_design`) gets no core and runs
    its modeling file's own eager attention (`upstream_attention`, which the transformers path sets
    when it builds the model, so a compiled block never looks up source); the model's notes name it
    (stack.attention_sites)."""
    if attention_mask is not None and getattr(module, "makes_own_mask", False):
        if attention_mask.dtype == torch.bool:  # True keeps a key
            attention_mask = torch.zeros_like(attention_mask, dtype=query.dtype).masked_fill(
                ~attention_mask, torch.finfo(query.dtype).min
            )
        _add_bias(kwargs, attention_mask)
    if kwargs.get(SELECTED_KEYS) is not None:
        _add_bias(kwargs, selected_keys_bias(kwargs.pop(SELECTED_KEYS), key.shape[-2], query.dtype))
    core = getattr(module, "core", None)
    upstream = getattr(module, "upstream_attention", None)  # set at build: no source lookup under compile
    if core is None and upstream is not None:
        return upstream(module, query, key, value, attention_mask, **kwargs)
    if core is None and not is_causal_attention(module) and unmasked_by_design(type(module)):
        eager = own_eager(module)  # no kernel applies (its keys are not sequence positions): run upstream's
        if eager is not None:
            return eager(module, query, key, value, attention_mask, **kwargs)
    if core is None and not is_causal_attention(module):
        raise KernelRefusesModel(
            f"{type(module).__name__} is not causal (an encoder's attention, or cross-attention); titan_core's "
            "kernels are (an encoder used as a decoder sets is_decoder = true in config.json)"
        )
    if core is None:
        raise KernelUnavailable(
            f"attn_implementation='{MODULE_CORE}' runs the core a titan_core model puts on each attention "
            f"module; {type(module).__name__} holds none (use titan_sdpa, titan_naive, ... with a plain model)"
        )
    return call_core(core, module, query, key, value, **kwargs), None


def _mask_covers(module: nn.Module, bias, n_keys: int) -> bool:
    """Whether the score bias holds the module's own mask over all `n_keys` keys (DeepSeek-V4 masks its
    compressed entries beside the sequence's keys per query): then it is the whole mask, and a core
    that adds it (the naive one) masks nothing by position."""
    return getattr(module, "makes_own_mask", False) and torch.is_tensor(bias) and bias.shape[-1] == n_keys


def _add_bias(kwargs: dict, bias: torch.Tensor) -> None:
    have = kwargs.get("position_bias")
    kwargs["position_bias"] = bias if have is None else have + bias


def selected_keys_bias(indices: torch.Tensor, n_keys: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive score bias [b, 1, s, n_keys] of a sparse-attention selection: 0 at the keys
    `indices` ([b, s, k], key positions; -1 for none) chooses for each query, the dtype's lowest
    value at every other key (what transformers' eager path puts in the mask)."""
    at = torch.where(indices >= 0, indices, n_keys).long()  # a -1 lands in a spare column, dropped
    keep = torch.zeros((*indices.shape[:-1], n_keys + 1), dtype=torch.bool, device=indices.device)
    keep = keep.scatter(-1, at, True)[..., :n_keys]
    return torch.zeros(keep.shape, dtype=dtype, device=indices.device).masked_fill(~keep, torch.finfo(dtype).min)[:, None]


def _fixed(cls: type[nn.Module]) -> Callable:
    core = cls()

    def attention(module, query, key, value, attention_mask, **kwargs):
        return call_core(core, module, query, key, value, **kwargs), None

    attention.__name__ = f"titan_{kernel_name(core)}_attention"
    return attention


_REGISTERED: set[str] = set()
"""The names registered with transformers in this process."""


def register_hf_attention() -> None:
    """Register `titan` and `titan_<kernel>` with transformers' AttentionInterface (idempotent): each
    kernel registered by then (`attention_kernels`); a call after titan_core.kernels loaded adds its own.

    Needs transformers (the [hf] extra); the caller says what to install when it is missing.
    """
    from transformers import AttentionInterface  # lazy: the [hf] extra (titan_core imports without it)
    from transformers.masking_utils import AttentionMaskInterface, eager_mask  # lazy: the [hf] extra

    if MODULE_CORE not in _REGISTERED:
        AttentionInterface.register(MODULE_CORE, module_core_attention)
        AttentionInterface.register(MASKED_CORE, module_core_attention)
        AttentionMaskInterface.register(MASKED_CORE, eager_mask)
        _REGISTERED.add(MODULE_CORE)
    for name, cls in attention_kernels().items():
        if f"titan_{name}" not in _REGISTERED:
            AttentionInterface.register(f"titan_{name}", _fixed(cls))
            _REGISTERED.add(f"titan_{name}")
