from titan_core.models.glimmer.flavors import FLAVORS
from titan_core.models.glimmer.model import Glimmer
from titan_core.models.glimmer.state_dict_adapter import GlimmerAdapter
from titan_core.models.registry import ModelFamily

FAMILY = ModelFamily(name="glimmer", model_cls=Glimmer, flavors=FLAVORS, adapter=GlimmerAdapter())
