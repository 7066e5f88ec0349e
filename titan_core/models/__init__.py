"""Model families. Each folder: model.py, flavors.py, state_dict_adapter.py. The family registry
(registry.py), the one way a recipe's model is built (model_builder.py) and the module-swap registry
(common/swaps.py)."""

from titan_core.models.registry import (
    FAMILY_NAMES,
    apply_model_overrides,
    build_meta,
    family_for_hf_model_type,
    get_family,
    resolve_args,
)

__all__ = [
    "FAMILY_NAMES",
    "apply_model_overrides",
    "build_meta",
    "family_for_hf_model_type",
    "get_family",
    "resolve_args",
]
