"""No second process needed: mesh arithmetic, bad input (exit 2 before anything starts),
and SimpleFSDP at world size 1 being bit-identical to plain eager."""

from __future__ import annotations

import json
import math
import tomllib

import pytest
import torch
from _cases import tiny_cfg
from torch.distributed.tensor import DTensor

from titan_core.config import ConfigError, JobConfig, from_dict, load_config, to_toml
from titan_core.config.sections import Parallelism
from titan_core.launcher import check_nproc, cpu_count
from titan_core.parallel import check_parallelism, resolve_degrees
from titan_core.train import main, run
from titan_core.training.trainer import Trainer


def test_degrees_fill_and_modes():
    d = resolve_degrees(Parallelism(dp_replicate=2, dp_shard=-1, tp=1), 4)
    assert (d.dp_replicate, d.dp_shard, d.tp, d.mode, d.dim_names) == (
        2,
        2,
        1,
        "hybrid_shard",
        ("dp_replicate", "dp_shard"),
    )
    d = resolve_degrees(Parallelism(dp_shard=-1, tp=2), 4)
    assert (d.dp, d.tp, d.mode, d.dim_names) == (2, 2, "fully_shard", ("dp_shard", "tp"))
    d = resolve_degrees(Parallelism(dp_replicate=-1, dp_shard=1), 2)
    assert (d.dp_replicate, d.mode) == (2, "replicate")
    assert resolve_degrees(Parallelism(), 1).dim_names == ("dp_shard",)  # world size 1 still has a dp dimension


@pytest.mark.parametrize(
    "p, world, needle",
    [
        (Parallelism(dp_replicate=2), 3, "dp_replicate (2) x tp (1) = 2 does not divide the world size 3"),
        (
            Parallelism(dp_replicate=2, dp_shard=2),
            8,
            "dp_replicate (2) x dp_shard (2) x tp (1) = 4, but the world size is 8",
        ),
        (Parallelism(dp_shard=-1, tp=-1), 4, "only one parallel degree may be -1"),
        (Parallelism(tp=0), 2, "parallelism.tp must be >= 1 or -1"),
    ],
)
def test_bad_degrees_say_the_arithmetic(p, world, needle):
    with pytest.raises(ConfigError) as e:
        resolve_degrees(p, world)
    assert needle in str(e.value)


def test_tp_needs_a_plan_and_simple_fsdp():
    cfg = JobConfig()
    cfg.model.family, cfg.parallelism.tp = "flux", 2
    with pytest.raises(ConfigError, match="tensor parallel has no plan for family 'flux'"):
        check_parallelism(cfg, 2)
    cfg.model.family, cfg.parallelism.data_parallel = "llama3", "fsdp2"
    with pytest.raises(ConfigError, match="composes with data_parallel = 'simple_fsdp' only, not 'fsdp2'"):
        check_parallelism(cfg, 2)
    cfg.parallelism.data_parallel, cfg.parallelism.tp = "none", 1
    with pytest.raises(ConfigError, match="WORLD_SIZE=2 but parallelism.data_parallel = 'none'"):
        check_parallelism(cfg, 2)
    cfg.parallelism.data_parallel, cfg.parallelism.sequence_parallel = "simple_fsdp", True
    with pytest.raises(ConfigError, match="sequence_parallel splits the sequence over TP ranks: it needs tp > 1"):
        check_parallelism(cfg, 2)
    cfg.parallelism.tp, cfg.training.seq_len = 2, 33
    with pytest.raises(ConfigError, match=r"tp \(2\) does not divide training.seq_len \(33\)"):
        check_parallelism(cfg, 2)


def test_tp_degree_must_divide_the_heads():
    from titan_core.models import build_meta, resolve_args
    from titan_core.parallel.tensor_parallel import apply_tensor_parallel

    class FourRanks:  # the check runs before any split, so a mesh of the right size is all it reads
        def size(self):
            return 4

    model = build_meta("llama3", resolve_args("llama3", "debugmodel", {"n_layers": 1, "n_heads": 4, "n_kv_heads": 2}))
    with pytest.raises(ConfigError, match=r"tp \(4\) does not divide the key/value heads of layers.0 \(2\)"):
        apply_tensor_parallel(model, "llama3", FourRanks())


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--nproc", "3", "--parallelism.dp_replicate=2"], "does not divide the world size 3"),
        (["--nproc", "2", "--model.family=flux", "--parallelism.tp=2"], "no plan for family 'flux'"),
        (["--nproc", "2", "--parallelism.data_parallel=none"], "WORLD_SIZE=2 but parallelism.data_parallel = 'none'"),
        (["--nproc", "0"], "--nproc must be >= 1"),
        (["--nproc", "two"], "--nproc expects a positive integer"),
        (
            ["--nproc", "3", "--data.repeat_batch=true", "--parallelism.tp=2"],
            "tp (2) = 2 does not divide the world size 3",
        ),
    ],
)
def test_launch_bad_input_exits_2_before_starting(argv, needle, tmp_path, capfd):
    code = main([*argv, "--device.type=cpu", f"--metrics.output_dir={tmp_path}"])
    err = capfd.readouterr().err
    assert code == 2
    assert needle in err and "Traceback" not in err
    assert not (tmp_path / "logs").exists()  # no process was started


