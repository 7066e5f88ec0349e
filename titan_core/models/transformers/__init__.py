"""The transformers path: any HF causal LM transformers ships, run by titan_core as a family.

`model.family = "transformers"` with `model.hf_config` builds transformers' own class for the
config (model.py) with the identity weight mapping (adapter.py). transformers is the [hf]
extra: importing this package does not need it, building a model does (ConfigError if absent).
"""

from __future__ import annotations

from collections.abc import Mapping

from titan_core.models.registry import ModelFamily
from titan_core.models.transformers.adapter import TransformersAdapter
from titan_core.models.transformers.model import TransformersCausalLM

# A tiny Llama, for tests and for a recipe that names the family without a config.json.
DEBUG_HF_CONFIG = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}  # fmt: skip


class _Flavors(Mapping):
    """Flavors read through transformers' config class when first asked for (it needs the [hf] extra)."""

    _configs = {"debugmodel": DEBUG_HF_CONFIG}

    def __getitem__(self, name):
        return ADAPTER.args_from_hf(self._configs[name])[0]

    def __iter__(self):
        return iter(self._configs)

    def __len__(self):
        return len(self._configs)


ADAPTER = TransformersAdapter()
FAMILY = ModelFamily(name="transformers", model_cls=TransformersCausalLM, flavors=_Flavors(), adapter=ADAPTER)
