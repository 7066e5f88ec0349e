"""[lora] on the port path: a workspace scaffolded by `onboard new-model --path port` from a tiny Llama
checkpoint, whose recipe builds the workspace's own model.py and maps names through its own adapter.py.
The recipe's HF module names reach the port's layers through that adapter; with B zero its logits are
the port's without adapters bit for bit; the same adapter weights put on LlamaForCausalLM by peft give
its logits (fp32, the gates' bound); its PEFT export, after a step, loads in `PeftModel.from_pretrained`
with the trained model's logits. (The native and transformers paths: tests/core/unit/test_lora.py.)"""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from hf_tiny import write_tiny_llama
from tiny_flags import tiny_run_flags
from titan_core.config import load_config
from titan_core.lora.export import hf_key
from titan_core.measure.numerics import rel_l2
from titan_core.training.trainer import Trainer

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

LORA = ["--parallelism.data_parallel=none", "--lora.enable", "--lora.target_modules=q_proj,v_proj,down_proj"]
EXPORT_REL = 1e-5
"""The gates' fp32 bound: the same model's logits computed by another implementation."""


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    """The tiny checkpoint and the port workspace scaffolded from it."""
    from onboard.cli.app import app

    root = tmp_path_factory.mktemp("lora_port")
    ckpt = write_tiny_llama(root / "llama")
    made = CliRunner().invoke(app, ["new-model", "user_port", "--hf-config", str(ckpt / "config.json"),
                                    "--path", "port", "--dir", str(root), "--device", "cpu"])  # fmt: skip
    assert made.exit_code == 0, made.output
    ws = root / "onboarding" / "user_port"
    assert 'module_file = "model.py"' in (ws / "recipe.toml").read_text()
    return ckpt, ws


def _trainer(port, out, *extra, steps=1) -> Trainer:
    ckpt, ws = port
    flags = [f"--checkpoint.initial_hf={ckpt}", *tiny_run_flags(out, steps=steps, batch_size=2), *extra]
    return Trainer(load_config(str(ws / "recipe.toml"), flags), quiet=True)


def _tokens():
    return torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(3))


def test_the_port_adapts_its_own_layers_and_zero_b_is_the_port_bit_for_bit(port, tmp_path):
    ckpt, ws = port
    adapted = _trainer(port, tmp_path / "a", *LORA)
    assert adapted.cfg.model.module_file == str(ws / "model.py")
    assert type(adapted.model).__module__ != "titan_core.models.common.decoder"  # the workspace's own class
    targets = adapted.lora.names.targets
    assert len(targets) == 6 and "model.layers.1.mlp.down_proj" in targets.values()
    plain = _trainer(port, tmp_path / "b", "--parallelism.data_parallel=none")
    with torch.no_grad():
        assert torch.equal(adapted.model(_tokens()), plain.model(_tokens()))


def test_the_same_adapter_weights_on_transformers_class_give_the_ports_logits(port, tmp_path):
    ckpt, _ = port
    trainer = _trainer(port, tmp_path, *LORA)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    config = peft.LoraConfig(r=trainer.cfg.lora.rank, lora_alpha=trainer.cfg.lora.alpha,
                             target_modules=sorted(set(trainer.lora.names.targets.values())))  # fmt: skip
    upstream = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32), config)
    sd = peft.get_peft_model_state_dict(trainer.model)
    result = peft.set_peft_model_state_dict(upstream, {hf_key(k, trainer.lora): v for k, v in sd.items()})
    assert not result.unexpected_keys and not [k for k in result.missing_keys if "lora_" in k]
    with torch.no_grad():
        want, got = trainer.model(_tokens()), upstream(_tokens()).logits
        assert rel_l2(got, want) <= EXPORT_REL
        upstream.base_model.model.model.layers[1].mlp.down_proj.lora_B["default"].weight.mul_(2)
        assert rel_l2(upstream(_tokens()).logits, want) > 1e-4  # the comparison can fail


def test_the_ports_peft_export_loads_in_peft_with_the_trained_logits(port, tmp_path):
    ckpt, _ = port
    out = tmp_path / "adapter"
    trainer = _trainer(port, tmp_path / "run", *LORA, f"--checkpoint.export_hf={out}", steps=2)
    trainer.train()
    assert any(p.any() for n, p in trainer.model.named_parameters() if "lora_B" in n)  # the steps moved B
    base = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    reloaded = peft.PeftModel.from_pretrained(base, out)
    with torch.no_grad():
        want, got = trainer.model(_tokens()), reloaded(_tokens()).logits
        assert rel_l2(got, want) <= EXPORT_REL
        with reloaded.disable_adapter():  # the comparison can fail: the trained adapter changes the logits
            assert rel_l2(reloaded(_tokens()).logits, want) > 1e-5
