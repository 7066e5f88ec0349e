"""Where a transformers causal LM keeps its decoder layers, and which modules in them attend.

transformers classes differ in both. The layer list may be the base model's `layers` (most
models), GPT-2's `h`, an encoder-style `encoder.layer` (BERT, RoBERTa used as decoders) or the
decoder half of an encoder-decoder (`decoder.layers`, BART, Marian). And a stack may mix
layer kinds: Mamba or convolution layers between attention layers (Jamba, LFM, Nemotron-H),
linear attention next to full attention (Qwen3-Next, Kimi-Linear), or older classes whose
attention is computed inline rather than through transformers' attention interface (BLOOM, MPT).

`decoder_blocks` finds the list wherever the class keeps it. `attention_sites` finds, per layer,
the modules that call the attention interface: only there can titan_core's attention kernels
run (the transformers path puts a swappable `core` on each). Every other layer runs exactly as
transformers wrote it; `own_layers` says which and why, for the record a user reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from titan_core.models.transformers.hf_attention import (
    NAIVE_ONLY, forward_source, is_causal_attention, makes_own_mask, unmasked_by_design,
)  # fmt: skip

INTERFACE_CALL = "ALL_ATTENTION_FUNCTIONS"
"""The registry transformers' attention modules look their implementation up in: a module whose
forward names it hands its q, k, v to whatever `config._attn_implementation` selects."""


CROSS_NAMES = frozenset({"encoder_attn", "crossattention", "cross_attn", "cross_attention"})
"""What transformers' decoder layers call their cross-attention: it runs only with encoder states,
which a causal LM never gets, so it gets no core (BigBird-Pegasus's says is_decoder like its
self-attention does)."""


@dataclass
class Sites:
    """The attention modules of a stack, by layer."""

    paths: dict[int, list[str]] = field(default_factory=dict)
    """{layer index: paths inside the block of the modules that call the attention interface}."""
    own: dict[int, str] = field(default_factory=dict)
    """{layer index: why no titan_core kernel runs in it} for the layers with no such module."""
    masked: bool = False
    """An attention module reads the attention mask itself (`reads_mask`)."""
    upstream: list[str] = field(default_factory=list)
    """Paths ("<layer>.<module>") of the non-causal modules that attend unmasked by design
    (hf_attention.unmasked_by_design): they run their modeling file's eager attention."""

    @property
    def patterns(self) -> list[str]:
        """The distinct in-block paths, first seen first (one swap pattern each)."""
        return list(dict.fromkeys(p for ps in self.paths.values() for p in ps))


DEPTH_KEYS = ("decoder_layers", "num_hidden_layers", "n_layer", "num_layers")
"""Config keys of the decoder's depth, in the order they are trusted: the decoder half of an
encoder-decoder (BART) says `decoder_layers`, while its `num_hidden_layers` is the encoder's."""


def stack_depth(text) -> int | None:
    """The number of decoder layers `text` (a transformers config) describes."""
    return next((v for k in DEPTH_KEYS if isinstance(v := getattr(text, k, None), int) and v > 0), None)


def base_model(hf: nn.Module) -> tuple[str, nn.Module]:
    """(name, module) of the causal-LM class's base model: its `base_model_prefix` child, else the
    one child a class of this kind keeps it in (`model`, `transformer`: a prefix inherited from a
    multimodal parent, e.g. Llama-4's `language_model`, names no child here)."""
    for name in (getattr(hf, "base_model_prefix", ""), "model", "transformer", "decoder"):
        child = getattr(hf, name, None) if name else None
        if isinstance(child, nn.Module):
            return name, child
    raise AttributeError(f"{type(hf).__name__} has no base model child (`{hf.base_model_prefix}`, `model`)")


def decoder_blocks(root: nn.Module, depth: int | None) -> tuple[str, nn.ModuleList | None]:
    """(dotted path under `root`, list) of the decoder layers: the ModuleList as long as the
    config's depth; of several, the one that holds the most parameters (the layers, not a list
    of per-layer norms or router weights), then the shallowest. A `layers` child wins outright. ("", None) when no list matches."""
    direct = getattr(root, "layers", None)
    if isinstance(direct, nn.ModuleList) and len(direct):
        return "layers", direct
    found = [
        (name, mod)
        for name, mod in root.named_modules()
        if name and isinstance(mod, nn.ModuleList) and len(mod) and len(mod) == depth
    ]
    if not found:
        return "", None

    def weight(item):
        name, mod = item
        return (-sum(p.numel() for p in mod.parameters()), name.count("."))

    return min(found, key=weight)


def sibling_stacks(root: nn.Module, blocks: nn.ModuleList) -> list[tuple[str, nn.ModuleList]]:
    """(dotted path under `root`, list) of every other ModuleList whose layers are all of the class
    of `blocks`' layers: a model that keeps its layers in several stacks and runs them in turn (HRM's
    low- and high-level modules) has them all wrapped, not one stack."""
    kind = type(blocks[0])
    return [
        (name, mod)
        for name, mod in root.named_modules()
        if name and isinstance(mod, nn.ModuleList) and mod is not blocks and len(mod)
        and all(type(b) is kind for b in mod)
    ]


