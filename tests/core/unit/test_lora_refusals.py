"""[lora]'s bad input, one line each (ConfigError: exit 2 at the entry point): out-of-range values, names
that select nothing or what the adapter cannot name or converts, layers peft cannot adapt, the head the loss
reads by weight, a module reached by another path, an export onto another base, a merge of a tied embedding,
and what lora does not compose with, refused before any rank starts (tp's own refusals among them)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from hf_tiny import tiny_cfg, write_tiny_llama
from lora_cases import LORA, TINY, built, lora_cfg, refusal
from tiny_flags import tiny_run_flags
from titan_core.config import load_config
from titan_core.lora.export import export_peft
from titan_core.lora.inject import apply_lora, check_lora, merged_copy
from titan_core.models.model_builder import model_adapter
from titan_core.training.trainer import Trainer

peft = pytest.importorskip("peft")
pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.mark.parametrize("key,value", [("rank", "0"), ("alpha", "0"), ("dropout", "1.0")])
def test_out_of_range_values_name_their_key(key, value):
    assert f"lora.{key}" in refusal(lambda: load_config(None, [f"--lora.{key}={value}"]))


def test_a_target_that_matches_nothing_lists_the_names(tmp_path):
    cfg, model = built(tmp_path, "--lora.target_modules=q_proj,qkv_proj")
    text = refusal(lambda: apply_lora(model, cfg.lora, model_adapter(cfg.model)))
    assert "'qkv_proj' matches no module" in text and "q_proj" in text and "down_proj" in text
    assert not any(isinstance(m, peft.tuners.tuners_utils.BaseTunerLayer) for m in model.modules())


def test_a_model_the_adapter_cannot_name_is_refused(tmp_path):
    cfg, model = built(tmp_path)

    class Nameless:
        def to_hf(self, sd):
            raise ValueError("no HF name for native key 'layers.0.attention.wq.weight'")

    assert "cannot name its layers" in refusal(lambda: apply_lora(model, cfg.lora, Nameless()))


def test_a_target_whose_weight_the_adapter_converts_is_refused(tmp_path):
    cfg, model = built(tmp_path)
    real = model_adapter(cfg.model)

    class Transposing:  # a family that stores q_proj transposed: no Linear here is q_proj as it stands
        def to_hf(self, sd):
            return {k: (v.t() if "q_proj" in k else v) for k, v in real.to_hf(sd).items()}

    assert "converts" in refusal(lambda: apply_lora(model, cfg.lora, Transposing()))


@pytest.mark.parametrize("targets,said", [
    ("input_layernorm", "matches model.layers.0.input_layernorm, a RMSNorm: peft adapts Linear and Embedding"),
    ("self_attn", "'self_attn' matches no module"),  # a container: peft's rule matches whole names or suffixes
])  # fmt: skip
def test_a_target_that_is_no_layer_peft_adapts_is_refused(tmp_path, targets, said):
    cfg, model = built(tmp_path, f"--lora.target_modules={targets}")
    assert said in refusal(lambda: apply_lora(model, cfg.lora, model_adapter(cfg.model)))


def test_lora_on_the_head_the_loss_reads_by_weight_is_refused(tmp_path):
    cfg, model = built(tmp_path, "--lora.target_modules=lm_head")
    assert "modules_to_save" in refusal(lambda: apply_lora(model, cfg.lora, model_adapter(cfg.model)))


def test_a_module_the_loss_reaches_by_another_path_is_refused(tmp_path, ckpt):
    """The transformers path's loss reads lm_head's weight through transformers' own reference to the
    original module, which peft's swap does not reach: a saved copy would train and change nothing."""
    cfg = tiny_cfg(ckpt, tmp_path / "run", *LORA, "--model.family=transformers", "--lora.modules_to_save=lm_head")
    cfg.model.overrides = {}
    assert "lm_head would train without changing the loss" in refusal(lambda: Trainer(cfg, quiet=True))


def test_an_export_onto_another_base_is_refused(tmp_path, ckpt):
    cfg = tiny_cfg(ckpt, tmp_path / "run", *LORA)
    trainer = Trainer(cfg, quiet=True)
    other = write_tiny_llama(tmp_path / "other", intermediate_size=256)
    text = refusal(lambda: export_peft(trainer.model, trainer.lora, model_adapter(cfg.model), tmp_path / "a",
                                        base=other))  # fmt: skip
    assert "another base" in text and "_proj.weight" in text
    same_shapes = write_tiny_llama(tmp_path / "same_shapes", seed=1)  # another draw of the same architecture
    text = refusal(lambda: export_peft(trainer.model, trainer.lora, model_adapter(cfg.model), tmp_path / "a",
                                        base=same_shapes))  # fmt: skip
    assert "another base" in text and "model.layers.0.self_attn.q_proj.weight differs" in text
    assert not (tmp_path / "a").exists()
    export_peft(trainer.model, trainer.lora, model_adapter(cfg.model), tmp_path / "a", base=ckpt)  # its own base: fine


