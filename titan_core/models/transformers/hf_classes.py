"""transformers' own classes for a config dict: imported only here, and only when asked for.

titan_core imports without transformers (the [hf] extra); the transformers family needs it
and says so with a ConfigError (exit 2 from the entry points), never an ImportError.
Nothing is downloaded and no code outside transformers runs: the config class comes from
transformers' registry by `model_type`, and the model class from its causal-LM mapping
(`trust_remote_code` is never set).
"""

from __future__ import annotations

from typing import Any

from titan_core.config.loader import ConfigError
from titan_core.models.common.mapping_errors import AdapterError


def require_transformers():
    """The transformers module, or a ConfigError saying how to install it."""
    try:
        import transformers  # the [hf] extra, imported on first use (see the module docstring)
    except ImportError:
        raise ConfigError(
            'model.family = "transformers" runs a model from HF transformers, which is not installed: '
            "pip install 'titan-onboard[hf]'"
        ) from None
    return transformers


def config_object(cfg: dict[str, Any]):
    """transformers' config class for cfg['model_type'], filled from `cfg`.

    AdapterError (a config the path cannot run): no model_type, one transformers does not
    know, one without a causal-LM class, or values the config class refuses.
    """
    require_transformers()  # then its registries, lazily: the [hf] extra
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = cfg.get("model_type")
    if not model_type:
        raise AdapterError("config.json has no model_type: transformers cannot pick a class for it")
    if model_type not in CONFIG_MAPPING:
        raise AdapterError(f"transformers has no model_type '{model_type}' (a newer transformers may have it)")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise AdapterError(f"transformers has no causal-LM class for model_type '{model_type}'")
    try:
        return CONFIG_MAPPING[model_type].from_dict(dict(cfg))
    except (ValueError, TypeError, KeyError) as e:
        raise AdapterError(f"transformers' {CONFIG_MAPPING[model_type].__name__} refuses config.json: {e}") from None


def causal_lm_class(config) -> type:
    """The causal-LM class transformers maps `config`'s type to (e.g. LlamaForCausalLM)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING  # the [hf] extra

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
