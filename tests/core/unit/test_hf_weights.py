"""checkpoint.initial_hf and the sharded export, in one process, on a tiny Llama that transformers
wrote in 2 shards (tests/core/hf_tiny.py): the step-1 loss equals transformers', the export reloads
with AutoModelForCausalLM and generates what the trained model does, bad checkpoints are refused
naming the file, a resume ignores initial_hf, an interrupted export leaves nothing complete-looking."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hf_tiny import hf_greedy, hf_loss, tiny_cfg, titan_greedy, write_tiny_llama
from titan_core.config import ConfigError
from titan_core.config.sections import Data
from titan_core.data import build_data_loader
from titan_core.measure.numerics import rel
from titan_core.training import hf_export
from titan_core.training.trainer import Trainer
from titan_core.weights.strided import arrange, source_box, view_map

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

LOSS_REL = 1e-5
"""Step-1 loss from the checkpoint vs transformers' on the same batch, fp32 (issue 34)."""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")
    assert len(list(folder.glob("model-*-of-00002.safetensors"))) == 2
    return folder


def _first_batch(cfg):
    return next(build_data_loader(cfg, vocab_size=512))


# ---- (a) the step-1 loss is transformers' --------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_step1_loss_from_initial_hf_is_transformers_loss(tmp_path, ckpt, tied):
    folder = ckpt if not tied else write_tiny_llama(tmp_path / "tied", tied=True, seed=1)
    cfg = tiny_cfg(folder, tmp_path / "out")
    trainer = Trainer(cfg, quiet=True)
    assert trainer.args.tie_embeddings is tied
    batch = _first_batch(cfg)
    want = hf_loss(folder, batch.tokens, batch.labels)
    result = trainer.train()
    assert result.weights_from.startswith(f"loaded initial weights from {folder} (")
    assert rel(result.metrics[0]["loss"], want) <= LOSS_REL, (result.metrics[0]["loss"], want)


def test_without_initial_hf_the_loss_is_another(tmp_path, ckpt):
    """The comparison above can fail: from the seed's weights the loss differs."""
    cfg = tiny_cfg(ckpt, tmp_path / "out")
    cfg.checkpoint.initial_hf = ""
    batch = _first_batch(cfg)
    result = Trainer(cfg, quiet=True).train()
    assert result.weights_from == ""
    assert rel(result.metrics[0]["loss"], hf_loss(ckpt, batch.tokens, batch.labels)) > 1e-3


# ---- (c) the export ships -------------------------------------------------------------------
def test_sharded_export_reloads_and_generates_the_same_tokens(tmp_path, ckpt):
    cfg = tiny_cfg(ckpt, tmp_path / "out", "--checkpoint.export_hf=export", "--checkpoint.export_shard_mb=1", steps=3)
    trainer = Trainer(cfg, quiet=True)
    trainer.train()
    out = tmp_path / "out" / "export"
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                     "model.safetensors.index.json"]  # fmt: skip
    index = json.loads((out / "model.safetensors.index.json").read_text())
    sizes = [(out / n).stat().st_size for n in names if n.startswith("model-")]
    assert all(s <= 1_000_000 + 4096 for s in sizes)  # each shard within export_shard_mb (plus its header)
    assert set(index["weight_map"].values()) == {names[1], names[2]}
    assert index["metadata"]["total_size"] == sum(sizes) - sum(_header_bytes(out / n) for n in names[1:3])
    assert not list(tmp_path.glob("out/.export*"))  # the temp folder is gone
    assert hf_greedy(out) == titan_greedy(trainer.model)
    assert titan_greedy(trainer.model) != hf_greedy(ckpt)  # training moved the weights: the check can fail


def _header_bytes(path) -> int:
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def test_tokenizer_files_travel_with_the_export(tmp_path, ckpt):
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (tok / name).write_text(json.dumps({"name": name}))
    (tok / "vocab.txt").write_text("not copied")
    files = hf_export.tokenizer_files(Data(tokenizer="hf", tokenizer_path=str(tok / "tokenizer.json")))
    assert [n for _, n in files] == ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    assert hf_export.tokenizer_files(Data(tokenizer="byte", tokenizer_path=str(tok))) == []
    trainer = Trainer(tiny_cfg(ckpt, tmp_path / "out"), quiet=True)
    out = hf_export.export_hf(trainer.model, "llama3", trainer.args, tmp_path / "export", model_cfg=trainer.cfg.model,
                              tokenizer=files)  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    assert json.loads((out / "tokenizer_config.json").read_text()) == {"name": "tokenizer_config.json"}


