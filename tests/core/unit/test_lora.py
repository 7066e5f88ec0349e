"""[lora] through peft on a tiny Llama (2 layers, dim 64), one process (2 ranks under SimpleFSDP, FSDP2 and tp:
tests/core/dist/test_lora_two_ranks.py, test_lora_tp.py), fp32: with B zero the logits are the base model's bit
for bit; a step moves only the adapters (and modules_to_save), which alone hold gradients and AdamW state; merged
equals unmerged within fp32 rounding; the PEFT export loads in `PeftModel.from_pretrained` on transformers' class
with the trained model's logits; the same adapter weights put on transformers' class by peft give the same
logits; a DCP resume continues the same curve; compiled modes and float8 base layers train the adapters. (The
port path: tests/onboard/workspace/test_lora_port.py; bad input: test_lora_refusals.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from hf_tiny import tiny_cfg, write_tiny_llama
from lora_cases import LORA, TINY, built, lora_cfg, refusal, sample_tokens
from tiny_flags import tiny_run_flags
from titan_core.config import load_config
from titan_core.lora.export import PREFIX, hf_key
from titan_core.lora.inject import apply_lora, base_state_dict, merged_copy
from titan_core.measure.numerics import rel_l2
from titan_core.models.model_builder import model_adapter
from titan_core.training.trainer import Trainer

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

MERGE_REL = 1e-6
"""Merged against unmerged logits, fp32: the merge adds B @ A * scale into W once, the unmerged model adds
(x @ A^T) @ B^T * scale to x @ W^T: the same sum in another order."""
EXPORT_REL = 1e-5
"""The gates' fp32 bound: a reload's logits against the trained model's."""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")


def _randomise_b(model):
    """Give every lora_B values (peft starts them at zero), so the adapters change the output."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)

def test_zero_b_computes_the_base_bit_for_bit(tmp_path):
    cfg, model = built(tmp_path)
    with torch.no_grad():
        base = model(sample_tokens())
    state = apply_lora(model, cfg.lora, model_adapter(cfg.model))
    bs = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert len(bs) == 6 and all(not b.any() for b in bs)  # the claim is about peft's zero B ...
    assert all(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_A" in n)  # ... with A drawn
    modules = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
    assert set(state.names.targets.values()) == {f"model.layers.{i}.{m}" for i in (0, 1) for m in modules}
    with torch.no_grad():
        assert torch.equal(model(sample_tokens()), base)
        _randomise_b(model)
        assert not torch.equal(model(sample_tokens()), base)  # the comparison can fail: adapters act on the output


def test_base_weights_keep_their_native_names(tmp_path):
    """peft renames wq.weight to wq.base_layer.weight; base_state_dict gives every base tensor under its
    name before peft (what the adapter's to_hf and checkpoint.initial_hf go by), and nothing else."""
    cfg, model = built(tmp_path, "--lora.modules_to_save=lm_head")
    before = dict(model.state_dict(keep_vars=True))
    apply_lora(model, cfg.lora, model_adapter(cfg.model))
    after = model.state_dict(keep_vars=True)
    assert "layers.0.attention.wq.weight" not in after and "layers.0.attention.wq.base_layer.weight" in after
    assert "output.original_module.weight" in after
    base = base_state_dict(model)
    assert list(base) == list(before) and all(base[k] is before[k] for k in before)
    assert set(model_adapter(cfg.model).to_hf(base)) >= {"model.layers.0.self_attn.q_proj.weight", "lm_head.weight"}


def test_a_step_moves_only_the_adapters_and_saved_modules(tmp_path):
    cfg = lora_cfg(tmp_path, "--lora.modules_to_save=lm_head")
    trainer = Trainer(cfg, quiet=True)
    model = trainer.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n or ".modules_to_save." in n for n in trainable)
    trainer.train_step()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert grads == trainable
    assert {n for n in trainable if "lora_A" not in n} <= moved <= trainable  # B and lm_head moved; A may not yet
    with_state = {id(p) for p in trainer.optimizer.state}
    assert with_state == {id(p) for n, p in model.named_parameters() if n in trainable}
    assert sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"]) == trainer.lora.trainable(model)


def test_the_memory_estimate_counts_gradients_and_adamw_state_of_what_trains(tmp_path):
    trainer = Trainer(lora_cfg(tmp_path, "--lora.modules_to_save=lm_head"), quiet=True)
    trainable = trainer.lora.trainable(trainer.model)
    est = trainer.memory_estimate
    assert est.grads == 4 * trainable and est.optimizer_state == 2 * 4 * trainable  # fp32
    assert est.params == 4 * sum(p.numel() for p in trainer.model.parameters())
    whole = Trainer(load_config(None, [TINY, *tiny_run_flags(tmp_path / "w", steps=1, batch_size=2),
                                       "--parallelism.data_parallel=none"]), quiet=True)  # fmt: skip
    assert whole.memory_estimate.grads == 4 * sum(p.numel() for p in whole.model.parameters())


