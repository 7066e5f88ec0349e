"""A transformers causal LM run by titan_core: the same contract as the native decoder.

`TransformersCausalLM(args)` builds transformers' own class for `args.extra["hf_config"]`
(on whatever device is current: the trainer builds on meta; a composite config, text beside
vision or audio, builds its text model: hf_classes.causal_lm_parts) and adopts its children,
so the state dict has transformers' names exactly (`model.layers.0.self_attn.q_proj.weight`,
`lm_head.weight`) and the HF adapter of this path is the identity. Around it, what titan_core
expects of a model (TrainableModel, titan_core/models/common/protocol.py):

- `layers`: the decoder blocks as a dict {"0": block, ...} for FSDP2 units, per-block
  compile and the Graph Trainer's block tags, wherever the class keeps them (stack.py:
  `model.layers`, GPT-2's `transformer.h`, BERT's `bert.encoder.layer`, BART's
  `model.decoder.layers`; every stack of a model that keeps several of the same layer class,
  HRM's low- and high-level modules, one after the other). It is a view, not a registered child,
  so the blocks keep their transformers paths;
- `init_weights(seed)`: transformers' own `_init_weights` (what a user of the class gets
  from `from_config`), drawn from a generator seeded with `seed`, then the ties re-made;
- `loss(tokens, labels, positions=, segment_ids=) -> (loss, ce)`: the final hidden states
  of transformers' base model and the output-embedding weight go to `loss_head` (swappable:
  `kernels.loss = "fused_ce"` never builds the full logits), with what the causal-LM class
  does to its logits applied there too: `final_logit_softcapping` (Gemma-2; adapter.FINAL_CAP_KEYS) as the head's
  soft-cap, `logits_scaling` (Granite, divides) and `logit_scale` (Cohere, multiplies) on
  the hidden states (the same product, one rounding apart; Inkling's `logits_mup_width_multiplier`
  divides too), a head bias as one more weight column, a learned per-token logit scale (Dory) on
  the weight's rows, a padded head cut to `unpadded_vocab_size` rows (Inkling) (`head_operands`);
- attention through transformers' AttentionInterface (titan_core/models/transformers/hf_attention.py):
  every module that calls the interface holds a `core` (SDPAttention; the naive reference
  when the model soft-caps its scores or uses attention sinks) and runs it, so
  `kernels.attention` swaps it by module path (`swap_paths` maps the native
  `layers.*.attention.core` onto this tree). A layer with no such module (a Mamba or
  convolution mixer, linear attention, attention computed inline) runs as transformers
  wrote it, and `notes` says which. `positions` become `position_ids` and `segment_ids`
  reach the core as a keyword, as in the native decoder;
- MoE experts through titan_core's experts kernels (titan_core/models/transformers/experts.py):
  transformers' experts modules of the usual structure keep their weights and compute through
  a kernel child that `kernels.moe` swaps (`swap_paths` maps `layers.*.moe.experts` onto it);
  others stay transformers' own, and a `kernels.moe` swap on them is refused.

- mixed precision: as transformers' own model of the compute dtype has them, `buffers_follow(dtype)`
  casts the buffers it makes in the model's dtype to the compute dtype, and `params_kept_fp32(dtype)`
  names the parameters it keeps in fp32 (parallelize reads both).

Not carried over: the MoE load-balancing loss (a config with `output_router_logits` is
refused rather than trained without it), generation and the KV cache (`use_cache=False`).
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.config.loader import ConfigError
from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.attention import NaiveAttention, SDPAttention
from titan_core.models.common.init_stand_in import (
    is_stand_in, is_unwritten_value, stand_in_like, stand_in_unwritten, unwritten_mark,
)  # fmt: skip
from titan_core.models.common.layers import CrossEntropyHead, softcap
from titan_core.models.common.param_counts import count_params
from titan_core.models.common.protocol import ModelBase
from titan_core.models.common.stats import flops_per_token, weight_flops
from titan_core.models.transformers.adapter import attention_free, final_logit_cap, hf_config_for
from titan_core.models.transformers.experts import install_experts
from titan_core.models.transformers.hf_attention import (
    MASKED_CORE, MODULE_CORE, makes_own_mask, own_eager, register_hf_attention,
)  # fmt: skip
from titan_core.models.transformers.hf_classes import causal_lm_parts, config_object, require_transformers, text_config
from titan_core.models.transformers.stack import (
    attention_sites, base_model, decoder_blocks, head_input, head_transform, needs_naive, own_layers_note,
    sibling_stacks, stack_depth, upstream_modules_note,
)  # fmt: skip

ATTENTION_PATTERN = "layers.*.attention.core"
"""The native module path of an attention core, which `swap_paths` maps onto this tree."""
OWN_EXPERTS = "batched_mm"
"""The implementation transformers' own experts modules run on this path (`_build_hf`)."""
EXPERTS_PATTERN = "layers.*.moe.experts"
"""The native module path of the MoE experts, which `swap_paths` maps onto this tree."""


