"""The errors of mapping a config to a model, in a module of their own so that the adapter
(hf_adapter.py) and the structural rules (validate.py) can both raise them without a cycle."""

from __future__ import annotations


class AdapterError(ValueError):
    """A config or checkpoint the adapter cannot map."""


class ArchitectureError(AdapterError):
    """Args (or the config they were read from) that no model can be built from.

    An AdapterError, so code asking "can this adapter map the config" sees a no; `fields`
    names the native fields at fault, so a caller can tell a bad override from a bad config.
    """

    def __init__(self, message: str, fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.fields = tuple(fields)


class KernelUnavailable(RuntimeError):
    """A kernel asked for where it cannot run, with the reason and what to use instead."""


class KernelRefusesModel(KernelUnavailable):
    """The kernel runs here but cannot compute what this model asks of it (an attention-score
    soft-cap, dropout, sinks, a non-causal module): it does not apply to the model, with the
    reason. Distinct from its parent, which also means a missing extra or device (a fault to fix).
    Here, beside the model errors, because the model's own cores raise it too."""
