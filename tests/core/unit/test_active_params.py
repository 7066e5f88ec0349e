"""Parameters active per token: the one rule of titan_core/models/common/param_counts.py.

Real-size MoE configs on the transformers path (transformers' own classes, built on meta), the
expected figure computed here from the config's numbers alone: transformers' total less the
routed experts a token does not reach. Then the rule's cases on small modules of its own.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.param_counts import count_params
from titan_core.models.transformers import ADAPTER, TransformersCausalLM

MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
}  # fmt: skip
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21, "num_attention_heads": 16,
    "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False,
    "output_router_logits": False, "router_aux_loss_coef": 0.001,
}  # fmt: skip
# name: (config, experts key, expert width key, published billions total / active)
MOES = {
    "Mixtral-8x7B": (MIXTRAL_8X7B, "num_local_experts", "intermediate_size", (46.7, 12.9)),
    "Qwen1.5-MoE-A2.7B": (QWEN15_MOE_A27B, "num_experts", "moe_intermediate_size", (14.3, 2.7)),
}


def transformers_model(cfg: dict):
    pytest.importorskip("transformers")
    args, _ = ADAPTER.args_from_hf(cfg)
    with torch.device("meta"):
        return args, TransformersCausalLM(args)


def unchosen(cfg: dict, experts_key: str, width_key: str) -> int:
    """Parameters of the routed experts one token does not reach: per MoE layer, E - k SwiGLU experts."""
    e, k, d, i = cfg[experts_key], cfg["num_experts_per_tok"], cfg["hidden_size"], cfg[width_key]
    return cfg["num_hidden_layers"] * (e - k) * 3 * d * i


@pytest.mark.hf
@pytest.mark.parametrize("name", list(MOES))
def test_moe_active_is_total_less_the_unchosen_routed_experts(name):
    cfg, experts_key, width_key, published = MOES[name]
    args, model = transformers_model(cfg)
    total = model.hf.num_parameters()  # transformers' own count of its class
    counts = count_params(model)
    assert counts == (total, total - unchosen(cfg, experts_key, width_key))
    assert (round(counts.total / 1e9, 1), round(counts.active / 1e9, 1)) == published
    # the shared decoder of the same args (what the native families and ports build) leaves out the same
    # experts: one rule, whatever class holds them (Qwen1.5's q/k/v biases and shared-expert gate aside)
    decoder = count_params(args)
    assert decoder.total - decoder.active == counts.total - counts.active


@pytest.mark.hf
def test_every_expert_chosen_leaves_all_active_and_a_dense_model_too():
    """The count follows top_k: with k = E no expert is left out; a dense model routes nothing."""
    cfg = {**MIXTRAL_8X7B, "num_hidden_layers": 2, "num_experts_per_tok": 8}
    _, model = transformers_model(cfg)
    assert count_params(model).active == count_params(model).total
    dense = {k: v for k, v in MIXTRAL_8X7B.items() if k not in ("num_local_experts", "num_experts_per_tok")}
    _, model = transformers_model({**dense, "model_type": "mistral", "num_hidden_layers": 2})
    assert count_params(model).active == count_params(model).total


# ---- the rule on small modules ------------------------------------------------------
class Block(nn.Module):
    def __init__(self, experts: nn.Module, **routing):
        super().__init__()
        self.experts, self.router = experts, nn.Linear(4, 8, bias=False)
        for k, v in routing.items():
            setattr(self, k, v)


class Model(nn.Module):
    def __init__(self, block: nn.Module, args: TransformerArgs | None = None):
        super().__init__()
        self.block = block
        if args is not None:
            self.args = args


def moe_args(n: int, k: int) -> TransformerArgs:
    return TransformerArgs(dim=4, n_layers=1, n_heads=1, vocab_size=8, n_experts=n, top_k=k, moe_hidden_dim=4)


def stacked(n: int) -> nn.Module:
    experts = nn.Module()
    experts.gate_up_proj = nn.Parameter(torch.empty(n, 6, 4))
    experts.bias = nn.Parameter(torch.empty(5))  # one bias every token gets, not one per expert
    return experts


def test_the_rule_reads_the_block_then_the_models_args():
    router = 4 * 8
    own = count_params(Model(Block(stacked(8), n_experts=8, top_k=2)))
    assert own == (router + 8 * 24 + 5, router + 2 * 24 + 5)
    from_args = count_params(Model(Block(stacked(8)), moe_args(8, 2)))
    assert from_args == own
    # no routing said anywhere: nothing is left out (the count does not guess)
    assert count_params(Model(Block(stacked(8)))).active == own.total


def test_a_list_of_experts_counts_one_module_each():
    experts = nn.ModuleList(nn.Linear(4, 6, bias=False) for _ in range(4))
    counts = count_params(Model(Block(experts, n_experts=4, top_k=1)))
    assert counts.total - counts.active == 3 * 24
    # a list that is not one module per expert is not split: all of it counts
    experts = nn.ModuleList(nn.Linear(4, 6, bias=False) for _ in range(3))
    counts = count_params(Model(Block(experts, n_experts=4, top_k=1)))
    assert counts.active == counts.total
