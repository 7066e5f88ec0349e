"""Scan over layers carries each MoE layer's routing statistics out of the loop (a [2, experts]
tensor per layer, not a scalar carry) and sums them in layer order: traced as the Graph Trainer
traces it, the model's hidden states and routing statistics equal the unrolled loop's, bit for bit."""

import torch
from _tiny import build
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from titan_core.compile.graph_trainer.scan import check_scannable, scanned_layers


class _Hidden(nn.Module):
    """`model.hidden` as a module's forward, so torch.func.functional_call can feed it its state."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, tokens):
        return self.m.hidden(tokens)


def test_traced_scan_of_moe_blocks_gives_the_unrolled_routing_statistics():
    model, _ = build("qwen3_moe")  # 2 identical MoE layers (4 experts), capture-friendly dense experts
    names = check_scannable(model)
    wrapper = _Hidden(model)
    state = {**dict(wrapper.named_parameters()), **dict(wrapper.named_buffers())}
    keys = list(state)
    blocks = list(model.layers.values())
    stacked = [torch.stack([b.get_parameter(n) for b in blocks]).detach() for n in names]

    def scanned(tokens, *flat):
        with scanned_layers(model, list(flat[len(keys) :]), names, [None] * len(names)):
            return torch.func.functional_call(wrapper, dict(zip(keys, flat[: len(keys)])), (tokens,))

    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    flat = [t.detach() for t in state.values()] + stacked
    with torch.no_grad():
        gm = make_fx(scanned, tracing_mode="fake")(tokens, *flat)  # a scalar carry could not hold [2, 4]
        h, aux = gm(tokens, *flat)
        h_ref, aux_ref = model.hidden(tokens)
    assert any("scan" in str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    assert aux_ref.shape == (2, 4)  # the experts' routed fractions and mean probabilities, summed
    assert torch.equal(h, h_ref) and torch.equal(aux, aux_ref)
