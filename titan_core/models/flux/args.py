"""FLUX's args: its own sizes, and the summary every model's args give (ModelArgs) derived from them.

A FLUX transformer is not a decoder, but the trainer, the memory model and the tools around it
read a model's size off its args: `dim`, `n_layers` (double + single blocks), heads,
`ffn_hidden_dim` (the MLP width), `vocab_size` (the predicted patch width) and `max_seq_len`
(text + image tokens) are properties here, so they cannot disagree with the fields the model is
built from. A model override names FLUX's own fields (`n_single_layers = 3`); one of a derived
size is refused, naming the fields it follows from (`derived`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from titan_core.config.loader import ConfigError
from titan_core.models.common.args import ModelArgs
from titan_core.models.common.kind import InitialLoss, ModelKind, SampleSpec
from titan_core.models.common.validate import BOOL, INIT_STD, LAYERS_OR_0, POSITIONS, SCALE, SIZE, is_int, refusal
from titan_core.models.flux.samples import FlowLoader

FLOW = ModelKind(
    name="flow", upstream="diffusers", loss_head=False, causal=False, context_parallel=False,
    zero_output_at_init=True,
)  # fmt: skip
"""A rectified-flow diffusion transformer: diffusers' class is its upstream, its loss is the MSE of
the predicted velocity (no cross-entropy head), its joint image/text attention is bidirectional
and not split over cp ranks, and adaLN-Zero starts every block as the identity and the output at 0."""
FLOW_INITIAL_LOSS = 2.0
"""E[(noise - latents)^2] for independent unit-normal noise and latents: a flow model's loss
while its zero-initialised output predicts 0."""
SUMMARY_FIELDS = (
    "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "ffn_hidden_dim", "max_seq_len", "rope_theta",
)  # fmt: skip
"""The sizes every model's args give, as a flux model's derive or hold them."""


@dataclass(frozen=True, kw_only=True)
class FluxArgs(ModelArgs):
    """A FLUX.1-style transformer's architecture and sample size (models/flux/model.py builds it)."""

    kind = FLOW
    derived = MappingProxyType({
        "dim": "n_heads x head_dim", "n_layers": "n_double_layers + n_single_layers", "n_kv_heads": "n_heads",
        "vocab_size": "in_channels", "ffn_hidden_dim": "mlp_ratio x n_heads x head_dim",
        "max_seq_len": "text_len + latent_height x latent_width",
    })  # fmt: skip
    norm_eps = 1e-6

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
    init_std: float = 0.02
    """Std of the normal init of the weights (the modulation and the output projection start at zero)."""

    def __post_init__(self) -> None:
        if isinstance(self.axes_dims_rope, list):  # a TOML or JSON array: a tuple, so args compare and hash as values
            object.__setattr__(self, "axes_dims_rope", tuple(self.axes_dims_rope))
        self._check_fields()

    @property
    def dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def n_layers(self) -> int:
        return self.n_double_layers + self.n_single_layers

    @property
    def n_kv_heads(self) -> int:
        return self.n_heads

    @property
    def vocab_size(self) -> int:
        return self.in_channels

    @property
    def mlp_hidden_dim(self) -> int:
        return int(self.dim * self.mlp_ratio)

    @property
    def ffn_hidden_dim(self) -> int:
        return self.mlp_hidden_dim

    @property
    def image_tokens(self) -> int:
        return self.latent_height * self.latent_width

    @property
    def max_seq_len(self) -> int:
        return self.text_len + self.image_tokens

    def _check_fields(self) -> None:
        """ConfigError naming the first field that cannot build a model (a diffusers config is
        checked in its own words before it gets here: models/flux/adapter.py)."""
        for f, accepts in ACCEPTS.items():
            if not accepts.ok(getattr(self, f)):
                raise ConfigError("flux " + refusal(f, getattr(self, f), accepts.text))
        if self.n_double_layers + self.n_single_layers < 1:
            raise ConfigError(
                f"flux needs at least one block: n_double_layers={self.n_double_layers}, "
                f"n_single_layers={self.n_single_layers}"
            )
        axes = self.axes_dims_rope
        if not isinstance(axes, tuple) or len(axes) != 3 or not all(is_int(d) and d >= 0 and d % 2 == 0 for d in axes):
            raise ConfigError(f"flux axes_dims_rope must be three even widths, got {axes!r}")
        if sum(self.axes_dims_rope) != self.head_dim:
            raise ConfigError(
                f"flux axes_dims_rope {list(self.axes_dims_rope)} sum to {sum(self.axes_dims_rope)}, "
                f"not head_dim {self.head_dim}"
            )

    def native_values(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in SUMMARY_FIELDS} | {"norm_eps": self.norm_eps, "init_std": self.init_std}

    def describe(self) -> str:
        return (
            f"FLUX: {self.n_double_layers} double-stream + {self.n_single_layers} single-stream blocks, "
            f"dim {self.dim}, {self.n_heads} heads, {self.image_tokens} image + {self.text_len} text tokens per sample"
            + (", guidance embedded" if self.guidance_embeds else "")
        )

    def sample_spec(self) -> SampleSpec:
        forward = ("timesteps", "text", "pooled") + (("guidance",) if self.guidance_embeds else ())
        return SampleSpec(
            tokens="clean packed latents [batch, image_tokens, in_channels]", inputs=("noise", *forward),
            forward_inputs=forward, packed=False, seq_len=self.image_tokens,
        )  # fmt: skip

    def initial_loss(self) -> InitialLoss:
        return InitialLoss(FLOW_INITIAL_LOSS, "mean square of the velocity target of unit-normal samples (flow model)")

    def own_samples(
        self, *, seed: int, batch_size: int, seq_len: int, dp_rank: int = 0, dp_world: int = 1,
        repeat_batch: bool = False,
    ) -> FlowLoader:  # fmt: skip
        return FlowLoader(flux=self, seed=seed, batch_size=batch_size, seq_len=seq_len, dp_rank=dp_rank,
                          dp_world=dp_world, repeat_batch=repeat_batch)  # fmt: skip


ACCEPTS = {
    "in_channels": SIZE, "n_double_layers": LAYERS_OR_0, "n_single_layers": LAYERS_OR_0, "n_heads": SIZE,
    "head_dim": SIZE, "mlp_ratio": SCALE, "joint_attention_dim": SIZE, "pooled_projection_dim": SIZE,
    "guidance_embeds": BOOL, "rope_theta": SCALE, "latent_height": POSITIONS, "latent_width": POSITIONS,
    "text_len": POSITIONS, "init_std": INIT_STD,
}  # fmt: skip
"""What each FluxArgs field accepts (the bounds are models/common/validate.py's)."""
