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
    """The causal-LM class the path builds for `config` (e.g. LlamaForCausalLM; see `causal_lm_parts`)."""
    return causal_lm_parts(config)[0]


def text_config(config):
    """`config.get_text_config()`, or AdapterError where transformers finds none or several."""
    try:
        return config.get_text_config()
    except ValueError as e:  # e.g. a text encoder and a decoder (MusicGen): which one is the LM is not said
        raise AdapterError(f"{type(config).__name__} holds no single text config: {e}") from None


def causal_lm_parts(config) -> tuple[type, Any]:
    """(class, the config it is built from) of the causal LM for `config`.

    A composite config (a text config inside, beside vision or audio ones: Gemma-3, Mllama,
    Qwen3.5) gives its text model: the causal-LM class of the text config where transformers maps
    one (Gemma3TextConfig -> Gemma3ForCausalLM), else the class mapped to the composite when it is
    built from the text config (MllamaForCausalLM). Otherwise the class mapped to the config,
    built from it whole."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING  # the [hf] extra

    text = text_config(config)
    cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    if text is config:
        return cls, config
    if type(text) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(text)], text
    if isinstance(text, getattr(cls, "config_class", ())) and not isinstance(config, cls.config_class):
        return cls, text
    return cls, config


def text_config_key(config) -> str | None:
    """The key of a composite config.json that holds its text config (`text_config` mostly), or
    None for a config that is its own text config."""
    text = text_config(config)
    if text is config:
        return None
    return next((k for k, v in vars(config).items() if v is text), None)
