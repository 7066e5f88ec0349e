"""The parity rung's declared measurements (its checklist judges only these)."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any

from onboard.ladder.contract import ABSENT, Measurements, flattened


@dataclass(kw_only=True)
class ParityMeasurements(Measurements):
    """What test_parity.py measured (onboard/parity/check.py: native port vs upstream HF, CPU fp32,
    same weights; each comparison the worst over its passes), and how pytest ended."""

    batch: int = ABSENT
    """Sequences in the comparison batch."""
    seq_len: int = ABSENT
    """Tokens per sequence (grown to cover every declared window)."""
    weights_missing_keys: int = ABSENT
    """Checkpoint tensors the upstream class expects but did not get (count; 0 for a seeded init)."""
    weights_unexpected_keys: int = ABSENT
    """Checkpoint tensors the upstream class got but does not use (count)."""
    weights_mismatched_keys: int = ABSENT
    """Checkpoint tensors of another shape than the upstream class's (count)."""
    state_dict_same_keys: bool = ABSENT
    """HF -> native -> HF gives back exactly the upstream state dict's keys."""
    state_dict_max_abs_diff: float = ABSENT
    """Largest absolute difference of any tensor after that round trip (0 means exact)."""
    logits_rel_l2: float = ABSENT
    """Relative L2 error of the native logits against upstream's (fraction)."""
    logits_max_abs: float = ABSENT
    """Largest absolute logit difference, in logit units, or in units of the upstream logits' RMS
    where that is above 1 (a features pass that scaled the logits up to a soft-cap scales their
    rounding too); worst over the passes. Each pass keeps logits_max_abs_raw and logits_rms."""
    loss_abs_diff: float = ABSENT
    """|native cross-entropy - upstream cross-entropy| (nats per token)."""
    native_loss: float = ABSENT
    """The native cross-entropy of the first pass (nats per token)."""
    upstream_loss: float = ABSENT
    """Upstream's cross-entropy of the first pass (nats per token)."""
    aux_loss_abs_diff: float = ABSENT
    """|native MoE load-balancing term - upstream's| as each adds it to its training loss (native:
    loss - CE; upstream: router_aux_loss_coef x aux_loss where output_router_logits turns it on, else
    0), in units of the loss where that is above 1; worst over the passes (each keeps the _raw one)."""
    native_aux_loss: float = ABSENT
    """The native load-balancing term (loss - CE) of the first pass."""
    upstream_aux_loss: float = ABSENT
    """Upstream's weighted load-balancing term of the first pass (0.0 when it adds none)."""
    init_tensors_compared: int = ABSENT
    """Tensors (or pools of small ones over the layers) whose fresh native init was compared with
    upstream's own init (onboard/upstream/init_check.py; count)."""
    init_tensors_differing: int = ABSENT
    """Of those, how many differ: a constant upstream tensor not that constant natively, or a std or
    mean outside the checklist's bounds (count; results.json init.differing names them)."""
    grad_max_rel_l2: float = ABSENT
    """Worst relative L2 error of a parameter's gradient, native vs upstream (fp32), over the gradients
    the fp64 check did not excuse as rounding (grads_excused_as_rounding)."""
    grad_max_rel_l2_raw: float = ABSENT
    """The same over every gradient, excused or not."""
    grads_excused_as_rounding: int = ABSENT
    """Gradients over the tolerance that upstream run in fp64 showed to be fp32 rounding: the native
    one within params.grad_rounding_factor x upstream fp32's own error (count; grads.fp64_check)."""
    grad_worst_param: str | None = ABSENT
    """The HF parameter with that worst gradient error."""
    modules_compared: int = ABSENT
    """Native modules whose outputs were compared with an upstream module's (count)."""
    first_divergence_module: str | None = ABSENT
    """The first native module (in forward order) whose output differs beyond tolerance; None: none does."""
    first_divergence_upstream: str | None = ABSENT
    """The upstream module it was compared with."""
    first_divergence_rel_l2: float | None = ABSENT
    """Its output's relative L2 error (fraction)."""
    first_divergence_pass: str | None = ABSENT
    """The pass it diverged in ("seeded", "weights" or "features"); None: no divergence."""
    features_exercised: bool = ABSENT
    """Every feature the config declares (soft-cap, window, padding, MoE routing) was active in a pass."""
    features_idle: list[str] = ABSENT
    """The declared features no pass had active (empty when features_exercised): what the gate could not see."""
    features_proved: list[str] = ABSENT
    """What each pass proved, one line per exercised feature: "name (pass): how" (onboard/parity/active_range.py)."""
    features: dict[str, Any] = flattened()
    """feature_<name>: how much a declared feature was exercised (onboard/parity/features.py: the
    soft-capped fraction, seq_len over the window, pad ids, the fewest tokens per expert)."""
    lora: str = ABSENT
    """What of the recipe's [lora] parity proved: "rank R on N modules (its target_modules)", or
    "none: ..." where the recipe has no [lora] enabled (the lora criteria are then not applicable)."""
    lora_merge: str = ABSENT
    """What the merge criterion compared: "merged_copy against the unmerged model", or "none: ..." without
    [lora] or where its adapters cannot be merged (an adapter on an embedding the head shares)."""
    lora_zero_b_max_abs: float = ABSENT
    """Largest logit difference of the native model with the [lora] adapters as injected (B = 0) against
    the native model without them (0.0 means bit for bit)."""
    lora_peft_rel_l2: float = ABSENT
    """Relative L2 error of the native logits with the adapters (B drawn) against upstream's class given
    the same adapter weights by peft (fraction)."""
    lora_grads_only_adapters: bool = ABSENT
    """After a backward of the native loss with the adapters: the parameters holding gradients are exactly
    the adapters and the modules_to_save copies."""
    lora_merge_rel_l2: float = ABSENT
    """Relative L2 error of the merged model's logits (merged_copy) against the unmerged model's (fraction)."""
    pytest_passed: bool = ABSENT
    """The workspace's test_parity.py exited 0."""
    pytest_exit_code: int | None = ABSENT
    """Its exit code; None when it ran past params.timeout_s."""

    @classmethod
    def of(cls, results: dict[str, Any], **pytest: Any) -> "ParityMeasurements":
        """From results.json's measurements (its feature_<name> values among them) and pytest's end."""
        features = {k: v for k, v in results.items() if k.startswith("feature_")}
        return cls(**{k: v for k, v in results.items() if k not in features}, features=features, **pytest)