def test_nproc_above_the_cores_warns(tmp_path, capfd):
    cores = cpu_count()
    assert check_nproc(cores, "cpu") == []
    (warning,) = check_nproc(cores + 1, "cpu")
    assert f"--nproc {cores + 1} exceeds the {cores} CPU core(s)" in warning
    # through the entry: the warning comes first; this run then stops on its degrees (nothing starts)
    code = main(["--nproc", str(cores + 1), f"--parallelism.tp={cores + 2}", "--device.type=cpu",
                 f"--metrics.output_dir={tmp_path}"])  # fmt: skip
    err = capfd.readouterr().err
    assert code == 2 and err.index("warning: --nproc") < err.index("error: parallelism")


@pytest.mark.parametrize("family", ["llama3", "glimmer", "qwen3_moe"])
def test_world_size_1_simple_fsdp_is_bit_identical_to_eager(tmp_path, family):
    """SimpleFSDP over one rank has nothing to gather or reduce: its parameters stay plain tensors (a
    DTensor would only add dispatch to every op) and the run equals eager's bit for bit."""
    eager = Trainer(tiny_cfg(family, tmp_path / "eager", "--parallelism.data_parallel=none"), quiet=True)
    sharded = Trainer(tiny_cfg(family, tmp_path / "sfsdp"), quiet=True)
    try:
        assert not any(isinstance(p, DTensor) for p in sharded.model.parameters())
        for _ in range(3):
            for t in (eager, sharded):
                t.step += 1
            a, b = eager.train_step(), sharded.train_step()
            assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"])
        params = dict(sharded.model.named_parameters())
        for name, p in eager.model.named_parameters():
            assert torch.equal(p, params[name]), name
    finally:
        sharded.close()


def test_world_size_1_mixed_precision_reads_every_stored_tensor_in_the_compute_dtype(tmp_path):
    """One process with bf16 params: fp32 stored, read in bf16; a traced step's functional stand-in in
    the parameter's slot (what the Graph Trainer's capture puts there) is read in bf16 too, so the
    captured step computes what eager does. The sharded init's StandIn alone is read as itself."""
    from titan_core.models.common.init_stand_in import StandIn, Slot

    t = Trainer(tiny_cfg("llama3", tmp_path, "--training.mixed_precision_param=bfloat16"), quiet=True)
    try:
        head = t.model.output
        assert head._parameters["weight"].dtype == torch.float32 and head.weight.dtype == torch.bfloat16
        stored = head._parameters["weight"]
        head._parameters["weight"] = stored.detach().clone()  # a plain tensor, as torch.func.functional_call puts
        assert head.weight.dtype == torch.bfloat16 and torch.equal(head.weight, stored.detach().bfloat16())
        stand_in = StandIn(Slot("output.weight", stored.shape, torch.float32, stored.device, None))
        head._parameters["weight"] = stand_in
        assert head.weight is stand_in
        head._parameters["weight"] = stored
    finally:
        t.close()


def test_repeat_batch_override_of_the_entry(tmp_path):
    """`--data.repeat_batch=true` trains on the first batch every step; the field is in the
    resolved recipe, so the recipe alone (what run_world hands its ranks) reproduces the run."""
    argv = ["--model.overrides={n_layers=1, dim=64, n_heads=4, n_kv_heads=2, ffn_hidden_dim=128, vocab_size=256}",
            "--training.steps=3", "--training.batch_size=2", "--training.seq_len=16", "--device.type=cpu",
            "--metrics.rich=false", "--parallelism.data_parallel=none"]  # fmt: skip
    assert main([*argv, "--data.repeat_batch=true", f"--metrics.output_dir={tmp_path / 'a'}"]) == 0
    cfg = load_config(None, [*argv, f"--metrics.output_dir={tmp_path / 'b'}"])
    cfg.data.repeat_batch = True
    assert from_dict(tomllib.loads(to_toml(cfg))).data.repeat_batch is True
    want = run(cfg, quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == [m["loss"] for m in want.metrics]


@pytest.mark.parametrize("mode", ["simple_fsdp", "fsdp2"])
def test_a_parameter_the_model_keeps_in_fp32_is_gathered_in_fp32_under_bf16_mixed_precision(tmp_path, mode, monkeypatch):
    """A model's `params_kept_fp32` (the transformers path names what transformers keeps fp32 in a
    bf16 model) reaches the sharding: that parameter computes in fp32, every other one in bf16."""
    from titan_core.models.common.layers import RMSNorm
    from titan_core.models.llama3.model import Llama3

    monkeypatch.setattr(Llama3, "params_kept_fp32", lambda self, dtype: frozenset({"norm.weight"}), raising=False)
    # a module written for an fp32 weight hands on its input's dtype (as transformers' fp32 routers do)
    plain = RMSNorm.forward
    monkeypatch.setattr(RMSNorm, "forward", lambda self, x: plain(self, x).to(x.dtype))
    cfg = tiny_cfg("llama3", tmp_path, f"--parallelism.data_parallel={mode}",
                   "--training.mixed_precision_param=bfloat16")  # fmt: skip
    trainer = Trainer(cfg, quiet=True)
    seen = {}
    try:
        for name in ("norm", "layers.0.attention_norm"):
            module = trainer.model.get_submodule(name)
            module.register_forward_pre_hook(lambda m, _a, name=name: seen.update({name: m.weight.dtype}))
        trainer.step += 1
        assert math.isfinite(trainer.train_step()["loss"])
    finally:
        trainer.close()
    assert seen == {"norm": torch.float32, "layers.0.attention_norm": torch.bfloat16}
