"""The checkpoint-header check: every tensor's name, shape and dtype from the safetensors
headers alone, through the family adapter, against the native model on meta.

Two kinds of checkpoint: real ones written here with safetensors from debug-sized models
(sharded with an index, in the published per-expert layout for the MoE), and header-only
fakes of real-size ones (a header describing every tensor of Llama-3.1-8B or
Qwen3-235B-A22B, then the file extended with `truncate` to its declared size: sparse, no
data written). Every test counts the bytes the reader reads, which must be the headers.
"""

from __future__ import annotations

import json
import os

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import titan_core.weights.st_headers as ch
from onboard.upstream.hf_model import UpstreamError
from onboard.upstream.weights_headers import check_checkpoint_headers
from titan_core.models.registry import build_meta, get_family

CODES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}


# ---- writing checkpoints -------------------------------------------------------------
def hf_state_dict(family: str, flavor: str = "debugmodel", dtype=torch.bfloat16, per_expert: bool = False):
    """Real tensors in HF names, as a checkpoint holds them (no tied head, per-expert MoE on request)."""
    fam = get_family(family)
    model = build_meta(family, fam.flavors[flavor])
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    sd = {k: v.to(dtype).contiguous() for k, v in fam.adapter.to_hf(model.state_dict()).items()}
    if fam.flavors[flavor].tie_embeddings:
        del sd["lm_head.weight"]
    return split_experts(sd) if per_expert else sd


