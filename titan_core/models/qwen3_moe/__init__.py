from titan_core.models.qwen3_moe.flavors import FLAVORS
from titan_core.models.qwen3_moe.model import Qwen3Moe
from titan_core.models.qwen3_moe.state_dict_adapter import Qwen3MoeAdapter
from titan_core.models.registry import ModelFamily

FAMILY = ModelFamily(name="qwen3_moe", model_cls=Qwen3Moe, flavors=FLAVORS, adapter=Qwen3MoeAdapter())
