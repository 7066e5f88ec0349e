"""One training step and its parts: the Trainer, the model built from a config (model_builder), the
optimizer, the token-mean loss over a global batch, and checkpoints (save, resume, HF export)."""
