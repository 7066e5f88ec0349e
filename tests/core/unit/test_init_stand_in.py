"""The stand-ins a sharded init runs a model's own `init_weights` against (one process, plain targets:
the mechanism of titan_core/parallel/sharded_init.py without the slicing, which the 2-rank test checks)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from titan_core.models.common.init_stand_in import ShardedInitError
from titan_core.models.common.protocol import ModelBase
from titan_core.parallel.sharded_init import init_dtypes_of, materialise_sharded


class Toy(ModelBase):
    """Three linears and an embedding with a padding row; `order` says how init_weights visits them."""

    def __init__(self, order: str = "modules"):
        super().__init__()
        self.args = None
        self.layers = nn.ModuleDict({str(i): nn.Linear(8, 8) for i in range(3)})
        self.emb = nn.Embedding(16, 8, padding_idx=0)
        self.order = order

    def forward(self, tokens):
        return tokens

    def loss(self, tokens, labels, **kw):
        return tokens, tokens

    @torch.no_grad()
    def init_weights(self, seed=None):
        gen = torch.Generator().manual_seed(seed)
        if self.order == "unwritten":
            self.layers["0"].weight.normal_(generator=gen)
            return
        for block in self.layers.values():
            nn.init.trunc_normal_(block.weight, std=0.1, generator=gen)
            block.bias.data.uniform_(-1, 1, generator=gen)
        self.emb.weight.normal_(generator=gen)
        self.emb.weight[self.emb.padding_idx].zero_()
        if self.order == "returns":  # back to the first block after every other parameter
            self.layers["0"].weight.mul_(0.5)
        kept = nn.Parameter(self.emb.weight.detach())  # nn.Parameter of a stand-in: the same parameter
        kept.add_(1.0)


def _one_process(order: str, dtype=torch.float32) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        model = Toy(order)
    model.to_empty(device="cpu")
    model.init_weights(seed=4)
    return dict(model.to(dtype).named_parameters())


def _stand_in_built(order: str, dtype=torch.float32):
    with torch.device("meta"):
        model = Toy(order)
    init_dtypes = init_dtypes_of(model)
    model.to(dtype)
    record = materialise_sharded(model, torch.device("cpu"), 4, init_dtypes=init_dtypes, cast_to=dtype)
    return model, record


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_init_through_stand_ins_equals_the_whole_models(dtype):
    model, record = _stand_in_built("modules", dtype)
    want = _one_process("modules", dtype)
    for name, p in model.named_parameters():
        assert p.dtype == dtype and torch.equal(p, want[name]), name
    assert torch.all(model.emb.weight[0] == 1.0)  # the padding row zeroed, then the in-place add through nn.Parameter
    # one module's own parameters at a time: the embedding (16 x 8 fp32) is the largest
    assert record.peak_full_bytes == record.budget_bytes == 16 * 8 * 4
    assert record.reopened == []


def test_an_init_that_returns_to_a_closed_parameter_gathers_it_again_exactly():
    model, record = _stand_in_built("returns")
    want = _one_process("returns")
    # the first block's weight is gathered again; making room for it closed the embedding (the budget is
    # one module's parameters), which the init then touches again too
    assert record.reopened == ["layers.0.weight", "emb.weight"]
    for name, p in model.named_parameters():
        assert torch.equal(p, want[name]), name


def test_returning_to_a_parameter_whose_shards_hold_another_dtype_is_refused():
    with pytest.raises(ShardedInitError, match=r"returns to layers\.0\.weight .*bfloat16, not the torch\.float32"):
        _stand_in_built("returns", torch.bfloat16)


def test_a_parameter_the_init_never_writes_is_refused_by_name():
    with pytest.raises(ShardedInitError, match=r"writes no value into layers\.0\.bias, layers\.1\.weight"):
        _stand_in_built("unwritten")


def test_without_draws_no_parameter_is_held_whole_and_the_buffers_are_still_made():
    """A checkpoint loads every parameter next (checkpoint.initial_hf): the init's draws are skipped, its buffers
    (the decoder's RoPE frequencies) computed as the one-process init computes them."""
    from titan_core.models import build_meta, resolve_args

    args = resolve_args("llama3", "debugmodel", {"n_layers": 2})
    whole = build_meta("llama3", args)
    whole.to_empty(device="cpu")
    whole.init_weights(seed=1)
    model = build_meta("llama3", args)
    record = materialise_sharded(model, torch.device("cpu"), 1, init_dtypes=init_dtypes_of(model),
                                 cast_to=torch.float32, draw=False)  # fmt: skip
    assert record.peak_full_bytes == 0 and all(s.state == "closed" for s in record.slots)
    assert torch.equal(model.inv_freq, whole.inv_freq)
    assert all(p.device.type == "cpu" for p in model.parameters())
