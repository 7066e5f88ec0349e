"""The MoE load-balancing loss is upstream's: one loss over every MoE layer's tokens, added only
when the config turns it on (issue 32, item 6).

Upstream is transformers' MixtralForCausalLM with output_router_logits (its
`load_balancing_loss_func`: per-token means of the router probabilities and of the top-k
assignments over all layers at once, times num_experts, times router_aux_loss_coef). The native
side is the qwen3_moe family (Mixtral is Qwen3-MoE without QK-norm) on the same weights,
mapped by its adapter.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")

from titan_core.measure.numerics import rel  # noqa: E402
from titan_core.models.common.moe import load_balancing_loss, routing_stats  # noqa: E402
from titan_core.models.qwen3_moe import Qwen3Moe, Qwen3MoeAdapter  # noqa: E402

pytestmark = pytest.mark.hf

# fp32 rounding: the means run over 3 layers x 128 tokens and the two sides add them in other
# orders (native: a mean per layer, then over layers; upstream: sums over all rows, then divided)
FP32_AUX_REL = 1.0e-6
LAYERS, EXPERTS, TOP_K, COEF = 3, 4, 2, 0.02


class MixtralAdapter(Qwen3MoeAdapter):
    """The qwen3_moe mapping for Mixtral: the same in-memory expert layout, no QK-norm, the
    experts' width in intermediate_size, the kept router weights always renormalised."""

    hf_model_types = ("mixtral",)
    hf_architecture = "MixtralForCausalLM"

    def extra_args_from_hf(self, cfg, take):
        kw = super().extra_args_from_hf(cfg, take)
        return {**kw, "qk_norm": False, "moe_hidden_dim": cfg["intermediate_size"], "norm_topk_prob": True}


def mixtral(output_router_logits: bool):
    """A seeded tiny MixtralForCausalLM with routers sharp enough that layers route differently."""
    cfg = transformers.MixtralConfig(
        hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=64, vocab_size=256, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K,
        output_router_logits=output_router_logits, router_aux_loss_coef=COEF, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.MixtralForCausalLM(cfg).eval()
    with torch.no_grad():
        for i in range(LAYERS):  # at init std 0.02 every router is near uniform and the aux near top_k
            hf.model.layers[i].mlp.gate.weight.normal_(0.0, 1.0)
    return hf


def native_of(hf) -> Qwen3Moe:
    adapter = MixtralAdapter()
    args, _ = adapter.args_from_hf(hf.config.to_dict())
    with torch.device("meta"):
        model = Qwen3Moe(args)
    model = model.to_empty(device="cpu")
    model.init_weights(seed=0)  # also the RoPE table, which is no weight
    model.load_state_dict(adapter.from_hf(hf.state_dict()), strict=True)
    return model.eval()


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (2, 64), generator=gen), torch.randint(0, 256, (2, 64), generator=gen)


def test_aux_loss_equals_mixtral_upstream_over_all_layers():
    hf = mixtral(output_router_logits=True)
    native = native_of(hf)
    tokens, labels = batch()
    with torch.no_grad():
        out = hf(input_ids=tokens)
        _, stats = native.hidden(tokens)
        loss, ce = native.loss(tokens, labels)
    aux = load_balancing_loss(stats, LAYERS)
    assert rel(aux.item(), out.aux_loss.item()) <= FP32_AUX_REL, (aux.item(), out.aux_loss.item())
    # what the training loss adds is the config's coefficient times that one loss
    assert native.args.aux_loss_coef == COEF
    assert abs((loss - ce).item() - COEF * out.aux_loss.item()) <= 1e-6 * loss.item()
    # the comparison can tell the pooled loss from per-layer ones: their sum (the old native
    # loss, about LAYERS x) and even their mean differ from upstream's beyond the bound
    per_layer = [load_balancing_loss(s, 1).item() for s in layer_stats(native, tokens)]
    assert rel(sum(per_layer), out.aux_loss.item()) > 1.0
    assert rel(sum(per_layer) / LAYERS, out.aux_loss.item()) > 100 * FP32_AUX_REL


def layer_stats(native: Qwen3Moe, tokens) -> list[torch.Tensor]:
    """Each MoE layer's own routing statistics, recorded off the MoE modules' outputs."""
    seen: list[torch.Tensor] = []
    hooks = [
        block.moe.register_forward_hook(lambda _m, _i, out: seen.append(out[1])) for block in native.layers.values()
    ]
    try:
        with torch.no_grad():
            native.hidden(tokens)
    finally:
        for h in hooks:
            h.remove()
    assert len(seen) == LAYERS
    return seen


def test_no_aux_loss_when_output_router_logits_is_false():
    hf = mixtral(output_router_logits=False)
    native = native_of(hf)
    tokens, labels = batch()
    with torch.no_grad():
        assert hf(input_ids=tokens).aux_loss is None  # upstream adds nothing
        loss, ce = native.loss(tokens, labels)
    assert native.args.aux_loss_coef == 0.0
    assert loss is ce  # nothing added, not even a zero


def test_pooled_loss_equals_hf_function_on_uneven_layers():
    """load_balancing_loss of summed routing_stats == transformers' load_balancing_loss_func on the
    same routers' logits, for layers whose routing differs (one collapsed, one spread)."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    gen = torch.Generator().manual_seed(2)
    logits = [torch.randn(96, EXPERTS, generator=gen) * s for s in (0.1, 3.0)]
    logits[1][:, 0] += 4.0  # the second layer sends most tokens to expert 0
    stats = sum(routing_stats(*_route(lg), EXPERTS) for lg in logits)
    ref = load_balancing_loss_func(tuple(logits), EXPERTS, TOP_K)
    assert rel(load_balancing_loss(stats, len(logits)).item(), ref.item()) <= FP32_AUX_REL


def _route(logits: torch.Tensor):
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    return probs, probs.topk(TOP_K, dim=-1).indices
