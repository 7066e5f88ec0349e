"""`onboard export NAME --to DIR [--from CHECKPOINT | --from-initial]`: the workspace's newest checkpoint
(or the one named, or with --from-initial its untrained checkpoint.initial_hf weights) exported as the
run's own export writes it, with the run's tokenizer, which AutoTokenizer then loads; an existing DIR
only with --force (kept as a dated backup); nothing to export is bad input that says to train first.
(The guards without transformers: test_export_guards.py.)"""

from __future__ import annotations

import json

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from onboard.cli.app import app

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf
runner = CliRunner()


def onboard(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def ws(tmp_path):
    """A workspace made from a tiny transformers Llama, its weights saved beside it."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=128, vocab_size=256, max_position_embeddings=256)  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    made = onboard("new-model", "tiny", "--hf-config", tmp_path / "llama" / "config.json", "--device", "cpu",
                   "--dir", tmp_path)  # fmt: skip
    assert made.exit_code == 0, made.stderr
    return tmp_path


def _recipe(ws):
    return ws / "onboarding" / "tiny" / "recipe.toml"


def test_nothing_to_export_says_train_first(ws):
    result = onboard("export", "tiny", "--to", ws / "out", "--dir", ws)
    assert result.exit_code == 2
    assert "no checkpoint to export" in result.stderr and "train first (onboard train tiny)" in result.stderr
    assert not (ws / "out").exists()


def test_initial_weights_export_and_force_keeps_a_backup(ws):
    with open(_recipe(ws), "a") as f:
        f.write(f'\n[checkpoint]\ninitial_hf = "{ws / "llama"}"\n')
    untrained = onboard("export", "tiny", "--to", ws / "out", "--dir", ws)
    assert untrained.exit_code == 2 and "--from-initial" in untrained.stderr  # never a silent fall-back
    result = onboard("export", "tiny", "--to", ws / "out", "--dir", ws, "--json", "--from-initial")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["from"] == f"checkpoint.initial_hf {ws / 'llama'} (untrained)"
    assert report["files"] == ["config.json", "model.safetensors"]
    got, want = load_file(ws / "out" / "model.safetensors"), load_file(ws / "llama" / "model.safetensors")
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    again = onboard("export", "tiny", "--to", ws / "out", "--dir", ws, "--from-initial")
    assert again.exit_code == 2 and "exists: pass --force" in again.stderr
    before = (ws / "out" / "model.safetensors").read_bytes()
    forced = onboard("export", "tiny", "--to", ws / "out", "--dir", ws, "--force", "--json", "--from-initial")
    assert forced.exit_code == 0, forced.stderr
    [backup] = ws.glob("out.backup-*")
    assert json.loads(forced.stdout)["backup"] == str(backup)
    assert (backup / "model.safetensors").read_bytes() == before


def test_the_newest_checkpoint_exports_as_the_run_itself_did(ws):
    trained = onboard("train", "--config", _recipe(ws), "--training.steps=2", "--training.batch_size=2",
                      "--training.seq_len=32", "--checkpoint.enable",
                      f"--checkpoint.export_hf={ws / 'run_export'}")  # fmt: skip
    assert trained.exit_code == 0, trained.stderr
    result = onboard("export", "tiny", "--to", ws / "out", "--dir", ws, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["from"].endswith("step-2")
    got, want = load_file(ws / "out" / "model.safetensors"), load_file(ws / "run_export" / "model.safetensors")
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    config = json.loads((ws / "out" / "config.json").read_text())
    assert config == json.loads((ws / "run_export" / "config.json").read_text())
    bad = onboard("export", "tiny", "--to", ws / "out2", "--from", ws / "nowhere", "--dir", ws)
    assert bad.exit_code == 2 and "--from" in bad.stderr


def test_a_checkpoint_export_carries_the_tokenizer_autotokenizer_loads(ws):
    """The probe's case: `--from` a checkpoint of a run trained with the model's own tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = ws / "tok"
    tok.mkdir()
    tokenizer = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tok / "tokenizer.json"))
    (tok / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    trained = onboard("train", "tiny", "--dir", ws, "--steps", 1, "--training.batch_size=1", "--training.seq_len=16",
                      "--checkpoint.enable")  # fmt: skip
    assert trained.exit_code == 0, trained.stderr
    step = ws / "onboarding" / "tiny" / "runs" / "train" / "checkpoints" / "step-1"
    result = onboard("export", "tiny", "--to", ws / "out", "--from", step, "--tokenizer", tok, "--dir", ws)
    assert result.exit_code == 0, result.stderr
    loaded = transformers.AutoTokenizer.from_pretrained(ws / "out")
    assert loaded("hello").input_ids[-1] == 3 and loaded.eos_token == "</s>"
    assert transformers.AutoModelForCausalLM.from_pretrained(ws / "out").config.vocab_size == 256


def test_a_lora_recipe_exports_its_peft_adapter_or_with_merged_the_merged_model(ws):
    """[lora]: the checkpoint's adapter as the run's own export wrote it (bit for bit), and with --merged the
    merged model, which transformers reloads with the adapter's logits (PeftModel on the base)."""
    peft = pytest.importorskip("peft")
    plain = onboard("export", "tiny", "--to", ws / "x", "--dir", ws, "--merged")
    assert plain.exit_code == 2 and "--merged merges LoRA adapters" in plain.stderr and not (ws / "x").exists()
    with open(_recipe(ws), "a") as f:
        f.write(f'\n[checkpoint]\ninitial_hf = "{ws / "llama"}"\n\n[lora]\nenable = true\n'
                'target_modules = ["q_proj", "v_proj", "down_proj"]\n')
    trained = onboard("train", "--config", _recipe(ws), "--training.steps=2", "--training.batch_size=2",
                      "--training.seq_len=32", "--checkpoint.enable", "--parallelism.data_parallel=none",
                      f"--checkpoint.export_hf={ws / 'run_adapter'}")  # fmt: skip
    assert trained.exit_code == 0, trained.stderr
    result = onboard("export", "tiny", "--to", ws / "adapter", "--dir", ws, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["files"] == ["adapter_config.json", "adapter_model.safetensors"]
    got = load_file(ws / "adapter" / "adapter_model.safetensors")
    want = load_file(ws / "run_adapter" / "adapter_model.safetensors")
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert any(k.endswith("lora_B.weight") and v.any() for k, v in got.items())
    merged = onboard("export", "tiny", "--to", ws / "merged", "--dir", ws, "--merged")
    assert merged.exit_code == 0, merged.stderr
    tokens = torch.tensor([[1, 5, 9, 2, 7, 40, 3]])
    base = transformers.AutoModelForCausalLM.from_pretrained(ws / "llama", dtype=torch.float32)
    with torch.no_grad():
        untrained = base(tokens).logits
        want = peft.PeftModel.from_pretrained(base, ws / "adapter")(tokens).logits  # (adapts `base` in place)
        got = transformers.AutoModelForCausalLM.from_pretrained(ws / "merged", dtype=torch.float32)(tokens).logits
    assert ((got - want).norm() / want.norm()).item() <= 1e-5
    assert ((untrained - want).norm() / want.norm()).item() > 1e-5  # the adapter moved the logits