def split_experts(sd: dict) -> dict:
    """The fused in-memory expert layout -> the published per-expert one."""
    out = {}
    for key, value in sd.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            base, hidden = key.removesuffix("gate_up_proj"), value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = value[e, :hidden].clone()
                out[f"{base}{e}.up_proj.weight"] = value[e, hidden:].clone()
        elif key.endswith("mlp.experts.down_proj"):
            base = key.removesuffix("down_proj")
            for e in range(value.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = value[e].clone()
        else:
            out[key] = value
    return out


def shard_names(names: list[str], n: int) -> dict[str, str]:
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    return {name: files[i * n // len(names)] for i, name in enumerate(names)}


def write_index(folder, weight_map: dict[str, str]):
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_real(folder, sd: dict, *, shards: int = 1, torch_dtype: str | None = "bfloat16"):
    folder.mkdir(parents=True, exist_ok=True)
    if shards == 1:
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = shard_names(list(sd), shards)
        for file in sorted(set(weight_map.values())):
            save_file({k: v for k, v in sd.items() if weight_map[k] == file}, str(folder / file))
        write_index(folder, weight_map)
    if torch_dtype:
        (folder / "config.json").write_text(json.dumps({"torch_dtype": torch_dtype}))
    return folder


def write_header_only(path, specs: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """A safetensors file whose header declares `specs` ({name: (code, shape)}) and whose
    data region is a hole of the declared size; returns the declared file size."""
    header, offset = {}, 0
    for name, (code, shape) in specs.items():
        n = ch.DTYPES[code][0] * int(torch.Size(shape).numel()) // 8
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
    os.truncate(path, 8 + len(raw) + offset)
    return 8 + len(raw) + offset


def write_fake(folder, specs: dict, *, shards: int, torch_dtype: str = "bfloat16"):
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = shard_names(list(specs), shards)
    for file in sorted(set(weight_map.values())):
        write_header_only(folder / file, {k: v for k, v in specs.items() if weight_map[k] == file})
    write_index(folder, weight_map)
    (folder / "config.json").write_text(json.dumps({"torch_dtype": torch_dtype}))
    return folder


def meta_specs(family: str, flavor: str, code: str = "BF16", per_expert: bool = False) -> dict:
    """{HF name: (code, shape)} of the full-size model, from its native meta model via the adapter."""
    fam = get_family(family)
    sd = fam.adapter.to_hf(build_meta(family, fam.flavors[flavor]).state_dict())
    if fam.flavors[flavor].tie_embeddings:
        del sd["lm_head.weight"]
    if per_expert:
        sd = split_experts(sd)
    return {k: (code, tuple(v.shape)) for k, v in sd.items()}


@pytest.fixture
def counted(monkeypatch):
    """Every byte the header reader reads, counted at the file object."""
    total = {"read": 0, "seeks": 0, "buffered_opens": 0}
    real_open = open

    def counting_open(*a, **kw):
        # a buffered file reads ahead below this wrapper, past what read() returns
        total["buffered_opens"] += kw.get("buffering", a[2] if len(a) > 2 else -1) != 0
        return Counting(real_open(*a, **kw))

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            total["read"] += len(data)
            return data

        def seek(self, *a):
            total["seeks"] += 1
            return self.f.seek(*a)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(ch, "open", counting_open, raising=False)
    return total


def check(folder, family: str, flavor: str = "debugmodel"):
    fam = get_family(family)
    return check_checkpoint_headers(folder, build_meta(family, fam.flavors[flavor]), fam.adapter)


def assert_only(report, kind: str):
    kinds = ("missing", "extra", "wrong_shape", "wrong_dtype", "problems")
    assert {k for k in kinds if getattr(report, k)} == {kind}, report.to_dict()
    assert not report.ok


# ---- real small checkpoints ----------------------------------------------------------
@pytest.mark.parametrize(
    "family, per_expert, shards",
    [("llama3", False, 1), ("qwen3", False, 3), ("glimmer", False, 2), ("qwen3_moe", True, 4)],
)
def test_real_checkpoint_passes_reading_headers_only(tmp_path, counted, family, per_expert, shards):
    folder = write_real(tmp_path / "w", hf_state_dict(family, per_expert=per_expert), shards=shards)
    report = check(folder, family)
    assert report.ok, report.to_dict()
    assert report.dtype_expected == "bfloat16" and report.dtype_source == "config.json torch_dtype"
    assert len(report.files) == shards
    # exactly the headers were read: 8 + N per file, nothing seeked, the data untouched
    assert counted["read"] == report.bytes_read < report.data_bytes
    assert counted["seeks"] == counted["buffered_opens"] == 0
    sizes = sum((folder / f).stat().st_size for f in report.files)
    assert report.bytes_read == sizes - report.data_bytes


def test_reader_agrees_with_safetensors_own_view(tmp_path):
    folder = write_real(tmp_path / "w", hf_state_dict("qwen3_moe", per_expert=True), shards=1)
    ours = ch.read_header(folder / "model.safetensors")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        theirs = {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
        assert ours.metadata == f.metadata()
    assert {k: (t.dtype, t.shape) for k, t in ours.tensors.items()} == theirs
    assert not ours.problems


def test_tied_checkpoint_storing_its_head_passes(tmp_path):
    sd = hf_state_dict("glimmer")
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()  # some exporters keep the tied head
    assert check(write_real(tmp_path / "w", sd), "glimmer").ok


BF16 = {"dtype": torch.bfloat16}
FAULTS = {
    # name: (edit of the HF state dict, kind, what must be named)
    "missing": (
        lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"),
        "missing",
        {"native": "layers.1.feed_forward.w3.weight", "hf": ["model.layers.1.mlp.up_proj.weight"]},
    ),
    "extra_unmappable": (
        lambda sd: sd.update({"model.layers.1.mlp.bonus.weight": torch.zeros(4, **BF16)}),
        "extra",
        {"native": None, "hf": ["model.layers.1.mlp.bonus.weight"]},
    ),
    "extra_not_in_model": (
        lambda sd: sd.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(256, **BF16)}),
        "extra",
        {"native": "layers.0.attention.wq.bias", "hf": ["model.layers.0.self_attn.q_proj.bias"]},
    ),
    "wrong_shape": (
        lambda sd: sd.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(128, 256, **BF16)}),
        "wrong_shape",
        {
            "native": "layers.0.attention.wk.weight",
            "hf": ["model.layers.0.self_attn.k_proj.weight"],
            "checkpoint": [128, 256],
            "model": [64, 256],
        },
    ),
    "wrong_dtype": (
        lambda sd: sd.update({"model.norm.weight": sd["model.norm.weight"].float()}),
        "wrong_dtype",
        {"hf": ["model.norm.weight"], "dtype": "float32", "expected": "bfloat16"},
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_named_and_nothing_else(tmp_path, counted, fault):
    edit, kind, named = FAULTS[fault]
    sd = hf_state_dict("llama3")
    edit(sd)
    report = check(write_real(tmp_path / "w", sd, shards=2), "llama3")
    assert_only(report, kind)
    (item,) = getattr(report, kind)
    assert {k: item[k] for k in named} == named
    assert named["hf"][0] in report.summary()
    assert counted["read"] == report.bytes_read  # the faults too were found from headers alone


def test_moe_expert_missing_from_per_expert_layout_names_the_layer(tmp_path):
    sd = hf_state_dict("qwen3_moe", per_expert=True)
    del sd["model.layers.2.mlp.experts.5.up_proj.weight"]
    report = check(write_real(tmp_path / "w", sd, shards=2), "qwen3_moe")
    # the layer's attention, norms and router still map; its experts cannot stack, and say why
    assert [m["native"] for m in report.missing] == [f"layers.2.moe.experts.{w}" for w in ("w1", "w2", "w3")]
    (unmapped,) = report.extra
    assert "up_proj present for experts" in unmapped["why"] and "layer 2" in unmapped["why"]
    assert "model.layers.2.mlp.experts.5.gate_proj.weight" in unmapped["hf"]
    assert not report.wrong_shape and not report.wrong_dtype


def test_dtype_is_the_declared_one_else_the_checkpoints_own(tmp_path):
    # bf16 tensors, a config.json without torch_dtype, a meta model built in fp32: the headers say bf16
    folder = write_real(tmp_path / "w", hf_state_dict("qwen3"), shards=2, torch_dtype=None)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    undeclared = check(folder, "qwen3")
    assert undeclared.ok, undeclared.to_dict()
    assert undeclared.dtype_expected == "bfloat16" and undeclared.dtype_source.startswith("the checkpoint's headers")
    # one tensor in another dtype is still named: the odd one out of the checkpoint's own
    sd = hf_state_dict("qwen3")
    sd["model.norm.weight"] = sd["model.norm.weight"].float()
    odd = check(write_real(tmp_path / "odd", sd, torch_dtype=None), "qwen3")
    assert_only(odd, "wrong_dtype")
    assert [(w["hf"], w["dtype"], w["expected"]) for w in odd.wrong_dtype] == [
        (["model.norm.weight"], "float32", "bfloat16")
    ]
    # a declared dtype the tensors are not in fails every tensor, as before
    declared = check(write_real(tmp_path / "fp32", hf_state_dict("qwen3"), torch_dtype="float32"), "qwen3")
    assert_only(declared, "wrong_dtype")
    assert len(declared.wrong_dtype) == declared.tensors and declared.dtype_source == "config.json torch_dtype"
    fam = get_family("qwen3")
    meta = build_meta("qwen3", fam.flavors["debugmodel"])
    told = check_checkpoint_headers(folder, meta, fam.adapter, dtype="float16")
    assert told.dtype_source == "argument" and len(told.wrong_dtype) == told.tensors


def test_file_and_index_faults_are_problems(tmp_path):
    folder = write_real(tmp_path / "w", hf_state_dict("llama3"), shards=2)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    moved = "model.norm.weight"
    index["weight_map"][moved] = next(f for f in set(index["weight_map"].values()) if f != index["weight_map"][moved])
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    shard = folder / "model-00001-of-00002.safetensors"
    os.truncate(shard, shard.stat().st_size - 16)  # a download cut short
    report = check(folder, "llama3")
    assert not report.ok
    assert any(moved in p and "the index maps" in p for p in report.problems), report.problems
    assert any(shard.name in p and "truncated" in p for p in report.problems), report.problems


def test_not_a_checkpoint_is_bad_input(tmp_path):
    (tmp_path / "w").mkdir()
    with pytest.raises(UpstreamError, match="no \\*.safetensors"):
        check(tmp_path / "w", "llama3")
    (tmp_path / "w" / "model.safetensors").write_bytes(b"\xff" * 16)  # length field far past the file
    report = check(tmp_path / "w", "llama3")
    assert any("header length" in p for p in report.problems) and report.missing


# ---- header-only fakes at real size --------------------------------------------------
def test_llama_8b_fake_passes_then_each_fault_is_named(tmp_path, counted):
    specs = meta_specs("llama3", "8B")
    folder = write_fake(tmp_path / "ok", specs, shards=4)
    report = check(folder, "llama3", "8B")
    assert report.ok, report.to_dict()
    assert report.tensors == 291 and report.data_bytes == 2 * 8_030_261_248  # bf16, every parameter
    shard = folder / report.files[0]
    assert shard.stat().st_blocks * 512 < 2**20 < shard.stat().st_size  # sparse: the data was never written
    assert counted["read"] == report.bytes_read < 2**20

    specs.pop("model.layers.7.mlp.up_proj.weight")
    specs["model.layers.7.mlp.extra_proj.weight"] = ("BF16", (14336, 4096))
    specs["model.layers.3.self_attn.k_proj.weight"] = ("BF16", (4096, 4096))
    specs["model.layers.30.input_layernorm.weight"] = ("F32", (4096,))
    report = check(write_fake(tmp_path / "bad", specs, shards=4), "llama3", "8B")
    assert [m["native"] for m in report.missing] == ["layers.7.feed_forward.w3.weight"]
    assert [e["hf"] for e in report.extra] == [["model.layers.7.mlp.extra_proj.weight"]]
    assert [(w["native"], w["checkpoint"], w["model"]) for w in report.wrong_shape] == [
        ("layers.3.attention.wk.weight", [4096, 4096], [1024, 4096])
    ]
    wrong_dtype = [(w["hf"], w["dtype"]) for w in report.wrong_dtype]
    assert wrong_dtype == [(["model.layers.30.input_layernorm.weight"], "float32")]
    assert not report.problems


def test_qwen3_235b_fake_in_published_layout_passes(tmp_path, counted):
    """36,096 per-expert tensors over 94 layers, 470 GB declared, checked from headers."""
    specs = meta_specs("qwen3_moe", "235B-A22B", per_expert=True)
    report = check(write_fake(tmp_path / "w", specs, shards=8), "qwen3_moe", "235B-A22B")
    assert report.ok, report.summary()
    assert report.tensors == 94 * (128 * 3 + 9) + 3
    assert report.data_bytes == 2 * 235_093_634_560
    assert counted["read"] == report.bytes_read < 8 * 2**20
