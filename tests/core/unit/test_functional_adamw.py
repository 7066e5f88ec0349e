"""The captured step's functional AdamW computes exactly what torch.optim.AdamW does, for fp32 and for
bf16 parameters (a bf16 recipe's Graph Trainer is bit-identical to its eager step only if this holds)."""

import pytest
import torch

from titan_core.compile.graph_trainer.functional_optim import adamw_step_scalars, adamw_update, group_hypers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_functional_adamw_is_bit_identical_to_torchs_over_several_steps(dtype):
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(4096, generator=gen).to(dtype)
    param = torch.nn.Parameter(start.clone())
    opt = torch.optim.AdamW([param], lr=8e-4, weight_decay=0.1, foreach=False)
    hypers = group_hypers(opt)
    p, m, v = start.clone(), torch.zeros_like(start), torch.zeros_like(start)
    for step in range(1, 6):
        grad = torch.randn(4096, generator=gen).to(dtype)
        param.grad = grad.clone()
        opt.step()
        scalars = [tuple(torch.tensor(x, dtype=torch.float32) for x in adamw_step_scalars(8e-4, step, hypers[0]))]
        (p,), (m,), (v,) = adamw_update([p], [grad], [m], [v], [0], hypers, scalars)
        state = opt.state[param]
        assert torch.equal(p, param.detach()), (dtype, step)
        assert torch.equal(m, state["exp_avg"]) and torch.equal(v, state["exp_avg_sq"]), (dtype, step)
    assert not torch.equal(p, start)  # the parameters moved: the equality above is not of two no-ops