def test_a_lora_runs_flops_count_no_weight_gradient_of_the_frozen_base(tmp_path):
    """MFU counts what the step computes: 6 FLOPs per token per trained weight, 4 per frozen one (its input's
    gradient, not its own)."""
    trainer = Trainer(lora_cfg(tmp_path), quiet=True)
    whole = Trainer(load_config(None, [TINY, *tiny_run_flags(tmp_path / "w", steps=1, batch_size=2),
                                       "--parallelism.data_parallel=none"]), quiet=True)  # fmt: skip
    frozen = sum(p.numel() for n, p in whole.model.named_parameters() if not n.startswith("tok_embeddings"))
    want = whole.flops_per_token - 2 * frozen + 6 * trainer.lora.trainable(trainer.model)
    assert trainer.flops_per_token == pytest.approx(want, rel=1e-12) and trainer.flops_per_token < whole.flops_per_token


def test_merged_equals_unmerged(tmp_path):
    cfg, model = built(tmp_path)
    state = apply_lora(model, cfg.lora, model_adapter(cfg.model))
    _randomise_b(model)
    merged = merged_copy(state)
    assert not any(isinstance(m, peft.tuners.tuners_utils.BaseTunerLayer) for m in merged.modules())
    assert any(isinstance(m, peft.tuners.tuners_utils.BaseTunerLayer) for m in model.modules())  # the model keeps them
    with torch.no_grad():
        want, got = model(sample_tokens()), merged(sample_tokens())
    assert rel_l2(got, want) <= MERGE_REL
    assert rel_l2(merged.layers["0"].attention.wq.weight, model.layers["0"].attention.wq.base_layer.weight) > 1e-4


def _peft_logits(base_dir, adapter_dir, tokens):
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, adapter_dir)
    with torch.no_grad():
        return model(tokens).logits


def test_peft_export_loads_in_peft_with_the_trained_logits(tmp_path, ckpt):
    out = tmp_path / "adapter"
    cfg = tiny_cfg(ckpt, tmp_path / "run", *LORA, "--lora.modules_to_save=lm_head", f"--checkpoint.export_hf={out}")
    trainer = Trainer(cfg, quiet=True)
    trainer.train()
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(ckpt) and config["modules_to_save"] == ["lm_head"]
    from safetensors.torch import load_file

    keys = set(load_file(out / "adapter_model.safetensors"))
    assert f"{PREFIX}model.layers.1.mlp.down_proj.lora_B.weight" in keys and f"{PREFIX}lm_head.weight" in keys
    assert any(p.any() for n, p in trainer.model.named_parameters() if "lora_B" in n)  # a step moved B
    tokens = sample_tokens(512)
    with torch.no_grad():
        want = trainer.model(tokens)
    got = _peft_logits(ckpt, out, tokens)
    assert rel_l2(got, want) <= EXPORT_REL
    base = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    with torch.no_grad():
        assert rel_l2(base(tokens).logits, want) > 1e-4  # the comparison can fail: the adapter changes the logits


@pytest.mark.parametrize("family", ["llama3", "transformers"])
def test_same_adapter_weights_on_transformers_class_give_the_same_logits(tmp_path, ckpt, family):
    """On the native and the transformers path (the port's: tests/onboard/workspace/test_lora_port.py): with
    B zero the loaded model's logits bit for bit; parity: peft on LlamaForCausalLM, given this model's
    adapter weights under their HF names."""
    def built(out, *extra):
        cfg = tiny_cfg(ckpt, tmp_path / out, f"--model.family={family}", *extra)
        cfg.model.overrides = {}
        return Trainer(cfg, quiet=True)

    plain = built("plain", "--parallelism.data_parallel=none")
    trainer = built("run", *LORA, "--lora.target_modules=q_proj,k_proj,o_proj,gate_proj,up_proj")
    cfg = trainer.cfg
    with torch.no_grad():
        assert torch.equal(trainer.model(sample_tokens(512)), plain.model(sample_tokens(512)))
    _randomise_b(trainer.model)
    sd = peft.get_peft_model_state_dict(trainer.model)
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    targets = sorted(trainer.lora.names.targets.values())
    config = peft.LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, target_modules=targets)
    upstream = peft.get_peft_model(hf, config)
    result = peft.set_peft_model_state_dict(upstream, {hf_key(k, trainer.lora): v for k, v in sd.items()})
    assert not result.unexpected_keys and not [k for k in result.missing_keys if "lora_" in k]
    tokens = sample_tokens(512)
    with torch.no_grad():
        want, got = trainer.model(tokens), upstream(tokens).logits
    assert rel_l2(got, want) <= EXPORT_REL
    with torch.no_grad():
        upstream.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight.mul_(2)
        assert rel_l2(upstream(tokens).logits, want) > 1e-4  # the comparison can fail


