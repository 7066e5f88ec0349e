"""Layers and the decoder shared by the model families."""
