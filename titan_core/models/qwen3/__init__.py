from titan_core.models.qwen3.flavors import FLAVORS
from titan_core.models.qwen3.model import Qwen3
from titan_core.models.qwen3.state_dict_adapter import Qwen3Adapter
from titan_core.models.registry import ModelFamily

FAMILY = ModelFamily(name="qwen3", model_cls=Qwen3, flavors=FLAVORS, adapter=Qwen3Adapter())
