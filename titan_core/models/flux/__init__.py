"""FLUX.1, a rectified-flow diffusion transformer (double- and single-stream blocks), as a family.

diffusers' FluxTransformer2DModel is its upstream (adapter.py maps the weights and reads its
config); training is fed synthetic latents, text embeddings and timesteps (samples.py). Its args are
FluxArgs (args.py), of the flow kind (`FLOW`): what the code around a model asks instead of its family.
"""

from titan_core.models.flux.adapter import FluxAdapter
from titan_core.models.flux.args import FluxArgs
from titan_core.models.flux.flavors import FLAVORS
from titan_core.models.flux.model import Flux
from titan_core.models.registry import ModelFamily

FAMILY = ModelFamily(name="flux", model_cls=Flux, flavors=FLAVORS, adapter=FluxAdapter(), args_type=FluxArgs)
