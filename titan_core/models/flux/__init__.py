"""FLUX.1, a rectified-flow diffusion transformer (double- and single-stream blocks), as a family.

diffusers' FluxTransformer2DModel is its upstream (adapter.py maps the weights and reads its
config); training is fed synthetic latents, text embeddings and timesteps (titan_core/data/flow.py).
"""

from titan_core.models.flux.adapter import FluxAdapter
from titan_core.models.flux.config import resync_summary
from titan_core.models.flux.flavors import FLAVORS
from titan_core.models.flux.model import Flux
from titan_core.models.registry import ModelFamily

FAMILY = ModelFamily(name="flux", model_cls=Flux, flavors=FLAVORS, adapter=FluxAdapter(), resync=resync_summary)
