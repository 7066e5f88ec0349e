"""diffusers' FluxTransformer2DModel <-> the flux family: weight names both ways, and its config.

Pure renames: a round trip diffusers -> native -> diffusers returns the same tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from titan_core.config.loader import ConfigError
from titan_core.models.common.mapping_errors import AdapterError, ArchitectureError
from titan_core.models.common.validate import (
    BOOL, LAYERS_OR_0, MAX_LAYERS, MAX_WIDTH, POSITIONS, SIZE, Accepts, check_args, check_value, is_int, refusal,
)  # fmt: skip
from titan_core.models.flux.args import FluxArgs

_LIN = ("weight", "bias")
_PROJ = {"wq": "to_q", "wk": "to_k", "wv": "to_v"}
_NORMS = {"q_norm": "norm_q", "k_norm": "norm_k"}


def _linear(native: str, hf: str) -> dict[str, str]:
    return {f"{native}.{leaf}": f"{hf}.{leaf}" for leaf in _LIN}


def _double_keys() -> dict[str, str]:
    table = {**_linear("img_mod", "norm1.linear"), **_linear("txt_mod", "norm1_context.linear")}
    for ours, theirs in _PROJ.items():
        table |= _linear(f"attention.qkv.{ours}", f"attn.{theirs}")
        table |= _linear(f"attention.txt_qkv.{ours}", f"attn.add_{theirs[3:]}_proj")
    for ours, theirs in _NORMS.items():
        table[f"attention.qkv.{ours}.weight"] = f"attn.{theirs}.weight"
        table[f"attention.txt_qkv.{ours}.weight"] = f"attn.{theirs.replace('norm_', 'norm_added_')}.weight"
    table |= _linear("attention.wo", "attn.to_out.0") | _linear("attention.txt_wo", "attn.to_add_out")
    table |= _linear("img_mlp.w1", "ff.net.0.proj") | _linear("img_mlp.w2", "ff.net.2")
    table |= _linear("txt_mlp.w1", "ff_context.net.0.proj") | _linear("txt_mlp.w2", "ff_context.net.2")
    return table


def _single_keys() -> dict[str, str]:
    table = {**_linear("modulation", "norm.linear"), **_linear("mlp_in", "proj_mlp"), **_linear("out", "proj_out")}
    for ours, theirs in _PROJ.items():
        table |= _linear(f"attention.qkv.{ours}", f"attn.{theirs}")
    for ours, theirs in _NORMS.items():
        table[f"attention.qkv.{ours}.weight"] = f"attn.{theirs}.weight"
    return table


TOP_KEYS = {
    **_linear("img_in", "x_embedder"),
    **_linear("txt_in", "context_embedder"),
    **_linear("time_in.w1", "time_text_embed.timestep_embedder.linear_1"),
    **_linear("time_in.w2", "time_text_embed.timestep_embedder.linear_2"),
    **_linear("guidance_in.w1", "time_text_embed.guidance_embedder.linear_1"),
    **_linear("guidance_in.w2", "time_text_embed.guidance_embedder.linear_2"),
    **_linear("vector_in.w1", "time_text_embed.text_embedder.linear_1"),
    **_linear("vector_in.w2", "time_text_embed.text_embedder.linear_2"),
    **_linear("final_mod", "norm_out.linear"),
    **_linear("proj_out", "proj_out"),
}
DOUBLE_KEYS = _double_keys()
SINGLE_KEYS = _single_keys()

# diffusers config key -> FluxArgs field
CONFIG_KEYS = {
    "in_channels": "in_channels", "num_layers": "n_double_layers", "num_single_layers": "n_single_layers",
    "num_attention_heads": "n_heads", "attention_head_dim": "head_dim", "joint_attention_dim": "joint_attention_dim",
    "pooled_projection_dim": "pooled_projection_dim", "guidance_embeds": "guidance_embeds",
    "axes_dims_rope": "axes_dims_rope",
}  # fmt: skip
NEUTRAL = frozenset({"_class_name", "_diffusers_version", "_name_or_path", "model_type"})
SAMPLE_KEYS = ("latent_height", "latent_width", "text_len")
"""Not in a diffusers config (they are the pipeline's): read from the config when given, else FluxArgs' defaults."""
ACCEPTS: dict[str, Accepts] = {
    "in_channels": SIZE, "num_layers": LAYERS_OR_0, "num_single_layers": LAYERS_OR_0, "num_attention_heads": SIZE,
    "attention_head_dim": SIZE, "joint_attention_dim": SIZE, "pooled_projection_dim": SIZE, "guidance_embeds": BOOL,
    "latent_height": POSITIONS, "latent_width": POSITIONS, "text_len": POSITIONS,
    "patch_size": Accepts("int", 1, 1, why="FLUX packs 2x2 patches into tokens itself"),
}  # fmt: skip
"""What each key of a diffusers FLUX config accepts (the bounds are validate.py's); null is
refused (diffusers' class would be built with it), except for out_channels."""
SUMMARY_NAMES = {
    "dim": "num_attention_heads x attention_head_dim", "n_layers": "num_layers + num_single_layers",
    "n_heads": "num_attention_heads", "head_dim": "attention_head_dim", "vocab_size": "in_channels",
    "ffn_hidden_dim": "the MLP width (4 x num_attention_heads x attention_head_dim)",
    "max_seq_len": "text_len + latent_height x latent_width",
}  # fmt: skip
"""The derived sizes (FluxArgs' summary) in the FLUX config's words, for a size out of range."""


def check_flux_config(cfg: dict[str, Any]) -> None:
    """ArchitectureError naming the first key of the diffusers config `cfg` that no FLUX model
    can be built from: a value of the wrong type or out of range (ACCEPTS), out_channels that
    differ from in_channels, axes_dims_rope that are not three even widths summing to
    attention_head_dim, no block at all."""
    for key, accepts in ACCEPTS.items():
        if key in cfg:
            check_value(key, cfg[key], accepts, null_ok=False)
    channels, out = cfg.get("in_channels", FluxArgs.in_channels), cfg.get("out_channels")
    if out is not None and not (is_int(out) and out == channels):
        why = f"null or in_channels = {channels} (the flow loss predicts the input's width)"
        raise ArchitectureError(refusal("out_channels", out, why), ("out_channels",))
    head_dim = cfg.get("attention_head_dim", FluxArgs.head_dim)
    axes = cfg.get("axes_dims_rope", list(FluxArgs.axes_dims_rope))
    widths = isinstance(axes, (list, tuple)) and len(axes) == 3
    if not widths or not all(is_int(d) and 0 <= d <= MAX_WIDTH and d % 2 == 0 for d in axes) or sum(axes) != head_dim:
        why = "three even integers (RoPE widths of the text, row and column axes) summing to attention_head_dim"
        raise ArchitectureError(refusal("axes_dims_rope", axes, f"{why} = {head_dim}"), ("axes_dims_rope",))
    blocks = cfg.get("num_layers", FluxArgs.n_double_layers)
    blocks += cfg.get("num_single_layers", FluxArgs.n_single_layers)
    if not 1 <= blocks <= MAX_LAYERS:
        why = f"from 1 to {MAX_LAYERS} blocks (double- and single-stream together)"
        raise ArchitectureError(refusal("num_layers + num_single_layers", blocks, why), ("num_layers",))


class FluxAdapter:
    hf_model_types = ("flux",)
    hf_class = "FluxTransformer2DModel"

    def native_to_hf_table(self, cfg: FluxArgs) -> dict[str, str]:
        table = dict(TOP_KEYS)
        if not cfg.guidance_embeds:
            table = {k: v for k, v in table.items() if not k.startswith("guidance_in.")}
        for i in range(cfg.n_double_layers):
            table |= {f"layers.{i}.{k}": f"transformer_blocks.{i}.{v}" for k, v in DOUBLE_KEYS.items()}
        for j in range(cfg.n_single_layers):
            i = cfg.n_double_layers + j
            table |= {f"layers.{i}.{k}": f"single_transformer_blocks.{j}.{v}" for k, v in SINGLE_KEYS.items()}
        return table

    def _cfg_of(self, sd: dict[str, torch.Tensor], hf: bool) -> FluxArgs:
        """The block counts and guidance of a state dict, for a mapping without args."""
        prefix = ("transformer_blocks.", "single_transformer_blocks.") if hf else ("layers.", None)
        if hf:
            doubles = {k.split(".")[1] for k in sd if k.startswith(prefix[0])}
            singles = {k.split(".")[1] for k in sd if k.startswith(prefix[1])}
            guidance = any(k.startswith("time_text_embed.guidance_embedder.") for k in sd)
            return FluxArgs(n_double_layers=len(doubles), n_single_layers=len(singles), guidance_embeds=guidance)
        doubles = {k.split(".")[1] for k in sd if k.startswith("layers.") and ".txt_mod." in k}
        layers = {k.split(".")[1] for k in sd if k.startswith("layers.")}
        guidance = any(k.startswith("guidance_in.") for k in sd)
        return FluxArgs(
            n_double_layers=len(doubles), n_single_layers=len(layers) - len(doubles), guidance_embeds=guidance
        )

    def _rename(self, sd: dict[str, torch.Tensor], table: dict[str, str], direction: str) -> dict[str, torch.Tensor]:
        unknown = sorted(set(sd) - set(table))
        if unknown:
            raise AdapterError(f"{len(unknown)} {direction} key(s) the flux mapping does not know: {unknown[:5]}")
        missing = sorted(set(table) - set(sd))
        if missing:
            raise AdapterError(f"{len(missing)} {direction} key(s) missing for this flux model: {missing[:5]}")
        return {table[k]: v for k, v in sd.items()}

    def to_hf(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self._rename(sd, self.native_to_hf_table(self._cfg_of(sd, hf=False)), "native")

    def from_hf(self, sd: dict[str, torch.Tensor], *, tie_embeddings: bool | None = None) -> dict[str, torch.Tensor]:
        table = {v: k for k, v in self.native_to_hf_table(self._cfg_of(sd, hf=True)).items()}
        return self._rename(sd, table, "diffusers")

    def args_from_hf(self, cfg: dict[str, Any]) -> tuple[FluxArgs, set[str]]:
        """A diffusers FluxTransformer2DModel config -> (args, keys read). AdapterError for a
        config of another class; ArchitectureError naming the key for one no FLUX model can be
        built from (`check_flux_config`, then the summary's sizes in the config's words)."""
        cls = cfg.get("_class_name", self.hf_class)
        if cls != self.hf_class:
            raise AdapterError(f"the flux family reads a diffusers {self.hf_class} config, this one is {cls}")
        check_flux_config(cfg)
        values = {field: cfg[key] for key, field in CONFIG_KEYS.items() if key in cfg}
        values |= {k: cfg[k] for k in SAMPLE_KEYS if k in cfg}
        if "axes_dims_rope" in values:
            values["axes_dims_rope"] = tuple(values["axes_dims_rope"])
        try:
            args = FluxArgs(**values)
        except ConfigError as e:  # checked above already; said in the config's words all the same
            raise ArchitectureError(f"flux config: {e}") from None
        check_args(args.native_values(), names=SUMMARY_NAMES)
        used = set(CONFIG_KEYS) | set(SAMPLE_KEYS) | {"patch_size", "out_channels"} | NEUTRAL
        return args, used & set(cfg)

    def hf_config(self, args: FluxArgs) -> dict[str, Any]:
        """The diffusers config.json of these args (the sample sizes kept beside, under their own names)."""
        cfg: dict[str, Any] = {"_class_name": self.hf_class, "model_type": "flux", "patch_size": 1, "out_channels": None}
        for key, field in CONFIG_KEYS.items():
            value = getattr(args, field)
            cfg[key] = list(value) if isinstance(value, tuple) else value
        cfg |= {k: getattr(args, k) for k in SAMPLE_KEYS}
        return cfg

    def unconsumed_keys(self, cfg: dict[str, Any]) -> list[str]:
        _, used = self.args_from_hf(cfg)
        return sorted(set(cfg) - used - NEUTRAL)