def _core_for(module: nn.Module, softcapped: bool) -> nn.Module:
    """The attention core a module starts with: SDPA, or the naive reference where only it computes
    what the module asks (scores soft-capped, attention sinks, a score bias)."""
    return NaiveAttention() if softcapped or needs_naive(type(module)) else SDPAttention()


def _never_written(t: torch.Tensor) -> bool:
    """Whether no init wrote `t` (it still holds the not-yet-written mark init_weights filled it with)."""
    return stand_in_unwritten(t) if is_stand_in(t) else is_unwritten_value(t)


def _build_hf(cls: type, config, dtype: torch.dtype = torch.float32) -> nn.Module:
    """`cls` built from `config` with titan_core's attention implementation; a class that picks its
    attention module from a table of its own (Falcon, GIT, GPT-Neo) knows no such name, and is built
    with transformers' eager attention instead: no module of it then calls the attention interface,
    so its layers run as transformers wrote them (`attention_sites`, and `notes` says so)."""
    # experts that stay transformers' own (not of the usual structure: experts.py) run its batched_mm:
    # static shapes, as per-block compile (no break inside a block) and the Graph Trainer's capture
    # need; its per-expert loop breaks the graph at a nonzero, and its grouped_mm's fake kernel
    # (the capture) takes bf16 only
    kw = {"dtype": dtype}
    if _sets_experts(cls):
        kw["experts_implementation"] = OWN_EXPERTS
    config._attn_implementation = MODULE_CORE
    try:
        return cls._from_config(config, attn_implementation=MODULE_CORE, **kw)
    except KeyError as e:
        if e.args != (MODULE_CORE,):
            raise
    config._attn_implementation = "eager"
    return cls._from_config(config, attn_implementation="eager", **kw)


def _token_scale(head: nn.Module) -> float | None:
    """The constant factor of a head that scales each token's logit by a learned [vocab] `logit_scale`
    (Dory's `DoryLMHead`: logits * logit_scale * logit_scale_factor), or None for a plain head."""
    scale, factor = getattr(head, "logit_scale", None), getattr(head, "logit_scale_factor", 1.0)
    weight = getattr(head, "weight", None)
    if isinstance(scale, torch.Tensor) and weight is not None and tuple(scale.shape) == (weight.shape[0],):
        return float(factor)
    return None


def _sets_experts(cls: type) -> bool:
    """Whether transformers lets `cls` choose its experts implementation (an MoE built with
    `@use_experts_implementation`)."""
    can = getattr(cls, "_can_set_experts_implementation", None)
    return bool(can and can())