# ---- (d) bad checkpoints: ConfigError naming the file -----------------------------------------
def test_missing_shard_is_named(tmp_path, ckpt):
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    (broken / "model-00002-of-00002.safetensors").unlink()
    missing = r"model\.safetensors\.index\.json names shard\(s\) missing .*model-00002-of-00002"
    with pytest.raises(ConfigError, match=missing):
        Trainer(tiny_cfg(broken, tmp_path / "out"), quiet=True)


def test_checkpoint_of_another_architecture_is_refused(tmp_path, ckpt):
    qwen = tmp_path / "qwen3"
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=768, vocab_size=512, max_position_embeddings=256)).save_pretrained(qwen)  # fmt: skip
    cfg = tiny_cfg(ckpt, tmp_path / "out")
    cfg.checkpoint.initial_hf = str(qwen)
    other = rf"{qwen / 'config.json'}: model_type 'qwen3', but the recipe's model is llama"
    with pytest.raises(ConfigError, match=other):
        Trainer(cfg, quiet=True)
    # the same tensors under a llama config: the header check names the extra q_norm and its file
    config = json.loads((qwen / "config.json").read_text())
    config.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (qwen / "config.json").write_text(json.dumps(config))
    extra = r"model\.safetensors: model\.layers\.\d\.self_attn\.[qk]_norm\.weight is extra"
    with pytest.raises(ConfigError, match=extra):
        Trainer(cfg, quiet=True)


def test_shape_mismatch_names_the_file_and_tensor(tmp_path, ckpt):
    wider = write_tiny_llama(tmp_path / "wider", intermediate_size=640)
    cfg = tiny_cfg(ckpt, tmp_path / "out")
    cfg.checkpoint.initial_hf = str(wider)
    shape = r"model-0000\d-of-0000\d\.safetensors: model\.layers\.0\.mlp\.\w+_proj\.weight is \["
    with pytest.raises(ConfigError, match=shape) as e:
        Trainer(cfg, quiet=True)
    assert "640" in str(e.value) and str(wider) in str(e.value)


def test_export_into_a_foreign_folder_is_refused_before_training(tmp_path, ckpt):
    cfg = tiny_cfg(ckpt, tmp_path / "out", f"--checkpoint.export_hf={ckpt}")
    with pytest.raises(ConfigError, match=rf"will not write the export into {ckpt}: .*no earlier export"):
        Trainer(cfg, quiet=True)


# ---- (e) a resume from the run's own checkpoint wins ------------------------------------------
def test_resume_ignores_initial_hf_and_says_so(tmp_path, ckpt):
    start = tmp_path / "start"
    shutil.copytree(ckpt, start)
    ckpt_args = ("--checkpoint.enable", "--checkpoint.interval=2", "--checkpoint.folder=ckpt")
    first = Trainer(tiny_cfg(start, tmp_path / "out", *ckpt_args, steps=2), quiet=True).train()
    assert first.weights_from.startswith("loaded initial weights")
    for f in start.glob("*.safetensors"):  # unreadable now: a resume must not even look
        f.write_bytes(b"gone")
    resumed = Trainer(tiny_cfg(start, tmp_path / "out", *ckpt_args, steps=3), quiet=True).train()
    assert resumed.resumed_from == 2 and [r["step"] for r in resumed.metrics] == [3]
    assert resumed.weights_from == (
        f"resumed from step 2 (checkpoint.initial_hf {start} not loaded: the run's own checkpoint takes precedence)"
    )


