"""TrainableModel (titan_core/models/common/protocol.py): every family offers all of it, a model
that lacks a member is refused where it is built, no code probes a model for a member again, and a
model's args say what kind of model it is (a causal LM, flux's flow model) for the code around it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from titan_core.config import ConfigError
from titan_core.config.hf_config import config_upstream
from titan_core.config.sections import Model as ModelConfig
from titan_core.data.base import Batch
from titan_core.models import build_meta, get_family
from titan_core.models.common.kind import CAUSAL_LM
from titan_core.models.common.layers import CrossEntropyHead
from titan_core.models.common.protocol import MEMBERS, ModelBase, TrainableModel, missing_members
from titan_core.models.common.stats import model_flops_per_token
from titan_core.models.registry import NATIVE_FAMILIES
from titan_core.models.model_builder import build_meta_model

ROOT = Path(__file__).resolve().parents[3]


def debug(family: str):
    return build_meta(family, get_family(family).flavors["debugmodel"])


@pytest.mark.parametrize("family", NATIVE_FAMILIES)
def test_every_familys_model_offers_every_member(family):
    model = debug(family)
    assert isinstance(model, ModelBase) and missing_members(model) == []
    assert model.layers and all(k == str(i) for i, k in enumerate(model.layers))
    assert list(model.notes) == [] and not model.swap_paths and not model.swap_refusals
    assert model.params_kept_fp32(torch.bfloat16) == frozenset() and model.buffers_follow(torch.bfloat16) == []
    # the decoders leave their FLOPs to the estimate of their args; flux counts its own (per image token)
    assert (model.flops_per_token(64) is None) == (family != "flux") and model_flops_per_token(model, 64) > 0
    # flux's loss is an MSE with no head; every decoder's goes through the swappable CE head
    assert isinstance(model.loss_head, CrossEntropyHead) if family != "flux" else model.loss_head is None


@pytest.mark.hf
def test_the_transformers_wrapper_offers_every_member():
    pytest.importorskip("transformers", reason="needs the [hf] extra; make install has it, so CI runs this")
    model = debug("transformers")
    assert isinstance(model, ModelBase) and missing_members(model) == []
    assert isinstance(model.loss_head, CrossEntropyHead) and len(model.layers) == model.args.n_layers
    assert model.swap_paths  # its tree is transformers', so it says where the native paths are


def test_members_are_the_protocols_own():
    """MEMBERS is read off TrainableModel itself, so the check and the probe test follow it."""
    assert set(MEMBERS) == set(TrainableModel.__annotations__) | {
        "forward", "loss", "init_weights", "flops_per_token", "params_kept_fp32", "buffers_follow"
    }  # fmt: skip


PLAIN_PORT = """
import torch
from torch import nn


class Model(nn.Module):  # written without ModelBase: no notes, swap paths, FLOP count, ...
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.layers = nn.ModuleList([nn.Linear(args.dim, args.dim)])

    def forward(self, tokens):
        return tokens

    def loss(self, tokens, labels):
        return tokens.sum(), tokens.sum()

    def init_weights(self, seed=None):
        pass


def build_model(args):
    return Model(args)
