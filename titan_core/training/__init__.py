"""One training step and its parts: the Trainer, the optimizer, and checkpoints (save, resume, HF export).
The model built from a config is titan_core.models.model_builder, the token-mean loss over a global batch
titan_core.parallel.token_mean: the layers below use them too."""
