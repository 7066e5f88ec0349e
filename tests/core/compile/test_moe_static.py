"""moe.dense: the capture-friendly experts compute what the reference per-expert loop computes."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from titan_core.models.common.swaps import apply_swaps
from titan_core.models.common.moe import Experts
from titan_core.models.common.moe_static import DenseExperts
from titan_core.models.registry import build_meta, resolve_args


def _pair(n_experts=4, dim=32, hidden=48):
    torch.manual_seed(0)
    ref = Experts(n_experts, dim, hidden)
    for w in ref.parameters():
        torch.nn.init.normal_(w, std=0.2)
    dense = DenseExperts(n_experts, dim, hidden)
    dense.load_state_dict(ref.state_dict())
    return ref, dense


def _routing(tokens=40, n_experts=4, top_k=2):
    logits = torch.randn(tokens, n_experts)
    w, e = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
    return w / w.sum(-1, keepdim=True), e


def test_dense_matches_reference_loop_forward_and_backward():
    ref, dense = _pair()
    x = torch.randn(40, 32, requires_grad=True)
    w, e = _routing()
    w.requires_grad_(True)
    outs, grads = [], []
    for mod in (ref, dense):
        out = mod(x, w, e)
        g = torch.autograd.grad(out.square().sum(), [x, w, *mod.parameters()])
        outs.append(out)
        grads.append(g)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-6, atol=1e-6)
    for a, b in zip(grads[0], grads[1]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    # an expert nobody chose still gets an (all-zero) gradient, as in the loop
    e_unused = torch.zeros_like(e)
    e_unused[:, 1] = 1
    g = torch.autograd.grad(dense(x, w, e_unused).sum(), dense.w1)[0]
    assert torch.count_nonzero(g[2:]) == 0


def test_static_shapes_no_data_dependent_ops():
    _, dense = _pair()
    w, e = _routing()
    params = {k: v.detach() for k, v in dense.named_parameters()}
    gm = make_fx(lambda p, *a: torch.func.functional_call(dense, p, a), tracing_mode="fake")(
        params, torch.randn(40, 32), w, e
    )
    targets = {str(n.target) for n in gm.graph.nodes}
    assert not any(t.startswith(("aten.nonzero", "aten._local_scalar_dense", "aten.index.Tensor")) for t in targets)


def test_swap_replaces_every_moe_experts_module():
    args = resolve_args(
        "qwen3_moe", "debugmodel", {"n_layers": 2, "dim": 64, "n_experts": 4, "moe_hidden_dim": 32, "vocab_size": 256}
    )
    model = build_meta("qwen3_moe", args)
    claimed = apply_swaps(model, ["moe.dense"])
    assert claimed == {"layers.0.moe.experts": "moe.dense", "layers.1.moe.experts": "moe.dense"}
    assert all(type(m.moe.experts) is DenseExperts for m in model.layers.values())
    assert model.layers["0"].moe.experts.w1.device.type == "meta"
