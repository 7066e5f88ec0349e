"""A transformers causal LM run by titan_core: the same contract as the native decoder.

`TransformersCausalLM(args)` builds transformers' own class for `args.extra["hf_config"]`
(on whatever device is current: the trainer builds on meta) and adopts its children, so
the state dict has transformers' names exactly (`model.layers.0.self_attn.q_proj.weight`,
`lm_head.weight`) and the HF adapter of this path is the identity. Around it, what titan_core
expects of a model (titan_core/models/common/decoder.py):

- `layers`: the decoder blocks as a dict {"0": block, ...} for FSDP2 units, per-block
  compile and the Graph Trainer's block tags. It is a view, not a registered child, so
  the blocks keep their transformers paths (`model.layers.<i>`);
- `init_weights(seed)`: transformers' own `_init_weights` (what a user of the class gets
  from `from_config`), drawn from a generator seeded with `seed`, then the ties re-made;
- `loss(tokens, labels, positions=, segment_ids=) -> (loss, ce)`: the final hidden states
  of transformers' base model and the output-embedding weight go to `loss_head` (swappable:
  `kernels.loss = "fused_ce"` never builds the full logits), with what the causal-LM class
  does to its logits applied there too: `final_logit_softcapping` (Gemma-2) as the head's
  soft-cap, `logits_scaling` (Granite, divides) and `logit_scale` (Cohere, multiplies) on
  the hidden states (the same product, one rounding apart);
- attention through transformers' AttentionInterface (titan_core/kernels/hf_attention.py):
  every attention module holds a `core` (SDPAttention; the naive reference when the model
  soft-caps its scores) and runs it, so `kernels.attention` swaps it by module path
  (`swap_paths` maps the native `layers.*.attention.core` onto this tree). `positions` become
  `position_ids` and `segment_ids` reach the core as a keyword, as in the native decoder;
- MoE experts through titan_core's experts kernels (titan_core/models/transformers/experts.py):
  transformers' experts modules of the usual structure keep their weights and compute through
  a kernel child that `kernels.moe` swaps (`swap_paths` maps `layers.*.moe.experts` onto it);
  others stay transformers' own, and a `kernels.moe` swap on them is refused.

Not carried over: the MoE load-balancing loss (a config with `output_router_logits` is
refused rather than trained without it), generation and the KV cache (`use_cache=False`).
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.config.loader import ConfigError
from titan_core.kernels.hf_attention import MODULE_CORE, register_hf_attention
from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.attention import NaiveAttention, SDPAttention
from titan_core.models.common.layers import CrossEntropyHead, softcap
from titan_core.models.transformers.adapter import hf_config_for
from titan_core.models.transformers.experts import install_experts
from titan_core.models.transformers.hf_classes import causal_lm_class, config_object, require_transformers

ATTENTION_PATTERN = "layers.*.attention.core"
"""The native module path of an attention core, which `swap_paths` maps onto this tree."""
EXPERTS_PATTERN = "layers.*.moe.experts"
"""The native module path of the MoE experts, which `swap_paths` maps onto this tree."""


def _attention_modules(blocks: nn.ModuleList) -> dict[str, nn.Module]:
    """{path inside a block: module} of the modules that call the attention interface:
    transformers names them `<Model>Attention` and gives each a `scaling`. Every block must
    hold them at the same paths (ConfigError naming the first that does not: a hybrid stack,
    e.g. Mamba layers between attention layers, is not run on this path)."""

    def found(block: nn.Module) -> dict[str, nn.Module]:
        return {
            n: m
            for n, m in block.named_modules()
            if n and type(m).__name__.endswith("Attention") and hasattr(m, "scaling")
        }

    first = found(blocks[0])
    for i, block in enumerate(blocks):
        paths = list(found(block)) if i else list(first)
        if not paths or paths != list(first):
            what = "no attention module" if not paths else f"attention at {paths}, layer 0 at {list(first)}"
            raise ConfigError(
                f"decoder layer {i} ({type(block).__name__}) has {what} (a `*Attention` with `scaling`): "
                "titan_core's attention kernels go under the same attention module in every layer, so a "
                "hybrid or mixed stack is not run on this path"
            )
    return first


def _decoder_blocks(base: nn.Module, text) -> tuple[str, nn.ModuleList | None]:
    """(name, list) of the base model's decoder layers: its `layers` (most models) or the one
    ModuleList child as long as the config's depth (GPT-2's `h`)."""
    depth = getattr(text, "num_hidden_layers", None)
    named = [(n, m) for n, m in base.named_children() if isinstance(m, nn.ModuleList) and len(m)]
    for name, mod in named:
        if name == "layers":
            return name, mod
    deep = [(n, m) for n, m in named if len(m) == depth]
    return deep[0] if len(deep) == 1 else ("", None)


class TransformersCausalLM(nn.Module):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        require_transformers()

        self.args = args
        config = config_object(hf_config_for(args))
        register_hf_attention()
        text = config.get_text_config()
        if getattr(text, "output_router_logits", False):
            raise ConfigError(
                "config.json sets output_router_logits = true: the transformers path does not add the MoE "
                "load-balancing loss yet, so it would train a different objective; set it to false"
            )
        cls = causal_lm_class(config)
        config._attn_implementation = MODULE_CORE
        hf = cls._from_config(config, attn_implementation=MODULE_CORE, dtype=torch.float32)
        for name, child in hf.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "hf", hf)  # not registered: its children are this module's
        base = getattr(hf, hf.base_model_prefix)
        object.__setattr__(self, "_base", base)
        blocks_name, blocks = _decoder_blocks(base, text)
        if blocks is None:
            raise ConfigError(
                f"{cls.__name__} keeps no list of {text.num_hidden_layers} decoder layers under "
                f"`{hf.base_model_prefix}` (looked for a ModuleList of that length), so they cannot be wrapped"
            )
        object.__setattr__(self, "_layers", nn.ModuleDict({str(i): b for i, b in enumerate(blocks)}))
        self.base_prefix = f"{hf.base_model_prefix}.{blocks_name}"
        softcapped = bool(getattr(text, "attn_logit_softcapping", None))
        self.attention_paths = list(_attention_modules(blocks))
        for block in blocks:
            for path in self.attention_paths:
                block.get_submodule(path).core = NaiveAttention() if softcapped else SDPAttention()
        self.swap_paths = {ATTENTION_PATTERN: f"{self.base_prefix}.*.{p}.core" for p in self.attention_paths[:1]}
        """Native swap patterns -> this tree's module paths (titan_core/config/swaps.py reads it)."""
        self.experts_install = install_experts(blocks, self.base_prefix)
        """Which experts modules compute through titan_core's kernels, or why none do (`ExpertsInstall`)."""
        if self.experts_install.swap_pattern:
            self.swap_paths[EXPERTS_PATTERN] = self.experts_install.swap_pattern
        self.swap_refusals = {EXPERTS_PATTERN: self.experts_install.refusal} if self.experts_install.refusal else {}
        """{native pattern: why a swap there is refused} (titan_core/config/swaps.py adds it to the refusal)."""
        head = hf.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ConfigError(
                f"{cls.__name__}'s output head has a bias: titan_core's loss head (and fused_ce) take the "
                "final hidden states and the head weight only, so the path would train another model"
            )
        self.logits_divisor = float(getattr(text, "logits_scaling", None) or 1.0)
        self.logits_multiplier = float(getattr(hf, "logit_scale", None) or 1.0)
        self.final_softcap = getattr(text, "final_logit_softcapping", None)
        self.loss_head = CrossEntropyHead(self.final_softcap)

    # ---- structure -------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleDict:
        """The decoder blocks, {"0": block, ...}: a view over `<base>.layers` (GPT-2: `<base>.h`; see the module docstring)."""
        return self._layers

    @property
    def output_weight(self) -> torch.Tensor:
        return self.hf.get_output_embeddings().weight

    def attention_cores(self) -> Iterator[nn.Module]:
        for block in self._layers.values():
            for path in self.attention_paths:
                yield block.get_submodule(path).core

    # ---- weights -----------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """transformers' own init of every parameter and buffer (after `to_empty`), seeded."""
        device = self.output_weight.device
        for mod in self.modules():
            mod.__dict__.pop("_is_hf_initialized", None)
        for t in [*self.parameters(), *self.buffers()]:
            if hasattr(t, "_is_hf_initialized"):
                del t._is_hf_initialized
        self.retie()
        devices = [device] if device.type not in ("cpu", "meta") else []
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            if seed is not None:
                torch.manual_seed(seed)
            self.hf.initialize_weights()
        self.retie()

    def retie(self) -> None:
        """Re-make tied parameters (`to_empty` gives each module a parameter of its own)."""
        self.hf.tie_weights()

    # ---- forward -----------------------------------------------------------------------
    def hidden(self, tokens, *, positions=None, segment_ids=None) -> torch.Tensor:
        """Final (normed) hidden states [batch, seq, dim] of transformers' base model."""
        kw = {} if segment_ids is None else {"segment_ids": segment_ids}
        out = self._base(input_ids=tokens, position_ids=positions, use_cache=False, **kw)
        return out.last_hidden_state

    def _head_input(self, h: torch.Tensor) -> torch.Tensor:
        # the causal-LM class scales its logits; scaling the hidden states instead gives the
        # same product, so the loss head (and fused_ce) still receives hidden states and the weight
        if self.logits_multiplier != 1.0:
            h = h * self.logits_multiplier
        if self.logits_divisor != 1.0:
            h = h / self.logits_divisor
        return h

    def forward(self, tokens, *, positions=None, segment_ids=None) -> torch.Tensor:
        """Logits [batch, seq, vocab], as the causal-LM class computes them."""
        h = self._head_input(self.hidden(tokens, positions=positions, segment_ids=segment_ids))
        return softcap(F.linear(h, self.output_weight), self.final_softcap)

    def loss(self, tokens, labels, *, positions=None, segment_ids=None):
        """Training loss (mean cross-entropy of the valid labels); returns (loss, ce) like the native decoder."""
        h = self._head_input(self.hidden(tokens, positions=positions, segment_ids=segment_ids))
        ce = self.loss_head(h, self.output_weight, labels)
        return ce, ce
