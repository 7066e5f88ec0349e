"""A [lora] run's weight stream (titan_core/lora/stream.py), one process, fp32, after a training step:
merged, the tensors the merged export writes, bit for bit, both those of peft's merge_and_unload on a copy
of the model, and a transformers model updated in place from it gives the merged export's logits; adapter-only, the tensors of the PEFT export under its keys."""

from __future__ import annotations

import pytest
import torch

from hf_tiny import tiny_cfg, write_tiny_llama
from titan_core.lora.inject import base_state_dict, merged_copy
from titan_core.lora.stream import lora_weights
from titan_core.measure.numerics import rel_l2
from titan_core.models.model_builder import model_adapter
from titan_core.training.trainer import Trainer
from titan_core.weights.hf_stream import stream_plan

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytestmark = pytest.mark.hf

LORA = ["--parallelism.data_parallel=none", "--lora.enable", "--lora.target_modules=q_proj,v_proj,down_proj",
        "--lora.modules_to_save=lm_head"]  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")


def _trained(ckpt, out, *extra) -> Trainer:
    trainer = Trainer(tiny_cfg(ckpt, out / "run", *LORA, *extra), quiet=True)
    trainer.train()
    assert any(p.any() for n, p in trainer.model.named_parameters() if "lora_B" in n)  # a step moved B
    return trainer


def _loaded(folder) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in safetensors_torch.load_file(f).items()}


def test_the_merged_stream_is_the_merged_export_and_updates_a_transformers_model_in_place(tmp_path, ckpt):
    merged_dir = tmp_path / "merged"
    trainer = _trained(ckpt, tmp_path, "--lora.merged_export", f"--checkpoint.export_hf={merged_dir}")
    adapter = model_adapter(trainer.cfg.model)
    streamed = list(lora_weights(trainer.model, trainer.lora, adapter, merged=True))
    names = [n for n, _ in streamed]
    assert len(names) == len(set(names)) and not any("lora_" in n or "base_layer" in n for n in names)
    exported = _loaded(merged_dir)
    assert set(names) == set(exported)
    assert all(torch.equal(t, exported[n]) for n, t in streamed), "the merged stream is the merged export"
    # both held to peft's own merge_and_unload on a copy of the model, streamed as any model is
    reference = dict(stream_plan(merged_copy(trainer.lora), adapter).weights())
    assert reference.keys() == exported.keys() and all(torch.equal(reference[n], t) for n, t in exported.items())
    base = _loaded(ckpt)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(exported[q], base[q]) and not torch.equal(exported["lm_head.weight"], base["lm_head.weight"])
    # the loop's shape: a transformers model of the base, updated in place from the stream
    engine = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    params = dict(engine.named_parameters())
    with torch.no_grad():
        for name, tensor in lora_weights(trainer.model, trainer.lora, adapter, merged=True):
            params[name].copy_(tensor)
        tokens = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(5))
        got = engine(tokens).logits
        want = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)(tokens).logits
        trained = trainer.model(tokens)
    assert torch.equal(got, want)
    assert rel_l2(got, trained) <= 1e-5  # merged against the adapters the run trained: fp32 rounding


def test_the_adapter_stream_is_the_peft_export(tmp_path, ckpt):
    adapter_dir = tmp_path / "adapter"
    trainer = _trained(ckpt, tmp_path, f"--checkpoint.export_hf={adapter_dir}")
    streamed = dict(lora_weights(trainer.model, trainer.lora, model_adapter(trainer.cfg.model), merged=False))
    exported = safetensors_torch.load_file(adapter_dir / "adapter_model.safetensors")
    assert streamed.keys() == exported.keys()
    assert all(torch.equal(streamed[k], exported[k]) for k in exported)
    assert any(".lora_A." in k for k in streamed) and any(k.endswith("lm_head.weight") for k in streamed)


def test_a_delta_on_a_tensor_the_adapter_does_not_rename_is_refused(tmp_path, ckpt):
    trainer = _trained(ckpt, tmp_path)
    adapter, base = model_adapter(trainer.cfg.model), base_state_dict(trainer.model)
    plan = stream_plan(trainer.model, adapter, tensors=base, deltas={"layers.0.attention.wq.weight": torch.zeros})
    assert list(plan.deltas) == ["layers.0.attention.wq.weight"]  # a renamed tensor: accepted
    with pytest.raises(ValueError, match="renames"):
        stream_plan(trainer.model, adapter, tensors=base, deltas={"layers.0.attention.wq.lora_A.weight": torch.zeros})
