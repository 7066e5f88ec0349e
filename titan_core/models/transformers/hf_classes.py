"""transformers' own classes for a config dict: imported only here, and only when asked for.

titan_core imports without transformers (the [hf] extra); the transformers family needs it
and says so with a ConfigError (exit 2 from the entry points), never an ImportError.
Nothing is downloaded and no code outside transformers runs: the config class comes from
transformers' registry by `model_type`, and the model class from its causal-LM mapping
(`trust_remote_code` is never set).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

from titan_core.config.loader import ConfigError
from titan_core.models.common.mapping_errors import AdapterError, ArchitectureError
from titan_core.models.common.validate import refusal
from titan_core.runtime.quiet import TORCHAO_IMPORT, quiet_loggers


def require_transformers():
    """The transformers module, or a ConfigError saying how to install it."""
    try:
        import transformers  # lazy: the [hf] extra, imported on first use (see the module docstring)
    except ImportError:
        raise ConfigError(
            'model.family = "transformers" runs a model from HF transformers, which is not installed: '
            "pip install 'titan-onboard[hf]'"
        ) from None
    # building any model imports transformers' quantizers, and with them torchao when it is
    # installed (the [float8] extra): imported here first, its import-time warnings stay out of the run
    with quiet_loggers(*TORCHAO_IMPORT):
        import transformers.quantizers.auto  # noqa: F401  # lazy: the [hf] extra, under quiet loggers
    return transformers


def config_object(cfg: dict[str, Any]):
    """transformers' config class for cfg['model_type'], filled from `cfg`.

    AdapterError (a config the path cannot run): no model_type, one transformers does not
    know, one without a causal-LM class (an encoder-decoder's, T5's, is said to be one), or
    values the config class refuses: ArchitectureError naming the field where its validation
    names one.
    """
    require_transformers()  # then its registries, lazily: the [hf] extra
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # lazy: the [hf] extra
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # lazy: the [hf] extra

    model_type = cfg.get("model_type")
    if not model_type:
        raise AdapterError("config.json has no model_type: transformers cannot pick a class for it")
    if model_type not in CONFIG_MAPPING:
        raise AdapterError(f"transformers has no model_type '{model_type}' (a newer transformers may have it)")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        kind = " (an encoder-decoder model: the path trains causal LMs, a decoder predicting the next token)"
        pair = kind if _encoder_decoder(CONFIG_MAPPING[model_type], cfg) else ""
        raise AdapterError(f"transformers has no causal-LM class for model_type '{model_type}'{pair}")
    cls = CONFIG_MAPPING[model_type]
    try:
        with quiet_transformers():
            return cls.from_dict(dict(cfg))
    except Exception as e:  # noqa: BLE001 -- whatever it raises: huggingface_hub's strict errors are no ValueError
        raise _refused(cls.__name__, cfg, e) from None


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings held back inside: what it says of a config it still reads (a token id
    past the vocabulary) is checked and said by titan_core, on one line, or not at all."""
    from transformers.utils import logging  # lazy: the [hf] extra

    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)


def _encoder_decoder(cls, cfg: dict[str, Any]) -> bool:
    """Whether `cfg` (or, where it does not say, its config class's default) is an encoder-decoder's."""
    if "is_encoder_decoder" in cfg:
        return cfg["is_encoder_decoder"] is True
    try:
        return getattr(cls(), "is_encoder_decoder", False) is True
    except Exception:  # noqa: BLE001 -- a class without usable defaults: nothing more to say about it
        return False


def _refused(cls: str, cfg: dict[str, Any], e: Exception) -> AdapterError:
    """The error for a config class refusing `cfg`: one line naming the field where its
    validation names one (`Validation error for field 'x'`, its cause after it)."""
    field = re.match(r"Validation error for field '([^']+)'", str(e))
    cause = e.__cause__ or e
    said = " ".join(f"{type(cause).__name__}: {cause}".split())
    if field and field[1] in cfg:
        key = field[1]
        return ArchitectureError(refusal(key, cfg[key], f"transformers' {cls} refuses it ({said})"), (key,))
    return AdapterError(f"transformers' {cls} refuses config.json: {' '.join(str(e).split())}")


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
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING  # lazy: the [hf] extra

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
