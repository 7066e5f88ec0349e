"""FLUX's own sizes, beside the TransformerArgs summary every family shares.

A FLUX transformer is not a decoder, but the trainer, the memory estimate and the tools above
read a model's size from TransformerArgs. So a flux model's args hold the summary they
understand (`dim`, `n_layers` = double + single blocks, heads, `ffn_hidden_dim` = the MLP
width, `vocab_size` = the predicted patch width, `max_seq_len` = text + image tokens) and
the rest travels as `args.extra["flux"]`, a plain table (overrides merge into it), read
back here as a `FluxConfig`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING

from titan_core.config.loader import ConfigError
from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.validate import BOOL, LAYERS_OR_0, POSITIONS, SCALE, SIZE, refusal

if TYPE_CHECKING:
    from titan_core.models.common.protocol import TrainableModel

EXTRA_KEY = "flux"
SUMMARY_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "ffn_hidden_dim", "max_seq_len", "rope_theta")
"""The TransformerArgs fields a FluxConfig determines."""


@dataclass(frozen=True, kw_only=True)
class FluxConfig:
    in_channels: int = 64
    """Width of one packed latent token (16 latent channels x a 2x2 patch in FLUX.1)."""
    n_double_layers: int = 19
    """Double-stream blocks: image and text keep their own weights and attend jointly."""
    n_single_layers: int = 38
    """Single-stream blocks: one weight set over the concatenated text + image tokens."""
    n_heads: int = 24
    """Attention heads."""
    head_dim: int = 128
    """Per-head width; the model width is n_heads * head_dim."""
    mlp_ratio: float = 4.0
    """MLP hidden width over the model width."""
    joint_attention_dim: int = 4096
    """Width of the text encoder's per-token embeddings (T5-XXL's 4096 in FLUX.1)."""
    pooled_projection_dim: int = 768
    """Width of the pooled text embedding (CLIP-L's 768 in FLUX.1)."""
    guidance_embeds: bool = False
    """A guidance-distilled model (FLUX.1-dev) embeds the guidance scale beside the timestep."""
    axes_dims_rope: tuple[int, int, int] = (16, 56, 56)
    """RoPE widths of the three position axes (text/index, row, column); they sum to head_dim."""
    rope_theta: float = 10000.0
    """RoPE base."""
    latent_height: int = 64
    """Packed latent tokens per image column (a 1024-px image is 64 x 64 tokens)."""
    latent_width: int = 64
    """Packed latent tokens per image row."""
    text_len: int = 512
    """Text tokens per sample (T5's max_sequence_length)."""

    @property
    def dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def mlp_hidden_dim(self) -> int:
        return int(self.dim * self.mlp_ratio)

    @property
    def image_tokens(self) -> int:
        return self.latent_height * self.latent_width

    def check(self) -> None:
        """ConfigError naming the first field that cannot build a model (a diffusers config is
        checked in its own words before it gets here: models/flux/adapter.py)."""
        for f, accepts in ACCEPTS.items():
            if not accepts.ok(getattr(self, f)):
                raise ConfigError("flux " + refusal(f, getattr(self, f), accepts.text))
        if self.n_double_layers < 0 or self.n_single_layers < 0 or self.n_double_layers + self.n_single_layers < 1:
            raise ConfigError(
                f"flux needs at least one block: n_double_layers={self.n_double_layers}, "
                f"n_single_layers={self.n_single_layers}"
            )
        if len(self.axes_dims_rope) != 3 or any(d % 2 for d in self.axes_dims_rope):
            raise ConfigError(f"flux axes_dims_rope must be three even widths, got {list(self.axes_dims_rope)}")
        if sum(self.axes_dims_rope) != self.head_dim:
            raise ConfigError(
                f"flux axes_dims_rope {list(self.axes_dims_rope)} sum to {sum(self.axes_dims_rope)}, "
                f"not head_dim {self.head_dim}"
            )

    def to_args(self, *, init_std: float = 0.02) -> TransformerArgs:
        """The TransformerArgs summary with this config in its extra."""
        self.check()
        table = asdict(self)
        table["axes_dims_rope"] = list(self.axes_dims_rope)
        return TransformerArgs(
            dim=self.dim,
            n_layers=self.n_double_layers + self.n_single_layers,
            n_heads=self.n_heads,
            head_dim=self.head_dim,
            vocab_size=self.in_channels,
            ffn_hidden_dim=self.mlp_hidden_dim,
            norm_eps=1e-6,
            rope_theta=self.rope_theta,
            max_seq_len=self.text_len + self.image_tokens,
            init_std=init_std,
            extra={EXTRA_KEY: table},
        )


ACCEPTS = {
    "in_channels": SIZE, "n_double_layers": LAYERS_OR_0, "n_single_layers": LAYERS_OR_0, "n_heads": SIZE,
    "head_dim": SIZE, "mlp_ratio": SCALE, "joint_attention_dim": SIZE, "pooled_projection_dim": SIZE,
    "guidance_embeds": BOOL, "rope_theta": SCALE, "latent_height": POSITIONS, "latent_width": POSITIONS,
    "text_len": POSITIONS,
}  # fmt: skip
"""What each FluxConfig field accepts (the bounds are models/common/validate.py's)."""


def _table_config(args: TransformerArgs) -> FluxConfig:
    """The FluxConfig the flux table of `args.extra` holds, unchecked against the summary."""
    table = args.extra.get(EXTRA_KEY)
    if not isinstance(table, dict):
        raise ConfigError(f"these model args carry no extra['{EXTRA_KEY}'] table: they are not a flux model's")
    known = {f.name for f in fields(FluxConfig)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"unknown flux field(s) {unknown} in model.overrides.extra.{EXTRA_KEY}")
    values = dict(table)
    if "axes_dims_rope" in values:
        values["axes_dims_rope"] = tuple(values["axes_dims_rope"])
    return FluxConfig(**values)


def flux_config(args: TransformerArgs) -> FluxConfig:
    """The FluxConfig in `args.extra` (ConfigError for args that are not a flux model's)."""
    cfg = _table_config(args)
    summary = cfg.to_args(init_std=args.init_std)
    moved = [f for f in SUMMARY_FIELDS if getattr(args, f) != getattr(summary, f)]
    if moved:
        # the model reads only the table: a summary field changed alone would be silently ignored
        raise ConfigError(
            f"flux model args {', '.join(f'{f}={getattr(args, f)!r}' for f in moved)} disagree with the flux table "
            f"({', '.join(f'{f}={getattr(summary, f)!r}' for f in moved)}); change a flux model's sizes in "
            f"model.overrides.extra.{EXTRA_KEY} (e.g. n_double_layers, n_heads, latent_height)"
        )
    return cfg


def resync_summary(args: TransformerArgs, overrides: dict) -> TransformerArgs:
    """`args` with the summary re-derived from its flux table when `overrides` changed the table
    (`model.overrides.extra.flux`) and no summary field: the sizes a user changes there are the model's.

    A summary field given by hand is left as given, so `flux_config` still refuses a mismatch."""
    extra = overrides.get("extra")
    if not isinstance(extra, dict) or EXTRA_KEY not in extra or set(SUMMARY_FIELDS) & set(overrides):
        return args
    summary = _table_config(args).to_args(init_std=args.init_std)
    return replace(args, **{f: getattr(summary, f) for f in SUMMARY_FIELDS}, extra={**args.extra, **summary.extra})


def flux_of(model: TrainableModel) -> FluxConfig | None:
    """The FluxConfig of a flux model (its samples' shape), None for any other model: read from
    its args, as the flux model built it (`flux_of_args`)."""
    return flux_of_args(model.args)


def flux_of_args(args: TransformerArgs) -> FluxConfig | None:
    """The FluxConfig these model args carry, None for a language model's args."""
    return flux_config(args) if isinstance(args.extra.get(EXTRA_KEY), dict) else None