"""


def test_a_port_that_lacks_members_is_refused_where_it_is_built(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(PLAIN_PORT)
    cfg = ModelConfig(module_file=str(path))
    args = get_family("llama3").flavors["debugmodel"]
    with pytest.raises(ConfigError) as err:
        build_meta_model(cfg, args)
    msg = str(err.value)
    assert msg.startswith(f"{path} build_model(args): the model it builds (Model) lacks ")
    for phrase in ("`layers` as an nn.ModuleDict of the blocks (it is a ModuleList)", "`loss_head`", "`notes`",
                   "`swap_paths`", "`flops_per_token`", "`buffers_follow`", "ModelBase"):  # fmt: skip
        assert phrase in msg
    assert "`loss`" not in msg and "`init_weights`" not in msg and "`args`" not in msg  # those it has
    # the same file on ModelBase, with its blocks in a dict, builds
    path.write_text(
        PLAIN_PORT.replace("class Model(nn.Module)", "class Model(ModelBase)")
        .replace("from torch import nn\n", "from torch import nn\nfrom titan_core.models.common.protocol import ModelBase\n")
        .replace("nn.ModuleList([nn.Linear(args.dim, args.dim)])", "nn.ModuleDict({'0': nn.Linear(args.dim, args.dim)})")
    )  # fmt: skip
    assert missing_members(build_meta_model(cfg, args)) == []


def test_placeholder_forward_and_wrong_kinds_are_named():
    class Bare(ModelBase):
        def __init__(self):
            super().__init__()
            self.args, self.layers, self.notes = "not args", nn.ModuleDict(), "one line"

        def loss(self, tokens, labels):
            return tokens, tokens

        def init_weights(self, seed=None):
            pass

    got = missing_members(Bare())
    assert got == ["`args` as ModelArgs (it is a str)", "`notes` as a list of lines (it is a str)",
                   "`forward` (nn.Module's placeholder)"]  # fmt: skip


# ---- what kind of model ----------------------------------------------------------------------
def _first_loss(family: str):
    """(a freshly initialised debug model's loss on a batch of its own samples, its args, the batch)."""
    model = debug(family)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    args, spec = model.args, model.args.sample_spec()
    own = args.own_samples(seed=0, batch_size=2, seq_len=spec.seq_len or 32, repeat_batch=True)
    if own is None:  # a model that reads data: uniform random tokens, as data.source = synthetic gives
        tokens = torch.randint(0, args.vocab_size, (2, 33), generator=torch.Generator().manual_seed(0))
        b = Batch(tokens[:, :-1], tokens[:, 1:])
    else:
        b = own.batch_at(0)
    with torch.no_grad():
        loss = model.loss(b.tokens, b.labels, **b.loss_kwargs())[0].item()
        kw = {k: b.inputs[k] for k in spec.forward_inputs} | ({"segment_ids": b.segment_ids} if spec.packed else {})
        out = model(b.tokens, **kw)
    return loss, args, b, out


@pytest.mark.parametrize("family", ["llama3", "flux"])
def test_the_args_say_what_kind_of_model_they_build(family):
    """Both kinds answer the same questions (models/common/kind.py), and their answers hold: the batch
    has what the sample spec names, forward takes what it says, and the first loss is near initial_loss."""
    fam = get_family(family)
    loss, args, b, out = _first_loss(family)
    assert fam.kind is args.kind and fam.args_type is type(args)
    spec, first = args.sample_spec(), args.initial_loss()
    assert set(b.inputs) == set(spec.inputs) and set(spec.forward_inputs) <= set(spec.inputs)
    assert abs(loss - first.value) / first.value <= 0.25, (loss, first)
    if family == "llama3":
        assert args.kind is CAUSAL_LM and args.kind.upstream == "transformers" and args.kind.loss_head
        assert args.kind.causal and args.kind.context_parallel and not args.kind.zero_output_at_init
        assert spec.packed and spec.seq_len is None and spec.inputs == ()
        assert first.value == math.log(args.vocab_size) and first.basis["vocab_size"] == args.vocab_size
        assert args.own_samples(seed=0, batch_size=1, seq_len=8) is None  # data.source feeds it
        assert out.shape == (2, 32, args.vocab_size)
    else:
        assert (args.kind.name, args.kind.upstream) == ("flow", "diffusers")
        assert not (args.kind.loss_head or args.kind.causal or args.kind.context_parallel)
        assert args.kind.zero_output_at_init and set(spec.inputs) - set(spec.forward_inputs) == {"noise"}
        assert not spec.packed and spec.seq_len == args.image_tokens and first.value == 2.0 and not first.basis
        assert b.tokens.shape == (2, spec.seq_len, args.in_channels) and out.shape == b.tokens.shape
        assert float(out.abs().max()) == 0.0  # adaLN-Zero: zero_output_at_init says so


@pytest.mark.parametrize("family", NATIVE_FAMILIES)
def test_a_family_declares_the_upstream_its_config_names(family):
    """The config reader's upstream (torch-free, what `onboard status` re-renders test_parity.py with) is
    the family's declared kind.upstream, and every family's derived sizes are its args' own."""
    fam = get_family(family)
    args = fam.flavors["debugmodel"]
    assert config_upstream(fam.adapter.hf_config(args)) == fam.kind.upstream
    assert set(args.derived) <= {"dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size",
                                 "ffn_hidden_dim", "max_seq_len"}  # fmt: skip
    assert all(getattr(args, name) >= 1 for name in ("dim", "n_layers", "n_heads", "vocab_size", "max_seq_len"))


# ---- no probes -------------------------------------------------------------------------------
PROBE = re.compile(r"\b(?:getattr|hasattr)\(\s*([^,()]+?)\s*,\s*[\"'](%s)[\"']" % "|".join(MEMBERS))
"""getattr(x, "member") / hasattr(x, "member") for a member of TrainableModel (over line breaks too)."""
KEPT = {
    ("titan_core/models/common/param_counts.py", "model", "args"):
        "count_params counts any module (transformers' own model, a test's toy tree), not only a TrainableModel",
    ("titan_core/models/transformers/stack.py", "root", "layers"):
        "root is transformers' base model, searched for its decoder list, not a TrainableModel",
    ("titan_core/models/transformers/experts.py", "cls", "forward"):
        "cls is transformers' experts class, whose forward source is read",
}  # fmt: skip
"""The probes of a member name that remain, each on an object that is not a TrainableModel, and why."""


def test_no_code_probes_a_model_for_a_protocol_member():
    found = set()
    for top in ("titan_core", "onboard"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "titan_core/models/common/protocol.py":  # the check itself says what a model lacks
                continue
            found |= {(rel, m.group(1), m.group(2)) for m in PROBE.finditer(path.read_text())}
    assert found - set(KEPT) == set(), "read these members directly (TrainableModel), or list the probe in KEPT"
    assert set(KEPT) - found == set(), "a KEPT probe is gone: drop it from KEPT"
