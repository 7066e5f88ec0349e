"""TrainableModel (titan_core/models/common/protocol.py): every family offers all of it, a model
that lacks a member is refused where it is built, and no code probes a model for a member again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from titan_core.config import ConfigError
from titan_core.config.sections import Model as ModelConfig
from titan_core.models import FAMILY_NAMES, build_meta, get_family
from titan_core.models.common.layers import CrossEntropyHead
from titan_core.models.common.protocol import MEMBERS, ModelBase, TrainableModel, missing_members
from titan_core.models.common.stats import model_flops_per_token
from titan_core.models.registry import DIFFUSION_FAMILIES
from titan_core.training.model_builder import build_meta_model

ROOT = Path(__file__).resolve().parents[3]


def debug(family: str):
    return build_meta(family, get_family(family).flavors["debugmodel"])


@pytest.mark.parametrize("family", [*FAMILY_NAMES, *DIFFUSION_FAMILIES])
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
    assert got == ["`args` as TransformerArgs (it is a str)", "`notes` as a list of lines (it is a str)",
                   "`forward` (nn.Module's placeholder)"]  # fmt: skip


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