def test_merging_an_adapter_on_a_tied_embedding_is_refused(tmp_path):
    """Unmerged, an adapter on the tied embedding changes the input only; merged, the head too."""
    tied = TINY.replace("}", ", tie_embeddings=true}")
    cfg, model = built(tmp_path, tied, "--lora.target_modules=embed_tokens,q_proj")
    state = apply_lora(model, cfg.lora, model_adapter(cfg.model))  # trains, and exports as PEFT, fine
    assert "ties it to its head" in refusal(lambda: merged_copy(state))
    cfg.lora.merged_export = True
    _, model = built(tmp_path, tied)
    assert "ties it to its head" in refusal(lambda: apply_lora(model, cfg.lora, model_adapter(cfg.model)))


@pytest.mark.parametrize("extra,said", [
    (["--checkpoint.export_hf=x"], "checkpoint.initial_hf"),
    (["--lora.target_modules="], "target_modules is empty"),
    (["--parallelism.data_parallel=fsdp2", "--lora.modules_to_save=lm_head"], "never be gathered"),
    (["--graph_trainer.enable", "--graph_trainer.scan_layers"], "lora freezes the base"),
])  # fmt: skip
def test_runs_lora_cannot_do_yet_are_refused_before_building(tmp_path, extra, said):
    assert said in refusal(lambda: Trainer(lora_cfg(tmp_path, *extra), quiet=True))


@pytest.mark.parametrize("extra,said", [
    (["--parallelism.tp=2", "--lora.dropout=0.1"], "lora.dropout = 0.1 under parallelism.tp = 2"),
    (["--parallelism.pp=2", "--training.grad_accum=2"], "not parallelism.pp = 2"),
    (["--parallelism.cp=2"], "not parallelism.cp = 2"),
])  # fmt: skip
def test_what_lora_does_not_compose_with_is_refused_before_any_rank_starts(tmp_path, capsys, extra, said):
    """SimpleFSDP, FSDP2 and tp compose (tests/core/dist/test_lora_two_ranks.py, test_lora_tp.py); the rest is
    refused by the launcher."""
    from titan_core.launcher import launch

    argv = [TINY, *tiny_run_flags(tmp_path, steps=1, batch_size=2), "--lora.enable", *extra]
    assert launch(argv, 2) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "logs").exists()


def test_fsdp2_refuses_an_adapter_on_an_embedding_it_could_not_gather(tmp_path):
    """peft's embedding adapters are parameters read in the forward, not modules called: FSDP2 has no
    forward to gather them on. One process in a process group of one, FSDP2's whole path."""
    cfg = lora_cfg(tmp_path, "--parallelism.data_parallel=fsdp2", "--lora.target_modules=embed_tokens,q_proj")
    said = refusal(lambda: Trainer(cfg, quiet=True))
    assert "cannot shard the adapter of embedding tok_embeddings" in said and "simple_fsdp" in said, said
def test_tp_passes_the_check_and_only_dropout_under_it_is_refused(tmp_path):
    tp = ["--parallelism.data_parallel=simple_fsdp", "--parallelism.tp=2", "--parallelism.sequence_parallel"]
    check_lora(lora_cfg(tmp_path, *tp), world_size=2)
    assert "draw its own mask" in refusal(lambda: check_lora(lora_cfg(tmp_path, *tp, "--lora.dropout=0.05"), 2))


def test_an_adapter_on_the_vocabulary_split_embedding_is_refused_under_tp(tmp_path):
    """TP splits the embedding by vocabulary rows, which no adapter split follows (lora/tensor_parallel.py);
    the block Linears of the same run are split (a tp mesh of one rank: the split's bookkeeping, not its sums)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from titan_core.lora.tensor_parallel import adapter_split
    from titan_core.parallel.tensor_parallel import apply_tensor_parallel
    from titan_core.runtime import distributed

    with distributed.process_group(torch.device("cpu"), timeout_s=60):
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp_shard", "tp"))
        for targets, refused in (("q_proj,down_proj", False), ("q_proj,embed_tokens", True)):
            cfg, model = built(tmp_path, f"--lora.target_modules={targets}")
            apply_tensor_parallel(model, "llama3", mesh["tp"])
            split = adapter_split(cfg, mesh)
            if refused:
                said = refusal(lambda: apply_lora(model, cfg.lora, model_adapter(cfg.model), split=split))
                assert "model.embed_tokens is split over parallelism.tp otherwise" in said
                continue
            apply_lora(model, cfg.lora, model_adapter(cfg.model), split=split)
            adapters = {n: p for n, p in model.named_parameters() if ".lora_" in n}
            assert adapters and all(isinstance(p, DTensor) for p in adapters.values())
            assert adapters["layers.0.attention.wq.lora_B.default.weight"].placements == (Shard(0),)
            assert adapters["layers.0.feed_forward.w2.lora_A.default.weight"].placements == (Shard(1),)
            assert adapters["layers.0.attention.wq.lora_A.default.weight"].placements == (Replicate(),)
            assert adapters["layers.0.feed_forward.w2.lora_B.default.weight"].placements == (Replicate(),)


def test_the_entry_point_says_a_refusal_in_one_line_and_exits_2(tmp_path, capsys):
    from titan_core.train import main

    argv = [TINY, *tiny_run_flags(tmp_path, steps=1, batch_size=2), *LORA, "--lora.target_modules=q_prj"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'q_prj' matches no module" in err and "q_proj" in err
    assert main([*argv[:-1], "--lora.rank=0"]) == 2
    assert "lora.rank = 0 is out of range" in capsys.readouterr().err