def calls_interface(cls: type) -> bool:
    """Whether `cls.forward` looks its attention up in transformers' attention interface."""
    return INTERFACE_CALL in forward_source(cls)


def needs_naive(cls: type) -> bool:
    """Whether `cls.forward` hands the interface what only the naive core computes (attention sinks,
    a score bias: hf_attention.NAIVE_ONLY), or a mask of its own making (Doge's learned mask, which
    `module_core_attention` adds as a score bias)."""
    src = forward_source(cls)
    return any(f"{k}=" in src for k in NAIVE_ONLY) or makes_own_mask(cls)


def reads_mask(cls: type) -> bool:
    """Whether `cls.forward` indexes the attention mask itself (a sparse-attention indexer that scores
    keys against it: DeepSeek-V3.2, GLM-MoE-DSA) or makes its own mask from it (Doge keeps the top
    keys of those the causal mask allows), so it needs the mask transformers builds."""
    return "attention_mask[" in forward_source(cls) or makes_own_mask(cls)


def attention_sites(blocks: nn.ModuleList) -> Sites:
    """The modules of each block that call the attention interface (`calls_interface`) and are
    causal. A module inside another such module is the outer one's business (a wrapper that
    delegates). A non-causal one (BART's cross-attention, which runs only with encoder states a
    causal LM never gets; an encoder's self-attention) gets no core: called, it is refused."""
    sites = Sites()
    for i, block in enumerate(blocks):
        paths: list[str] = []
        acausal = False
        for name, mod in block.named_modules():
            if not name or not calls_interface(type(mod)) or any(name.startswith(p + ".") for p in paths):
                continue
            if not is_causal_attention(mod) and unmasked_by_design(type(mod)):
                sites.upstream.append(f"{i}.{name}")
            elif not is_causal_attention(mod) or CROSS_NAMES.intersection(name.split(".")):
                acausal = True
            else:
                paths.append(name)
        if paths:
            sites.paths[i] = paths
            if any(reads_mask(type(block.get_submodule(p))) for p in paths):
                sites.masked = True
        elif acausal:
            sites.own[i] = f"{type(block).__name__}: its attention is not causal (an encoder's, or cross-attention)"
        else:
            sites.own[i] = (
                f"{type(block).__name__}: no module in it calls transformers' attention interface "
                "(a recurrent, convolutional or linear-attention mixer, or attention computed inline)"
            )
    return sites


def upstream_modules_note(sites: Sites) -> str | None:
    """One line naming the attention modules that run transformers' eager attention (Sites.upstream)."""
    if not sites.upstream:
        return None
    kinds = sorted({p.split(".", 1)[1] for p in sites.upstream})
    return (
        f"{len(sites.upstream)} module(s) ({', '.join(kinds)}) attend unmasked over something other than the "
        "sequence (not causal, no mask): they run transformers' eager attention, so kernels.attention does not "
        "apply in them"
    )


def own_layers_note(sites: Sites) -> str | None:
    """One line naming the layers that run as transformers wrote them, or None when every layer
    runs a titan_core attention kernel."""
    if not sites.own:
        return None
    by_why: dict[str, list[int]] = {}
    for i, why in sites.own.items():
        by_why.setdefault(why, []).append(i)
    parts = [f"layers {', '.join(map(str, idx))} ({why})" for why, idx in by_why.items()]
    return (
        "; ".join(parts) + ": these run as transformers wrote them, so kernels.attention does not apply in them"
    )


def head_transform(hf: nn.Module, base_name: str) -> list[str]:
    """Names of the modules with parameters outside the base model and the output head: what the
    causal-LM class computes between the two (BERT's `cls.predictions.transform`, RemBERT's
    projection). [] when the head reads the base model's output directly."""
    head = hf.get_output_embeddings()
    head_params = {id(p) for p in head.parameters()} if head is not None else set()
    names = []
    for name, p in hf.named_parameters():
        top = name.split(".")[0]
        if top != base_name and id(p) not in head_params:
            names.append(name.rsplit(".", 1)[0])
    return list(dict.fromkeys(names))


class _HeadInput(Exception):
    """Carries the output head's input out of the causal-LM class's forward."""

    def __init__(self, value):
        super().__init__("head input")
        self.value = value


def head_input(hf: nn.Module, **inputs):
    """The input of `hf`'s output head in its own forward on `inputs`; the forward stops there, so
    no logits are computed (the loss head computes them, or never does: fused_ce)."""

    def stop(_module, args):
        raise _HeadInput(args[0])

    handle = hf.get_output_embeddings().register_forward_pre_hook(stop)
    try:
        hf(**inputs)
    except _HeadInput as got:
        return got.value
    finally:
        handle.remove()
    raise RuntimeError(f"{type(hf).__name__}.forward never called its output head")