class TransformersCausalLM(ModelBase):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        require_transformers()

        self.args = args
        register_hf_attention()
        cls, config = causal_lm_parts(config_object(hf_config_for(args)))
        text = text_config(config)
        if getattr(text, "output_router_logits", False):
            raise ConfigError(
                "config.json sets output_router_logits = true: the transformers path does not add the MoE "
                "load-balancing loss yet, so it would train a different objective; set it to false"
            )
        hf = _build_hf(cls, config)
        object.__setattr__(self, "_recipe", (cls, config))  # to build it again for constructor values
        for name, child in hf.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "hf", hf)  # not registered: its children are this module's
        prefix, base = base_model(hf)
        object.__setattr__(self, "_base", base)
        depth = stack_depth(text)
        blocks_name, blocks = decoder_blocks(base, depth)
        if blocks is None:
            raise ConfigError(
                f"{cls.__name__} keeps no list of {depth} decoder layers anywhere under `{prefix}` (looked "
                "for a ModuleList of that length), so they cannot be wrapped"
            )
        stacks = [(blocks_name, blocks), *sibling_stacks(base, blocks)]
        self.stack_prefixes = tuple(f"{prefix}.{name}" for name, _ in stacks)
        """Where each stack of layers lives, in the order `layers` numbers them (one for most classes)."""
        blocks = [b for _, stack in stacks for b in stack]
        object.__setattr__(self, "_layers", nn.ModuleDict({str(i): b for i, b in enumerate(blocks)}))
        self.base_prefix = self.stack_prefixes[0]
        self.attention_free = attention_free(text)
        """The config sizes no attention (Mamba, RWKV, xLSTM): the args' one head is a placeholder."""
        self.attention_sites = attention_sites(blocks)
        """Which modules of each layer run a titan_core attention core, and the layers none does (`Sites`)."""
        if self.attention_sites.own or self.attention_sites.masked:  # they read the masks transformers builds
            config._attn_implementation = MASKED_CORE
        softcapped = bool(getattr(text, "attn_logit_softcapping", None))
        for i, paths in self.attention_sites.paths.items():
            for path in paths:
                module = blocks[i].get_submodule(path)
                module.core = _core_for(module, softcapped)
                # read here, once: a source lookup inside forward would break a compiled block's graph
                module.makes_own_mask = makes_own_mask(type(module))
        self.attention_pinned_naive = softcapped
        """Every attention core caps its scores, which only the naive core applies: kernels.attention swaps none
        of them, and the memory model counts their [heads, seq, seq] scores."""
        for site in self.attention_sites.upstream:  # found here, once, for the same reason
            i, _, path = site.partition(".")
            module = blocks[int(i)].get_submodule(path)
            module.upstream_attention = own_eager(module)
        self.swap_paths = {
            ATTENTION_PATTERN: tuple(
                f"{stack}.*.{p}.core" for stack in self.stack_prefixes for p in self.attention_sites.patterns
            )
        }
        """Native swap patterns -> this tree's module paths (titan_core/models/common/swaps.py reads it)."""
        self.experts_install = install_experts(blocks, self.base_prefix)
        """Which experts modules compute through titan_core's kernels, or why none do (`ExpertsInstall`)."""
        if self.experts_install.swap_pattern:
            own = self.experts_install.swap_pattern
            self.swap_paths[EXPERTS_PATTERN] = tuple(own.replace(self.base_prefix, s, 1) for s in self.stack_prefixes)
        self.swap_refusals = {EXPERTS_PATTERN: self.experts_install.refusal} if self.experts_install.refusal else {}
        """{native pattern: why a swap there is refused} (titan_core/models/common/swaps.py adds it to the refusal)."""
        stacked = (f"its layers are kept in {len(stacks)} stacks ({', '.join(self.stack_prefixes)}), wrapped as layers "
                   f"0-{len(blocks) - 1} in that order" if len(stacks) > 1 else None)  # fmt: skip
        notes = (stacked, own_layers_note(self.attention_sites), upstream_modules_note(self.attention_sites))
        self.notes = [n for n in notes if n]
        """What of the model runs otherwise than through titan_core's kernels, a line each (runs record it)."""
        self.head_transform = head_transform(hf, prefix)
        """Modules the causal-LM class runs between its base model and the output head (BERT's
        `cls.predictions.transform`), [] for most: their output is what the loss head receives."""
        self.head_bias = getattr(hf.get_output_embeddings(), "bias", None) is not None
        """The output head adds a bias (Phi-1/2, GPT-J, CodeGen): the loss head gets it folded into the weight."""
        self.head_token_scale = _token_scale(hf.get_output_embeddings())
        """The output head multiplies each token's logit by a learned scale ([vocab] `logit_scale` times a
        constant `logit_scale_factor`: Dory), or None: the loss head gets it folded into the weight's rows."""
        # Granite's name for it, and Inkling's (a muP width multiplier the hidden states are divided by)
        self.logits_divisor = float(
            getattr(text, "logits_scaling", None) or getattr(text, "logits_mup_width_multiplier", None) or 1.0
        )
        rows, unpadded = self.output_weight.shape[0], getattr(text, "unpadded_vocab_size", None)
        self.head_rows = unpadded if isinstance(unpadded, int) and 0 < unpadded < rows else None
        """The head's first rows the causal-LM class keeps (Inkling cuts its logits to `unpadded_vocab_size`
        of a padded head), or None: every row is a token's."""
        self.logits_multiplier = float(getattr(hf, "logit_scale", None) or 1.0)
        self.final_softcap = final_logit_cap(text)
        self.loss_head = CrossEntropyHead(self.final_softcap)

    # ---- structure -------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleDict:
        """The decoder blocks, {"0": block, ...}: a view over `<base>.layers` (GPT-2: `<base>.h`; see the module docstring)."""
        return self._layers

    @property
    def output_weight(self) -> torch.Tensor:
        return self.hf.get_output_embeddings().weight

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token. A stack that attends: the args' estimate (`stats.flops_per_token`: its
        weights as the shared decoder of these sizes holds them, and the attention scores). An attention-free
        one: 6 per weight of its own modules that a token multiplies by (an untied input embedding is a
        lookup); the recurrence's elementwise work beside them is not counted."""
        if not self.attention_free:
            return flops_per_token(self.args, seq_len)
        embedding = self.hf.get_input_embeddings().weight
        return weight_flops(count_params(self).active, embedding.numel(), tied=embedding is self.output_weight)

    def attention_cores(self) -> Iterator[nn.Module]:
        for i, paths in self.attention_sites.paths.items():
            for path in paths:
                yield self._layers[str(i)].get_submodule(path).core

    # ---- weights -----------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """transformers' own init of every parameter and buffer (after `to_empty`), seeded; what its
        `_init_weights` leaves alone gets its constructor's value (`_constructor_values`)."""
        device = self.output_weight.device
        for mod in self.modules():
            mod.__dict__.pop("_is_hf_initialized", None)
        for t in [*self.parameters(), *self.buffers()]:
            if hasattr(t, "_is_hf_initialized"):
                del t._is_hf_initialized
        # untied while initialising, tied after, as transformers' own init_weights does: a tied head then
        # holds what the embedding's init drew (XLM, Youtu init the two differently; the head's won before)
        self.untie()
        if device.type != "meta":
            for t in [*self.parameters(), *self.buffers()]:
                if not is_stand_in(t):  # a sharded init's stand-in is made with the mark when first touched
                    t.data.fill_(unwritten_mark(t.dtype))
        devices = [device] if device.type not in ("cpu", "meta") else []
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            if seed is not None:
                torch.manual_seed(seed)
            self.hf.initialize_weights()
            if device.type != "meta":
                self._constructor_values()
        self.retie()

    def _constructor_values(self) -> None:
        """Give every tensor transformers' `_init_weights` did not write (still `_unset`) the value
        its module's constructor gives it: e.g. Apertus' xIELU activation keeps its alpha and beta
        as parameters set in `__init__`, which `to_empty` turned into garbage. The class is built
        once more on the CPU for them, only when there are any."""
        own = {**dict(self.hf.named_parameters()), **dict(self.hf.named_buffers())}
        left = [n for n, t in own.items() if _never_written(t)]
        if not left:
            return
        fresh = self._rebuilt(torch.float32)
        values = {**dict(fresh.named_parameters()), **dict(fresh.named_buffers())}
        missing = [n for n in left if n not in values]
        if missing:
            raise ConfigError(f"{type(self.hf).__name__}: no initial value for {', '.join(missing[:5])}")
        with torch.no_grad():
            for n in left:
                own[n].copy_(values[n])

    def _rebuilt(self, dtype: torch.dtype) -> nn.Module:
        """transformers' model built once more from this one's class and config (for values and dtypes
        only). The config is this model's own object: the attention implementation chosen for it
        (`titan_masked`, where layers read transformers' masks) is kept, as building resets it."""
        cls, config = self._recipe
        chosen = config._attn_implementation
        try:
            return _build_hf(cls, config, dtype=dtype)
        finally:
            config._attn_implementation = chosen

    def _dtypes_built_under(self, dtype: torch.dtype) -> dict[str, torch.dtype]:
        """{parameter or buffer name: its dtype} of the class built on meta under default dtype
        `dtype`: what transformers' own model of that dtype holds each tensor in."""
        cache = self.__dict__.setdefault("_built_dtypes", {})
        if dtype not in cache:
            with torch.device("meta"):
                probe = self._rebuilt(dtype)
            cache[dtype] = {n: t.dtype for n, t in [*probe.named_parameters(), *probe.named_buffers()]}
        return cache[dtype]

    def params_kept_fp32(self, dtype: torch.dtype) -> frozenset[str]:
        """Parameters transformers keeps in fp32 in a model of `dtype` (Inkling-2's router weight,
        made with an explicit float32 and computed with fp32 inputs): mixed precision must not gather
        them in `dtype`, or its matmul meets fp32 inputs with a bf16 weight."""
        if not dtype.is_floating_point or dtype == torch.float32:
            return frozenset()
        built = self._dtypes_built_under(dtype)
        return frozenset(n for n, _ in self.hf.named_parameters() if built.get(n) == torch.float32)

    @torch.no_grad()
    def buffers_follow(self, dtype: torch.dtype) -> list[str]:
        """Cast to `dtype` (mixed precision's compute dtype) the floating buffers transformers makes in
        the model's dtype, those a build under that default dtype creates in it; return their names.

        transformers runs a bf16 model with such buffers in bf16 and its code assumes they match
        the weights (MiniMax's lightning attention multiplies bf16 scores by its decay buffer, then
        meets bf16 values in a matmul that refuses mixed dtypes). A buffer it keeps in fp32 on purpose
        (RoPE's inv_freq, made from an explicit float32 tensor) stays fp32, as it does there."""
        if not dtype.is_floating_point or dtype == torch.float32:
            return []
        built = self._dtypes_built_under(dtype)
        cast = []
        for name, buf in list(self.hf.named_buffers()):
            if built.get(name) == dtype and buf.dtype.is_floating_point and buf.dtype != dtype:
                owner, _, leaf = name.rpartition(".")
                setattr(self.hf.get_submodule(owner) if owner else self.hf, leaf, buf.to(dtype))
                cast.append(name)
        return cast

    def retie(self) -> None:
        """Re-make tied parameters (`to_empty` gives each module a parameter of its own)."""
        self.hf.tie_weights()

    def untie(self) -> None:
        """Give a tied output head a parameter of its own again (`retie` shares it once more)."""
        head, emb = self.hf.get_output_embeddings(), self.hf.get_input_embeddings()
        if head is not None and emb is not None and head.weight is emb.weight:
            head.weight = stand_in_like(emb.weight)

    # ---- forward -----------------------------------------------------------------------
    def hidden(self, tokens, *, positions=None, segment_ids=None) -> torch.Tensor:
        """What the causal-LM class feeds its output head [batch, seq, dim]: the final (normed)
        hidden states of its base model, or, where the class transforms them first (`head_transform`),
        the head's input as its own forward computes it (the forward stops there: no logits)."""
        kw = {} if segment_ids is None else {"segment_ids": segment_ids}
        if not self.head_transform:
            return self._base(input_ids=tokens, position_ids=positions, use_cache=False, **kw).last_hidden_state
        return head_input(self.hf, input_ids=tokens, position_ids=positions, use_cache=False, **kw)

    def _head_input(self, h: torch.Tensor) -> torch.Tensor:
        # the causal-LM class scales its logits; scaling the hidden states instead gives the
        # same product, so the loss head (and fused_ce) still receives hidden states and the weight
        if self.logits_multiplier != 1.0:
            h = h * self.logits_multiplier
        if self.logits_divisor != 1.0:
            h = h / self.logits_divisor
        return h

    def head_operands(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states, weight) whose product is the causal-LM class's logits: a head bias is
        one more weight column against a constant 1 feature ([h, 1] @ [W, b]^T = h W^T + b), so every
        loss head, fused_ce included, computes it without knowing there is one."""
        w = self.output_weight
        # a class that keeps its residual stream in fp32 (Mamba's residual_in_fp32) hands fp32 states
        # to a head of the compute dtype under mixed precision: it casts them to the head's dtype first
        h = self._head_input(h.to(w.dtype) if h.dtype != w.dtype and h.is_floating_point() else h)
        if self.head_bias:
            bias = self.hf.get_output_embeddings().bias
            ones = torch.ones(*h.shape[:-1], 1, dtype=h.dtype, device=h.device)
            h, w = torch.cat([h, ones], dim=-1), torch.cat([w, bias.to(w.dtype)[:, None]], dim=1)
        if self.head_token_scale is not None:  # (h W^T + b) * s = h (s W)^T + s b: a scale per weight row
            w = w * (self.hf.get_output_embeddings().logit_scale * self.head_token_scale).to(w.dtype)[:, None]
        if self.head_rows is not None:
            w = w[: self.head_rows]
        return h, w

    def forward(self, tokens, *, positions=None, segment_ids=None) -> torch.Tensor:
        """Logits [batch, seq, vocab], as the causal-LM class computes them."""
        h, w = self.head_operands(self.hidden(tokens, positions=positions, segment_ids=segment_ids))
        return softcap(F.linear(h, w), self.final_softcap)

    def loss(self, tokens, labels, *, positions=None, segment_ids=None):
        """Training loss (mean cross-entropy of the valid labels); returns (loss, ce) like the native decoder."""
        h, w = self.head_operands(self.hidden(tokens, positions=positions, segment_ids=segment_ids))
        ce = self.loss_head(h, w, labels)
        return ce, ce
