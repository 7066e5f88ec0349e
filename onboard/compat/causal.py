"""Whether a model_type's causal-LM class is a causal language model at all, measured on its tiny
config: transformers' own class (eager attention, fp32, CPU, seeded) on a batch of tokens, then
on the same batch with its last token changed. A causal LM gives next-token logits over its
vocabulary, [batch, seq, vocab], and no logit before the changed token moves. A class that fails
that (an encoder run bidirectionally, a permutation LM, a decoder of audio codebooks) is listed
as not a causal LM, with what was measured, and is not counted as a failure of the path. A class
that transformers' own forward cannot run on input ids alone (Gemma-4's assistant reads the key and
value states of the model it drafts for) is not probed, with the error: no path could train it
standalone, and it still counts against the table. A class that cannot even be built is left to
the climb: the eager rung records the error. `new-model --path transformers` measures a user's
config the same way (`not_causal_reason`) and refuses one that is not a causal LM (exit 2)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from onboard.compat.tiny import FLAGS, NotProbed, tiny_config
from titan_core.models.transformers.hf_classes import causal_lm_parts, config_object, quiet_transformers

NOT_CAUSAL = "not a causal LM: "
"""How a not-probed reason of this kind begins (the tables count these apart)."""
SEQ = 16
TOLERANCE = 1e-6
"""Largest change of an earlier logit, relative to the logits' largest magnitude, still counted
as unmoved (one fp32 rounding apart where a kernel blocks over the sequence)."""


def check_causal(cfg: dict[str, Any], *, seed: int = 0) -> None:
    """NotProbed(NOT_CAUSAL + what was measured) when the class of `cfg` is not a causal LM."""
    try:
        cls, config = causal_lm_parts(config_object(cfg))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
            vocab = model.get_output_embeddings().weight.shape[0]
            tokens = torch.randint(0, min(vocab, 256), (2, SEQ))
    except Exception:  # noqa: BLE001 -- the climb's eager rung records this class's error
        return
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % min(vocab, 256)
    try:
        with torch.no_grad():
            before = model(input_ids=tokens, use_cache=False).logits
            after = model(input_ids=changed, use_cache=False).logits
    except Exception as e:  # noqa: BLE001 -- whatever it raises is the reason
        raise NotProbed(
            f"transformers' own {cls.__name__} cannot run a forward on input ids alone ({type(e).__name__}: {e}): "
            "it needs inputs no causal-LM batch holds, so no path trains it standalone"
        ) from None
    if before.shape != (2, SEQ, vocab):
        raise NotProbed(
            f"{NOT_CAUSAL}{cls.__name__} gives logits of shape {tuple(before.shape)} for {SEQ} tokens, "
            f"not one row of {vocab} per token"
        )
    scale = float(before.abs().max()) or 1.0
    moved = float((after[:, :-1] - before[:, :-1]).abs().max()) / scale
    if moved > TOLERANCE:
        raise NotProbed(
            f"{NOT_CAUSAL}{cls.__name__} changes its logits at earlier positions when the last token "
            f"changes ({moved:.2g} of their scale): it attends ahead, as an encoder or a permutation LM does"
        )


def not_causal_reason(cfg: dict[str, Any]) -> str | None:
    """Why the class of a user's `cfg` is not a causal LM (`check_causal`'s NOT_CAUSAL reason),
    measured on the tiny config of its model_type carrying `cfg`'s own switches (every top-level
    text or true/false value: an encoder's `is_decoder`, XLM's `causal`, XLNet's `attn_type`),
    so a config that sets a class up as a decoder passes and one that does not is refused before
    a workspace is made (the reason says how to set an encoder up as one); None when it is one,
    or when no tiny config of it can be built (the eager rung then records what fails)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # lazy: the [hf] extra

    try:
        tiny = tiny_config(cfg["model_type"])
    except NotProbed:
        return None
    cls = CONFIG_MAPPING[cfg["model_type"]]
    defaults = {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    # the probe sets the decoder switches on; here they are the user's (or the class's default)
    tiny |= {k: cfg.get(k, defaults.get(k, False)) for k in FLAGS if k in tiny}
    tiny |= {k: v for k, v in cfg.items() if isinstance(v, (str, bool)) and k != "model_type"}
    try:
        with quiet_transformers():  # its advice to set is_decoder: the refusal says it, on its one line
            check_causal(tiny)
    except NotProbed as e:
        if not str(e).startswith(NOT_CAUSAL):
            return None
        switch = " (an encoder runs as a decoder with is_decoder = true in config.json)" if "is_decoder" in tiny else ""
        return str(e) + switch
    return None
