"""The tiny config of a `model_type`, from transformers' own config class: 2 layers, hidden 64,
vocab 256, experts and windows shrunk where the class has them; `NotProbed` with why where the
class cannot be built that small (a composite multimodal config, a class that refuses the sizes)."""

from __future__ import annotations

from typing import Any

from onboard.errors import BadInput
from titan_core.models.transformers.hf_classes import require_transformers

SIZES = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "head_dim": 16,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
}
"""Config fields set when the class has them (and they are set in its defaults)."""
SLIDING_WINDOW = 32
"""Below the probe's seq_len (SEQ_LEN), so a windowed model really masks."""
SEQ_LEN = 64
"""The recipe's training.seq_len in the probe's workspace (new-model writes 128)."""
MAX_PARAMS = 20_000_000
"""A tiny config still above this has sizes the probe does not know how to shrink: not probed."""
REASON_CHARS = 200


def one_line(text: str) -> str:
    """`text` as one table-safe line of at most REASON_CHARS characters."""
    line = " ".join(str(text).split()).replace("|", "/")
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 3] + "..."


class NotProbed(Exception):
    """The probe cannot build a tiny config of this model_type; the message says why."""


def causal_lm_types() -> list[str]:
    """Every model_type transformers maps to a causal-LM class, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # lazy: an optional extra

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_types(model_types: list[str]) -> list[str]:
    """`model_types` if transformers has a causal-LM class for each; BadInput naming the first that has none."""
    require_transformers()
    known = causal_lm_types()
    for mt in model_types:
        if mt not in known:
            close = [k for k in known if mt.lower() in k][:5]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise BadInput(f"MODEL_TYPE '{mt}': transformers has no causal-LM class of that model_type{hint}")
    return list(dict.fromkeys(model_types))


def tiny_config(model_type: str) -> dict[str, Any]:
    """The config dict of a tiny `model_type`, from its transformers config class; NotProbed if it cannot be."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # lazy: an optional extra

    if model_type not in CONFIG_MAPPING:
        raise NotProbed(f"transformers has no config class for '{model_type}'")
    cls = CONFIG_MAPPING[model_type]
    try:
        default = cls()
    except Exception as e:  # noqa: BLE001 -- any refusal of the class is the reason
        raise NotProbed(f"{cls.__name__}() cannot be built offline: {type(e).__name__}: {e}") from None
    if default.get_text_config() is not default:
        raise NotProbed(f"{cls.__name__} is composite (a text config inside); the probe builds text-only configs")
    kw = {k: v for k, v in SIZES.items() if getattr(default, k, None) is not None}
    if getattr(default, "sliding_window", None):
        kw["sliding_window"] = SLIDING_WINDOW
    kw.update(_small_vocab_and_no_dropout(default.to_dict()))
    try:
        cfg = cls(**kw).to_dict()
    except Exception as e:  # noqa: BLE001
        raise NotProbed(f"{cls.__name__} refuses the tiny sizes: {type(e).__name__}: {e}") from None
    cfg["model_type"] = model_type
    return cfg


def _small_vocab_and_no_dropout(default: dict[str, Any]) -> dict[str, Any]:
    """Special tokens of the full vocabulary would index past the tiny one; dropout off (GPT-2's
    attn_pdrop / resid_pdrop / embd_pdrop default to 0.1): pretraining's usual setting, and the
    probe asks whether the path runs the architecture, not whether kernels do dropout."""
    top = SIZES["vocab_size"] - 1
    kw: dict[str, Any] = {}
    for k, v in default.items():
        if ("dropout" in k or k.endswith("pdrop")) and isinstance(v, float) and v > 0:
            kw[k] = 0.0
        if k.endswith("_token_id") and isinstance(v, int) and v > top:
            kw[k] = top
        elif k.endswith("_token_id") and isinstance(v, list):
            kw[k] = [t if t <= top else top for t in v]
    return kw