def test_transformers_path_exports_an_adapter_peft_loads(tmp_path, ckpt):
    """titan_core running transformers' own class: its module names are the HF ones, the same glue applies."""
    out = tmp_path / "adapter"
    cfg = tiny_cfg(ckpt, tmp_path / "run", *LORA, "--model.family=transformers", f"--checkpoint.export_hf={out}")
    cfg.model.overrides = {}
    trainer = Trainer(cfg, quiet=True)
    trainer.train()
    assert trainer.lora.names.targets["model.layers.1.mlp.down_proj"] == "model.layers.1.mlp.down_proj"
    tokens = sample_tokens(512)
    with torch.no_grad():
        want = trainer.model(tokens)
    assert rel_l2(_peft_logits(ckpt, out, tokens), want) <= EXPORT_REL


def test_merged_export_reloads_in_transformers(tmp_path, ckpt):
    out = tmp_path / "merged"
    cfg = tiny_cfg(ckpt, tmp_path / "run", *LORA, "--lora.merged_export", f"--checkpoint.export_hf={out}")
    trainer = Trainer(cfg, quiet=True)
    trainer.train()
    tokens = sample_tokens(512)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        want, got = trainer.model(tokens), reloaded(tokens).logits
        base = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)(tokens).logits
    assert rel_l2(got, want) <= EXPORT_REL
    assert rel_l2(base, want) > 1e-5  # the step moved the model away from the base


def test_resume_continues_the_same_curve(tmp_path):
    """The DCP checkpoint holds the frozen base, the adapters and their AdamW state: 2 steps, then a
    resumed third, give the 3-step run's losses."""
    whole = Trainer(lora_cfg(tmp_path / "a", steps=3), quiet=True).train()
    ck = ["--checkpoint.enable", "--checkpoint.interval=1"]
    Trainer(lora_cfg(tmp_path / "b", *ck, steps=2), quiet=True).train()
    resumed = Trainer(lora_cfg(tmp_path / "b", *ck, steps=3), quiet=True)
    assert resumed.resumed_from == 2
    last = resumed.train().metrics[-1]
    assert last["step"] == 3 and last["loss"] == whole.metrics[-1]["loss"]
    assert whole.metrics[-1]["loss"] != whole.metrics[0]["loss"]


def test_a_checkpoint_holds_what_trains_and_names_the_base_it_leaves_out(tmp_path, ckpt):
    """On a checkpoint.initial_hf base a checkpoint leaves the frozen base out (it is on disk already, and
    loaded from there on a resume: tests/core/dist/test_lora_two_ranks.py resumes after kill -9 bit for bit);
    a resume onto another base is refused, naming both."""
    import torch.distributed.checkpoint as dcp

    from titan_core.training.checkpoint import FROZEN

    flags = [*LORA, "--lora.modules_to_save=lm_head", "--checkpoint.enable", "--checkpoint.interval=1"]
    Trainer(tiny_cfg(ckpt, tmp_path / "run", *flags), quiet=True).train()
    saved = dcp.FileSystemReader(tmp_path / "run" / "checkpoints" / "step-1").read_metadata().state_dict_metadata
    weights = [k for k in saved if k.startswith("model.")]
    assert weights and all(".lora_" in k or ".modules_to_save." in k for k in weights), weights
    assert any(".lora_B." in k for k in weights) and FROZEN in saved
    other = write_tiny_llama(tmp_path / "other", seed=1)
    said = refusal(lambda: Trainer(tiny_cfg(other, tmp_path / "run", *flags, steps=2), quiet=True))
    assert f"trained on the frozen base {ckpt.resolve()}" in said and f"this run's base is {other.resolve()}" in said


