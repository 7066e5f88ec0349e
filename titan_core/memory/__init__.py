"""Memory before and during a run: what a model and a step will need (estimate, activations), what the
device may give (budget), the refusal of a run that cannot fit before its weights exist (preflight), and
the measured peak of a piece of code (tensor_peak)."""
