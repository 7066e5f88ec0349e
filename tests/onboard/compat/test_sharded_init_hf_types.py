"""transformers' own inits through the sharded init's stand-ins, for the architectures whose init is not
one module at a time: a bias two modules share (BERT, RoBERTa-style heads), a mixer that writes its
child's weight after the child's own init (Mamba), a block shared by two layers (Zamba), a tensor no
`_init_weights` writes, given its constructor's value (Apertus' xIELU). One process, plain targets: the
values must be the one-process init's, bit for bit. (A sweep over every causal-LM type transformers
ships found the same for 191 of 196; the other five cannot be built at a tiny size at all.)"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", reason="the transformers path needs the [hf] extra")

from onboard.compat.tiny import tiny_config  # noqa: E402
from titan_core.config import load_config  # noqa: E402
from titan_core.parallel.sharded_init import init_dtypes_of, materialise_sharded  # noqa: E402
from titan_core.models.model_builder import build_model_from_config  # noqa: E402


def _tensors(model) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **{f"buffer {n}": b for n, b in model.named_buffers()}}


@pytest.mark.parametrize("model_type", ["bert", "camembert", "mamba", "zamba", "apertus"])
def test_transformers_init_through_stand_ins_is_the_one_process_init(tmp_path, model_type):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_config(model_type)))
    cfg = load_config(None, ["--model.family=transformers", f"--model.hf_config={path}"])
    _, _, whole = build_model_from_config(cfg.model)
    whole.to_empty(device="cpu")
    whole.init_weights(seed=3)
    _, _, model = build_model_from_config(cfg.model)
    record = materialise_sharded(model, torch.device("cpu"), 3, init_dtypes=init_dtypes_of(model),
                                 cast_to=torch.float32)  # fmt: skip
    want, got = _tensors(whole), _tensors(model)
    assert set(got) == set(want)  # the same ties: a shared parameter is listed once on both
    for name, t in got.items():
        assert torch.equal(t, want[name]), name
    assert record.peak_full_bytes <= record.budget_bytes
