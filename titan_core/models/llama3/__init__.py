from titan_core.models.llama3.flavors import FLAVORS
from titan_core.models.llama3.model import Llama3
from titan_core.models.llama3.state_dict_adapter import Llama3Adapter
from titan_core.models.registry import ModelFamily

FAMILY = ModelFamily(name="llama3", model_cls=Llama3, flavors=FLAVORS, adapter=Llama3Adapter())