def test_simple_fsdp_on_one_process_is_eager_bit_for_bit(tmp_path):
    """SimpleFSDP at world size 1 keeps plain parameters (parallel/simple_fsdp.py), adapters included:
    the same curve as data_parallel = "none" to the bit (2 ranks: tests/core/dist/test_lora_two_ranks.py)."""
    eager = Trainer(lora_cfg(tmp_path / "a", steps=2), quiet=True).train().metrics
    fsdp = Trainer(lora_cfg(tmp_path / "b", "--parallelism.data_parallel=simple_fsdp", steps=2), quiet=True)
    assert fsdp.lora is not None and fsdp.world_size == 1
    got = fsdp.train().metrics
    assert [r["loss"] for r in got] == [r["loss"] for r in eager]
    assert [r["grad_norm"] for r in got] == [r["grad_norm"] for r in eager]


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpoint_wraps_the_blocks_around_peft_layers_bit_for_bit(tmp_path, mode):
    """[activation_checkpoint] goes by the blocks' paths, which peft's wrappers (deeper down) leave as they
    were: the adapters' activations are recomputed with the rest, the curve eager's to the bit."""
    eager = Trainer(lora_cfg(tmp_path / "a", steps=2), quiet=True).train().metrics
    ac = Trainer(lora_cfg(tmp_path / "b", f"--activation_checkpoint.mode={mode}", steps=2), quiet=True)
    assert ac.checkpointed == ["layers.0", "layers.1"], ac.checkpointed
    got = ac.train().metrics
    assert [(r["loss"], r["grad_norm"]) for r in got] == [(r["loss"], r["grad_norm"]) for r in eager]


# ---- bad input: one line each ---------------------------------------------------------------------
@pytest.mark.parametrize("mode,flags", [
    ("compile", ["--compile.enable", "--compile.backend=aot_eager", "--compile.fullgraph"]),
    ("graph_trainer", ["--graph_trainer.enable"]),
])  # fmt: skip
def test_compiled_modes_train_the_adapters_as_eager_does(tmp_path, mode, flags):
    """peft's LoRA layers inside compiled blocks (dynamo and AOT autograd trace them whole: fullgraph) and
    inside the Graph Trainer's one captured step (frozen base: no gradient, no AdamW update in the graph):
    eager's curve within the compile gate's fp32 1e-5, the Graph Trainer's bit for bit (its fp32 bound, 0),
    and the base weights as loaded. (inductor, measured once by hand: step losses within 5e-7 of eager's.)"""
    eager = Trainer(lora_cfg(tmp_path / "a", steps=3), quiet=True)
    want = eager.train().metrics
    trainer = Trainer(lora_cfg(tmp_path / "b", *flags, steps=3), quiet=True)
    base = {n: t.clone() for n, t in base_state_dict(trainer.model).items()}
    got = trainer.train().metrics
    if mode == "compile":
        curve = [torch.tensor([r["loss"] for r in rows]) for rows in (got, want)]
        assert trainer.compiled_modules and rel_l2(*curve) <= 1e-5
    else:
        assert trainer.graph_step is not None
        assert [(r["loss"], r["grad_norm"]) for r in got] == [(r["loss"], r["grad_norm"]) for r in want]
        trained = dict(trainer.model.named_parameters())
        assert all(torch.equal(p, trained[n]) for n, p in eager.model.named_parameters())
    after = base_state_dict(trainer.model)
    assert all(torch.equal(after[n], t) for n, t in base.items())  # the frozen base never moved
    assert any(p.any() for n, p in trainer.model.named_parameters() if "lora_B" in n)  # the adapters did


def test_float8_base_layers_under_the_adapters_train_within_the_float8_bound(tmp_path):
    """kernels.float8 swaps the block linears for torchao's float8 training linears, which peft then wraps as
    any nn.Linear: the frozen base computes in float8 (emulated on CPU), the adapters in the recipe's dtype.
    Held to float8's own bound against the same LoRA run in bf16 (titan_core/kernels/float8.py, 10 steps of
    one repeated batch), the base unmoved."""
    from titan_core.kernels.float8 import FLOAT8_LOSS_REL

    def losses(float8):
        flags = ["--training.dtype=bfloat16", "--data.repeat_batch=true", f"--kernels.float8={float8}",
                 "--optimizer.lr=1e-2", "--lora.target_modules=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"]
        trainer = Trainer(lora_cfg(tmp_path / float8, *flags, steps=10), quiet=True)
        base = {n: t.clone() for n, t in base_state_dict(trainer.model).items()}
        rows = trainer.train().metrics
        assert all(torch.equal(t, base[n]) for n, t in base_state_dict(trainer.model).items())
        return trainer, [r["loss"] for r in rows]

    bf16, want = losses("none")
    float8, got = losses("tensorwise")
    assert len(float8.swaps) == 14 and set(float8.swaps.values()) == {"float8.tensorwise"}
    wrapped = float8.model.layers["0"].attention.wq
    assert type(wrapped.base_layer).__name__ == "Float8TrainingLinear" and "lora" in type(wrapped).__module__
    assert got[-1] < got[0] - 0.5 and want[-1] < want[0] - 0.5  # both learn the repeated batch
    assert abs(got[-1] - want[-1]) / want[-1] <= FLOAT8_LOSS_REL, (got, want)
