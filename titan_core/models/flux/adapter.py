"""diffusers' FluxTransformer2DModel <-> the flux family: weight names both ways, and its config.

Pure renames: a round trip diffusers -> native -> diffusers returns the same tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.mapping_errors import AdapterError
from titan_core.models.flux.config import FluxConfig, flux_config

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

# diffusers config key -> FluxConfig field
CONFIG_KEYS = {
    "in_channels": "in_channels", "num_layers": "n_double_layers", "num_single_layers": "n_single_layers",
    "num_attention_heads": "n_heads", "attention_head_dim": "head_dim", "joint_attention_dim": "joint_attention_dim",
    "pooled_projection_dim": "pooled_projection_dim", "guidance_embeds": "guidance_embeds",
    "axes_dims_rope": "axes_dims_rope",
}  # fmt: skip
NEUTRAL = frozenset({"_class_name", "_diffusers_version", "_name_or_path", "model_type"})
SAMPLE_KEYS = ("latent_height", "latent_width", "text_len")
"""Not in a diffusers config (they are the pipeline's): read from the config when given, else FluxConfig's."""


class FluxAdapter:
    hf_model_types = ("flux",)
    hf_class = "FluxTransformer2DModel"

    def native_to_hf_table(self, cfg: FluxConfig) -> dict[str, str]:
        table = dict(TOP_KEYS)
        if not cfg.guidance_embeds:
            table = {k: v for k, v in table.items() if not k.startswith("guidance_in.")}
        for i in range(cfg.n_double_layers):
            table |= {f"layers.{i}.{k}": f"transformer_blocks.{i}.{v}" for k, v in DOUBLE_KEYS.items()}
        for j in range(cfg.n_single_layers):
            i = cfg.n_double_layers + j
            table |= {f"layers.{i}.{k}": f"single_transformer_blocks.{j}.{v}" for k, v in SINGLE_KEYS.items()}
        return table

    def _cfg_of(self, sd: dict[str, torch.Tensor], hf: bool) -> FluxConfig:
        """The block counts and guidance of a state dict, for a mapping without args."""
        prefix = ("transformer_blocks.", "single_transformer_blocks.") if hf else ("layers.", None)
        if hf:
            doubles = {k.split(".")[1] for k in sd if k.startswith(prefix[0])}
            singles = {k.split(".")[1] for k in sd if k.startswith(prefix[1])}
            guidance = any(k.startswith("time_text_embed.guidance_embedder.") for k in sd)
            return FluxConfig(n_double_layers=len(doubles), n_single_layers=len(singles), guidance_embeds=guidance)
        doubles = {k.split(".")[1] for k in sd if k.startswith("layers.") and ".txt_mod." in k}
        layers = {k.split(".")[1] for k in sd if k.startswith("layers.")}
        guidance = any(k.startswith("guidance_in.") for k in sd)
        return FluxConfig(
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

    def args_from_hf(self, cfg: dict[str, Any]) -> tuple[TransformerArgs, set[str]]:
        """A diffusers FluxTransformer2DModel config -> (args, keys read). AdapterError for one
        this family cannot build: another class, a patch size other than 1, out_channels that
        differ from in_channels."""
        cls = cfg.get("_class_name", self.hf_class)
        if cls != self.hf_class:
            raise AdapterError(f"the flux family reads a diffusers {self.hf_class} config, this one is {cls}")
        if cfg.get("patch_size", 1) != 1:
            raise AdapterError(f"patch_size {cfg['patch_size']}: FLUX packs 2x2 patches into tokens itself; 1 is read")
        out = cfg.get("out_channels")
        if out not in (None, cfg.get("in_channels", 64)):
            raise AdapterError(f"out_channels {out} differs from in_channels: the flow loss predicts the input's width")
        values = {field: cfg[key] for key, field in CONFIG_KEYS.items() if key in cfg}
        values |= {k: cfg[k] for k in SAMPLE_KEYS if k in cfg}
        if "axes_dims_rope" in values:
            values["axes_dims_rope"] = tuple(values["axes_dims_rope"])
        try:
            args = FluxConfig(**values).to_args()
        except Exception as e:  # a ConfigError (a size FLUX cannot build) or a bad value type
            raise AdapterError(f"flux config: {e}") from None
        used = set(CONFIG_KEYS) | set(SAMPLE_KEYS) | {"patch_size", "out_channels"} | NEUTRAL
        return args, used & set(cfg)

    def hf_config(self, args: TransformerArgs) -> dict[str, Any]:
        """The diffusers config.json of these args (the sample sizes kept beside, under their own names)."""
        fc = flux_config(args)
        cfg: dict[str, Any] = {"_class_name": self.hf_class, "model_type": "flux", "patch_size": 1, "out_channels": None}
        for key, field in CONFIG_KEYS.items():
            value = getattr(fc, field)
            cfg[key] = list(value) if isinstance(value, tuple) else value
        cfg |= {k: getattr(fc, k) for k in SAMPLE_KEYS}
        return cfg

    def unconsumed_keys(self, cfg: dict[str, Any]) -> list[str]:
        _, used = self.args_from_hf(cfg)
        return sorted(set(cfg) - used - NEUTRAL)