# ---- (f) an interrupted export ----------------------------------------------------------------
def test_interrupted_export_leaves_no_complete_looking_target(tmp_path, ckpt, monkeypatch):
    import safetensors.torch

    trainer = Trainer(tiny_cfg(ckpt, tmp_path / "out"), quiet=True)
    out = tmp_path / "export"

    def export():
        return hf_export.export_hf(trainer.model, "llama3", trainer.args, out, model_cfg=trainer.cfg.model, shard_mb=1)

    export()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real, calls = safetensors.torch.save_file, []

    def dies_on_the_second_shard(*a, **kw):
        calls.append(a[1])
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*a, **kw)

    monkeypatch.setattr(safetensors.torch, "save_file", dies_on_the_second_shard)
    with pytest.raises(OSError, match="No space left"):
        export()
    assert len(calls) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier export, untouched
    # no partial folder, no backup
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith((".", "export"))] == ["export"]
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    export()  # replacing an earlier export keeps it as a dated backup
    [backup] = tmp_path.glob("export.backup-*")
    assert {p.name: p.read_bytes() for p in backup.iterdir()} == before
    export()  # and a second replacement keeps the first backup too: nothing is deleted
    assert len(list(tmp_path.glob("export.backup-*"))) == 2 and backup.is_dir()
    with pytest.raises(ConfigError, match="it exists"):
        hf_export.export_hf(trainer.model, "llama3", trainer.args, out, model_cfg=trainer.cfg.model, replace="never")


# ---- the boxes a view reads -------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [lambda t: t, lambda t: t.t(), lambda t: t[2:5], lambda t: t[:, 1:4].t(), lambda t: t[3],
     lambda t: t.unsqueeze(0), lambda t: torch.split(t, 3, dim=1)[1]],
)  # fmt: skip
def test_a_views_box_is_read_from_its_source(make):
    source = torch.arange(6 * 8, dtype=torch.float32).reshape(6, 8)
    meta = torch.empty(6, 8, device="meta")
    view = make(meta)
    vm = view_map(view, meta)
    assert vm is not None
    want = make(source)
    box = [(min(1, n - 1), max(n - 1, 1)) for n in view.shape]  # all but the first row/column of each dim
    sl = source_box(vm, box)
    got = arrange(vm, source[sl], [n for _, n in box])
    assert torch.equal(got, want[tuple(slice(o, o + n) for o, n in box)])


def test_a_new_tensor_has_no_box():
    meta = torch.empty(6, 8, device="meta")
    assert view_map(torch.cat([meta, meta]), meta) is None
    assert view_map(meta.reshape(2, 24), meta) is None


def test_a_box_maps_the_file_bytes_from_its_first_to_its_last_element():
    from types import SimpleNamespace

    from titan_core.training.hf_load import _span_bytes

    header = SimpleNamespace(shape=(6, 8), nbytes=6 * 8 * 4)  # fp32, row-major
    # rows 1-2, columns 2-4: elements 10 .. 20, so 11 elements' bytes, though the box holds 6
    assert _span_bytes(header, (slice(1, 3), slice(2, 5))) == 11 * 4
    assert _span_bytes(header, (slice(0, 6), slice(0, 8))) == header.nbytes  # the whole tensor
    assert _span_bytes(header, (slice(2, 4), slice(0, 8))) == 2 * 8 * 4  # whole rows: exactly their bytes


# ---- the transformers path --------------------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_transformers_path_starts_from_the_checkpoint(tmp_path, ckpt, tied):
    """transformers' own class run by titan_core reads the checkpoint through its checkpoint_reader."""
    folder = ckpt if not tied else write_tiny_llama(tmp_path / "tied", tied=True, seed=1)
    cfg = tiny_cfg(folder, tmp_path / "out", "--model.family=transformers", "--checkpoint.export_hf=export")
    cfg.model.overrides = {}
    batch = _first_batch(cfg)
    trainer = Trainer(cfg, quiet=True)
    result = trainer.train()
    assert result.weights_from.startswith(f"loaded initial weights from {folder} (")
    assert rel(result.metrics[0]["loss"], hf_loss(folder, batch.tokens, batch.labels)) <= LOSS_REL
    stored = sorted(p.name for p in (tmp_path / "out" / "export").glob("*.safetensors"))
    assert stored and hf_greedy(tmp_path / "out" / "export") == titan_greedy(trainer.model)
