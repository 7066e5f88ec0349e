"""One HF-name table (titan_core/models/common/hf_keys.py) behind everything that reads a config's keys:
the families' adapters, the twin (onboard/sizing/twin/derive.py) and the header check
(titan_core/weights/header_check.py). Each name of the table is tried with each reader: a family
exports and reads a field under the table's first name, a twin of a config that writes a size under
another of its names shrinks it under that name (no second key beside it), and the header check finds
the declared dtype under either of its names."""

from __future__ import annotations

import json
from types import SimpleNamespace

import dataclasses

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from onboard.sizing.twin.derive import derive_twin
from real_size_configs import PUBLISHED
from titan_core.models import FAMILY_NAMES, get_family
from titan_core.models.common.args import TransformerArgs
from titan_core.config.hf_keys import ARG_FIELDS, HF_KEYS, hf_key
from titan_core.weights.header_check import check_headers

# a MoE config with a window: every size the twin shrinks that a family reads is in it
BASE = {**PUBLISHED["Qwen3-30B-A3B"][2], "use_sliding_window": True, "sliding_window": 4096}
ADAPTER = get_family("qwen3_moe").adapter


def test_no_name_means_two_things_and_every_entry_is_an_args_field_or_the_dtype():
    names = [k for keys in HF_KEYS.values() for k in keys]
    assert len(names) == len(set(names))
    assert set(HF_KEYS) - set(ARG_FIELDS) == {"dtype"}
    assert set(ARG_FIELDS) <= {f.name for f in dataclasses.fields(TransformerArgs)}
    # the name a config uses wins over the first one, a value over a null
    assert hf_key("n_experts", {"num_local_experts": 8}) == "num_local_experts"
    assert hf_key("head_dim", {"head_dim": None, "kv_channels": 128}) == "kv_channels"
    assert hf_key("head_dim", {"head_dim": None}) == "head_dim" and hf_key("dim", {}) == "hidden_size"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_each_family_writes_and_reads_the_first_names(family):
    fam = get_family(family)
    cfg = fam.adapter.hf_config(fam.flavors["debugmodel"])
    field_of = {k: f for f, keys in HF_KEYS.items() for k in keys}
    written = {k for k in cfg if k in field_of}
    assert written and all(HF_KEYS[field_of[k]][0] == k for k in written)
    _, used = fam.adapter.args_from_hf(cfg)
    assert written <= used  # every table key it writes, it reads back
    # the keys its messages name are the table's; the dtype's names are no architecture it drops
    names = fam.adapter.hf_names(cfg)
    assert all(names[f] in HF_KEYS[f] for f in names if f in HF_KEYS)
    assert fam.adapter.unconsumed_keys({**cfg, **dict.fromkeys(HF_KEYS["dtype"], "bfloat16")}) == []


class Renamed:
    """The family's adapter reading `alias` where the family reads `home` (a workspace adapter of
    another model_type, which has no hf_names: the twin finds the names in the config itself)."""

    def __init__(self, home: str, alias: str):
        self.home, self.alias = home, alias

    def back(self, cfg: dict) -> dict:
        return {(self.home if k == self.alias else k): v for k, v in cfg.items()}

    def args_from_hf(self, cfg):
        return ADAPTER.args_from_hf(self.back(cfg))

    def width_free(self, cfg):
        return ADAPTER.width_free(self.back(cfg))


CASES = [(f, hf_key(f, BASE), k) for f, keys in HF_KEYS.items() if hf_key(f, BASE) in BASE for k in keys]
CASES = [c for c in CASES if c[1] != c[2]]


def test_the_cases_cover_every_field_a_family_reads():
    # no family reads a shared expert (the transformers path reads it through transformers' class)
    assert {f for f, _, _ in CASES} == set(HF_KEYS) - {"vocab_size", "rope_theta", "tie_embeddings", "init_std",
                                                       "shared_expert_hidden_dim"}  # fmt: skip
    assert all(len(HF_KEYS[f]) == 1 for f in ("vocab_size", "rope_theta", "tie_embeddings", "init_std"))


@pytest.mark.parametrize(("field", "home", "alias"), CASES, ids=[f"{f}-{k}" for f, _, k in CASES])
def test_the_twin_writes_each_size_under_the_name_the_config_uses(field, home, alias):
    plain = derive_twin(BASE, Renamed(home, home))
    assert plain.config == derive_twin(BASE, ADAPTER).config  # the wrapper is faithful
    renamed = {(alias if k == home else k): v for k, v in BASE.items()}
    twin = derive_twin(renamed, Renamed(home, alias))
    assert twin.config == {(alias if k == home else k): v for k, v in plain.config.items()}
    assert twin.args == plain.args
    if field in ("dim", "n_layers", "n_experts", "sliding_window"):  # shrunk, under the alias
        assert twin.config[alias] < BASE[home] and home not in twin.config


@pytest.mark.parametrize("key", HF_KEYS["dtype"])
def test_the_header_check_reads_the_declared_dtype_under_each_name(tmp_path, key):
    model = nn.Linear(4, 4, bias=False, device="meta")
    model.args = SimpleNamespace(tie_embeddings=False)  # what the check asks a model (its head is its own)
    save_file({"weight": torch.zeros(4, 4, dtype=torch.float16)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({key: "bfloat16"}))

    class Identity:
        def from_hf(self, sd, **_):
            return dict(sd)

        def to_hf(self, sd):
            return dict(sd)

    report = check_headers(tmp_path, [tmp_path / "model.safetensors"], model, Identity())
    assert report.dtype_source == f"config.json {key}" and report.dtype_expected == "bfloat16"
    assert [item["hf"] for item in report.wrong_dtype] == [["weight"]]  # the fp16 tensor against it
