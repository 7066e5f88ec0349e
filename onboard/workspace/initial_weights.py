"""What `new-model --weights DIR` puts in the workspace's recipe: `checkpoint.initial_hf`, or why not.

A part of onboard/workspace/scaffold.py's rendering (the recipe template prints the value and
the comment this returns).
"""

from __future__ import annotations

from pathlib import Path

from onboard.workspace.layout import HF_CONFIG, TWIN
from titan_core.models.registry import DIFFUSION_FAMILIES

def initial_hf(name: str, weights: Path | None, family: str, twin: dict | None, hf_config) -> tuple[str, str]:
    """(checkpoint.initial_hf for the recipe, or "" when it is left out; the recipe comment saying why).

    A workspace made with --weights trains from them: every rung runs the recipe, so every run
    starts from the checkpoint and the eager rung compares its step-1 loss with transformers'. Left
    out, with the reason in the recipe, where the recipe's model cannot load them: a twin (the gates
    train a smaller model than the checkpoint's; `onboard recipe` prints the full model's command),
    a diffusion model (initial_hf reads a causal LM's folder), a folder without the config.json
    that checkpoint.initial_hf reads.

    The arguments are the scaffold plan's fields of the same names (`twin`: its twin record, whose
    "config" is the twin's config; `hf_config`: the model's own)."""
    if weights is None:
        return "", ""
    where = str(weights)
    if family in DIFFUSION_FAMILIES:
        return "", f"--weights {where} is for parity only: checkpoint.initial_hf loads causal language models"
    if twin is not None and twin["config"] != hf_config:  # a twin of the full shape loads them
        return "", (
            f"no checkpoint.initial_hf: the gates train the twin ({TWIN}), which the full-size weights in {where} "
            f"do not fit; `onboard recipe {name}` prints the command that trains the full model from them"
        )
    if not (weights / HF_CONFIG).is_file():
        return "", (
            f"no checkpoint.initial_hf: {where} has no {HF_CONFIG}, which it reads (the model_type and the declared "
            f"dtype); copy the model's {HF_CONFIG} there and set checkpoint.initial_hf to train from these weights"
        )
    return where, (
        "--weights: every run starts from this checkpoint; the eager rung checks its step-1 loss against "
        "transformers' loss of it on the same batch"
    )
