"""The accepted values of model config fields, and the structural rules on model args.

Bounds (one place for all of them: the MAX_* constants and the `Accepts` rules below). Every
number read from a config is checked for its type (an integer where one is meant: not 4.0,
not 4.5, not JSON `true`, not a text), finiteness (no NaN or Infinity) and range (sizes >= 1
and at most MAX_*, so 1e30 is refused where it is read, not as an overflow in torch). A refusal
is one line: `<field> = <value> is not accepted; <what is accepted>` (the value as the JSON
spells it). `HF_ACCEPTS` holds the rules of the HF config keys the families read (the
adapter's `take` checks each value it reads); `NATIVE_ACCEPTS` those of TransformerArgs,
which `check_args` applies to every model's args; FLUX's keys use the same rules
(models/flux/adapter.py).

A size of zero, a fraction, heads that do not divide the width or key/value heads that do
not divide the heads fail much later and far from the cause (a ZeroDivisionError in the
args, a shape error in the first forward, a refusal inside transformers at parity). These
rules refuse them where the args are made: `HFAdapter.args_from_hf` checks a config's
values under their HF names, `apply_model_overrides` checks every resolved TransformerArgs
(the trainer's path, so a recipe edited by hand is refused too).

The structural rules, on native field names (the message uses the name the user wrote):
- every field in NATIVE_ACCEPTS holds an accepted value; a sliding_window may be null;
  dense_layers are integers >= 0;
- n_kv_heads divides n_heads (each key/value head serves an equal group of query heads);
- without an explicit head_dim (derived as dim // n_heads), n_heads divides dim; some
  upstream classes (LlamaConfig) demand it even with one (`width_free=False`);
- head_dim is even when any layer uses RoPE (it rotates channel pairs, half-split);
- with experts: 1 <= top_k <= n_experts and moe_hidden_dim >= 1.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, fields
from typing import Any, Mapping

from titan_core.models.common.args import ModelArgs, TransformerArgs
from titan_core.models.common.mapping_errors import AdapterError, ArchitectureError

MAX_WIDTH = 2**20
"""Largest width or head count (hidden, MLP, head and expert widths): 1,048,576, some 20 times
the widest MLP of a released model (Llama-3.1-405B's 53,248)."""
MAX_LAYERS = 2**12
"""Most layers (or blocks): 4096, some 30 times the deepest released model's."""
MAX_VOCAB = 2**24
"""Largest vocabulary: 16,777,216, some 60 times the largest released one (~262k)."""
MAX_POSITIONS = 2**30
"""Longest context (positions, windows, tokens per sample): about 1.07e9, some 100 times the
longest a released model declares (10M)."""
MAX_EXPERTS = 2**16
"""Most experts (or experts per token): 65,536 (transformers' own Doge defaults to 16,384)."""
MAX_SCALE = 1e15
"""Largest RoPE base, scaling factor, soft-cap or loss coefficient: far past any in use (RoPE
bases reach 1e7), yet a finite float32 number."""


@dataclass(frozen=True)
class Accepts:
    """The values one config field accepts: `kind` int (a JSON integer, never a bool), number
    (finite, int or float, never a bool) or bool (JSON true/false, never a text or a 0/1);
    numbers from `low` (excluded when `above`) to `high`; `why` is said after the range."""

    kind: str
    low: float = 0
    high: float = 0
    above: bool = False
    why: str = ""

    def ok(self, v: Any) -> bool:
        if self.kind == "bool":
            return isinstance(v, bool)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if self.kind == "int" and not isinstance(v, int):
            return False
        if isinstance(v, float) and not math.isfinite(v):
            return False
        return (v > self.low if self.above else v >= self.low) and v <= self.high

    @property
    def text(self) -> str:
        if self.kind == "bool":
            said = "true or false"
        elif self.kind == "int":
            said = f"exactly {self.low}" if self.low == self.high else f"an integer from {self.low} to {self.high}"
        else:
            said = f"a finite number {'>' if self.above else '>='} {self.low:g} and <= {self.high:g}"
        return f"{said} ({self.why})" if self.why else said


SIZE = Accepts("int", 1, MAX_WIDTH)
SIZE_OR_0 = Accepts("int", 0, MAX_WIDTH, why="0 for none")
LAYERS = Accepts("int", 1, MAX_LAYERS)
LAYERS_OR_0 = Accepts("int", 0, MAX_LAYERS)
VOCAB = Accepts("int", 1, MAX_VOCAB)
POSITIONS = Accepts("int", 1, MAX_POSITIONS)
WINDOW = Accepts("int", 1, MAX_POSITIONS, why="tokens in the window; null for no window")
EXPERTS = Accepts("int", 1, MAX_EXPERTS)
EXPERTS_OR_0 = Accepts("int", 0, MAX_EXPERTS, why="0 for a dense model")
EPS = Accepts("number", 0, 1)
SCALE = Accepts("number", 0, MAX_SCALE, above=True)
COEF = Accepts("number", 0, MAX_SCALE)
FRACTION = Accepts("number", 0, 1, above=True)
INIT_STD = Accepts("number", 0, 10, above=True, why="the standard deviation of the initial weights")
BOOL = Accepts("bool")

NATIVE_ACCEPTS: dict[str, Accepts] = {
    "dim": SIZE, "n_layers": LAYERS, "n_heads": SIZE, "n_kv_heads": SIZE, "head_dim": SIZE, "vocab_size": VOCAB,
    "ffn_hidden_dim": SIZE, "max_seq_len": POSITIONS, "moe_every": LAYERS, "n_experts": EXPERTS_OR_0,
    "moe_hidden_dim": SIZE_OR_0, "shared_expert_hidden_dim": SIZE_OR_0, "global_every": LAYERS_OR_0,
    "rope_skip_every": LAYERS_OR_0, "sliding_window": WINDOW, "norm_eps": EPS, "rope_theta": SCALE,
    "init_std": INIT_STD, "final_softcap": SCALE, "aux_loss_coef": COEF,
}  # fmt: skip
"""TransformerArgs fields -> what they accept (None: the field's default, or no window / cap)."""
HF_ACCEPTS: dict[str, Accepts] = {
    "hidden_size": SIZE, "num_hidden_layers": LAYERS, "num_attention_heads": SIZE, "num_key_value_heads": SIZE,
    "head_dim": SIZE, "vocab_size": VOCAB, "intermediate_size": SIZE, "rms_norm_eps": EPS,
    "max_position_embeddings": POSITIONS, "initializer_range": INIT_STD, "rope_theta": SCALE,
    "tie_word_embeddings": BOOL, "mlp_bias": BOOL, "attention_bias": BOOL,
    # rope_parameters / rope_scaling entries, by their own key
    "factor": SCALE, "low_freq_factor": SCALE, "high_freq_factor": SCALE, "original_max_position_embeddings": POSITIONS,
    "partial_rotary_factor": FRACTION,
    # 0 as well: Qwen's window is read only with use_sliding_window (transformers' own Qwen2-MoE default is 0)
    "sliding_window": Accepts("int", 0, MAX_POSITIONS, why="tokens in the window; null for no window"),
    "use_sliding_window": BOOL, "max_window_layers": LAYERS_OR_0,
    "num_experts": EXPERTS, "num_local_experts": EXPERTS, "num_experts_per_tok": EXPERTS,
    "moe_intermediate_size": SIZE, "norm_topk_prob": BOOL, "decoder_sparse_step": LAYERS,
    "router_aux_loss_coef": COEF, "output_router_logits": BOOL,
    "no_rope_layer_interval": LAYERS_OR_0, "final_logit_softcapping": SCALE, "use_qk_norm": BOOL,
}  # fmt: skip
"""HF config keys the families read -> what they accept (a nested key by its own name)."""
DEFAULTS = {f.name: f.default for f in fields(TransformerArgs) if f.default is not MISSING}


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _show(v: Any) -> str:
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return repr(v)


def refusal(name: str, value: Any, accepted: str) -> str:
    """The one line a refused value gets: `<name> = <value as JSON> is not accepted; <accepted>`."""
    return f"{name} = {_show(value)} is not accepted; {accepted}"


def check_value(name: str, value: Any, accepts: Accepts, *, null_ok: bool = True, at: tuple[str, ...] = ()) -> None:
    """ArchitectureError (`refusal`) when `value` of the field called `name` is not what
    `accepts` accepts; null passes when `null_ok` (an HF config's null is its default). A
    list or a table where a number is meant is a plain AdapterError: another layout of
    config (per-layer sizes), which a port may implement."""
    if value is None and null_ok or accepts.ok(value):
        return
    if isinstance(value, (list, dict)) and accepts.kind != "bool":
        raise AdapterError(f"{refusal(name, value, accepts.text)} (this family reads one number here)")
    raise ArchitectureError(refusal(name, value, accepts.text), at or (name,))


def check_hf_value(key: str, value: Any) -> None:
    """`check_value` for the HF config key `key` (`parent.child` for a nested one) by HF_ACCEPTS;
    a key without a rule there (a text, a list of layer types) passes."""
    accepts = HF_ACCEPTS.get(key.rpartition(".")[2])
    if accepts is not None:
        check_value(key, value, accepts)


def check_pad_id(value: Any, vocab_size: int, name: str = "pad_token_id") -> None:
    """A pad id is null or a token of the vocabulary (the embedding's padding_idx; transformers
    says the same of it): ArchitectureError otherwise (a list, a text, an id past the vocabulary)."""
    if value is None or is_int(value) and 0 <= value < vocab_size:
        return
    accepted = f"null or a token id from 0 to {vocab_size - 1} (below vocab_size = {vocab_size})"
    raise ArchitectureError(refusal(name, value, accepted), (name,))


def check_args(values: Mapping[str, Any], *, names: Mapping[str, str] | None = None, width_free: bool = True) -> None:
    """Raise ArchitectureError for the first rule `values` break (see the module docstring);
    a plain AdapterError where a list or a table stands for a number (another config layout).

    `values` maps native fields to values; one absent or None takes its TransformerArgs
    default (n_kv_heads None: n_heads; head_dim None: dim // n_heads, which then needs
    n_heads to divide dim). `names` maps a native field to what the user called it (an HF
    key, `model.overrides.x`) for the message. Only the fields present are checked for
    their own rule, so a partial set (the sizes, before a family reads the rest) can be
    checked first.
    """
    names = names or {}
    given = {k: v for k, v in values.items() if v is not None}

    def name(f: str) -> str:
        return names.get(f, f)

    def fail(rule: str, *at: str) -> None:
        first = at[0]
        shown = given[first] if first in given else DEFAULTS.get(first)
        message = refusal(name(first), shown, rule) + ("" if first in given else " (the default)")
        raise ArchitectureError(message, at)

    for f, accepts in NATIVE_ACCEPTS.items():
        if f in given:
            check_value(name(f), given[f], accepts, at=(f,))
    dense = given.get("dense_layers", [])
    if not isinstance(dense, (list, tuple)):
        raise AdapterError(f"{name('dense_layers')} = {_show(dense)}: must be a list of layer indices")
    if not all(is_int(i) and 0 <= i < MAX_LAYERS for i in dense):
        accepted = f"a list of layer indices (integers from 0 to {MAX_LAYERS - 1})"
        raise ArchitectureError(refusal(name("dense_layers"), dense, accepted), ("dense_layers",))

    n_heads = given.get("n_heads")
    if n_heads is None:
        return  # the head rules need the head count; a partial check without it ends here
    kv = given.get("n_kv_heads", n_heads)
    if n_heads % kv:
        fail(
            f"must be a multiple of {name('n_kv_heads')} = {kv} (each key/value head serves an equal group "
            "of query heads)",
            "n_heads",
            "n_kv_heads",
        )
    dim, head_dim = given.get("dim"), given.get("head_dim")
    if dim is not None and dim % n_heads and (head_dim is None or not width_free):
        unless = (
            "unless head_dim is given" if width_free else "(its upstream config class requires it, head_dim or not)"
        )
        fail(f"must be a multiple of {name('n_heads')} = {n_heads} {unless}", "dim", "n_heads")
    no_rope_anywhere = given.get("rope_skip_every", 0) == 1
    if dim is not None and not no_rope_anywhere:
        rule = "must be even (RoPE rotates pairs of channels)"
        if head_dim is not None and head_dim % 2:
            fail(rule, "head_dim")
        if head_dim is None and (dim // n_heads) % 2:
            derived = f"head_dim = {name('dim')} // {name('n_heads')}"
            raise ArchitectureError(refusal(derived, dim // n_heads, rule), ("dim", "n_heads"))
    n_experts = given.get("n_experts", 0)
    if n_experts:
        top_k = given.get("top_k", DEFAULTS["top_k"])
        check_value(name("top_k"), top_k, EXPERTS, null_ok=False, at=("top_k",))
        if top_k > n_experts:
            fail(
                f"must be at most {name('n_experts')} = {n_experts} (each token picks that many distinct experts)",
                "top_k",
                "n_experts",
            )
        if given.get("moe_hidden_dim", DEFAULTS["moe_hidden_dim"]) < 1:
            fail("must be >= 1 when there are experts", "moe_hidden_dim")


def validate_args(args: ModelArgs, *, names: Mapping[str, str] | None = None) -> None:
    """`check_args` on resolved args of any kind (their `native_values`; a size another type derives
    is named in its words, `args.derived`). head_dim is always filled in by then, so the width
    rule (n_heads divides dim) is left to the config reading, which knows whether it was given."""
    check_args(args.native_values(), names={**args.derived, **(names or {})})
