"""`onboard plan`: the full model on a target, every per-device number derivable by hand from
the parameter counts, the decisions (sharding, memory policy, offload, scan) taken from those
numbers, and the recipe and torchrun line it writes.

Llama-3.1-70B on h100:64 and Qwen3-235B-A22B on v7x:64, built on meta (nothing allocated).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import replace

import pytest
from torch.distributed.run import get_args_parser
from typer.testing import CliRunner

from onboard.cli.app import app
from real_size_configs import PUBLISHED
from titan_core.memory.activations import layer_bytes_per_token
from titan_core.config import ConfigError, load_config
from titan_core.memory.estimate import ModelShape, TrainSetup, estimate_memory
from titan_core.models.common.param_counts import count_params
from titan_core.models.common.stats import flops_per_token
from titan_core.models.registry import build_meta, get_family
from onboard.sizing.plan import GIB, HEADROOM, Target, parse_target, plan_training

KERNELS = TrainSetup(batch_size=1, seq_len=1)  # the recipe's kernels: plain loss, sdpa, loop experts


def model(family: str, flavor: str):
    args = get_family(family).flavors[flavor]
    meta = build_meta(family, args)
    return args, ModelShape.from_model(meta, args), count_params(meta)


def plan_of(family, flavor, target, *, seq=4096, tp_plan=True):
    args, shape, counts = model(family, flavor)
    target = parse_target(target) if isinstance(target, str) else target
    plan = plan_training(
        shape, counts, lambda s: flops_per_token(args, s), target, seq_len=seq, kernels=KERNELS, tp_plan=tp_plan
    )
    return args, shape, plan


def option(plan, sharding: str, policy: str):
    return next(o for o in plan.options if o.sharding.name == sharding and o.policy == policy)


def test_targets_from_the_tables():
    t = parse_target("v7x:64")
    assert (t.device_type, t.memory_bytes, t.peak_flops, t.per_host) == ("tpu", 192 * GIB, 2307e12, 4)
    assert t.budget == int(192 * GIB * HEADROOM) and t.name == "v7x-64"
    h = parse_target("H100:64")
    assert (h.device_type, h.memory_bytes, h.peak_flops, h.per_host) == ("cuda", 80 * GIB, 989e12, 8)
    assert parse_target("mi300x").count == 1 and parse_target("mi300x").peak_flops == 1307.4e12
    for bad, needle in (
        ("tpu9:8", "KIND must be one of"),
        ("v7x:0", "COUNT must be a positive"),
        ("v7x:6", "4 per host"),
        ("h100:x", "COUNT"),
    ):
        with pytest.raises(ConfigError, match=needle):
            parse_target(bad)


def test_llama3_70b_on_h100_64_by_hand():
    args, shape, plan = plan_of("llama3", "70B", "h100:64")
    P = 70_553_706_496
    assert shape.params == plan.params_total == P
    # FSDP over 64: fp32 parameters, gradients and AdamW's two moments, each sharded 64 ways
    fsdp = option(plan, "FSDP 64", "none").estimate
    assert fsdp.params == math.ceil(P / 64) * 4 == fsdp.grads and fsdp.optimizer_state == 2 * fsdp.params
    assert fsdp.gathered_params == 2 * shape.largest_block_params * 2  # FSDP2: this block and the next, bf16
    # TP 8 x FSDP 8: the blocks split 64 ways, the embedding and head (R) only over the 8 dp ranks
    R = 2 * 128256 * 8192 + 8192
    assert shape.outside_blocks == R
    tp = option(plan, "TP 8 x FSDP 8", "default").estimate
    assert tp.params == (math.ceil((P - R) / 64) + math.ceil(R / 8)) * 4
    assert tp.gathered_params == (math.ceil((P - R) / 8) + R) * 2  # SimpleFSDP keeps every gathered TP slice
    # activations per token per layer: what one eager layer saves in bf16; full recompute keeps the block input
    bf16 = replace(KERNELS, seq_len=4096, compute_dtype="bfloat16", device_type="cuda")
    assert plan.activations_per_token_layer["none"] == layer_bytes_per_token(
        replace(shape, n_heads=8, n_kv_heads=1, ffn_hidden_dim=28672 // 8), bf16, moe=False, rope=True, policy="none"
    )
    assert plan.activations_per_token_layer["full"] == 8192 * 2
    # nothing fits on 64-way FSDP at seq 4096: eager saves 140 GiB of activations, a captured step gathers 131 GiB
    assert not any(o.fits for o in plan.options if o.sharding.kind != "TP x FSDP")
    assert option(plan, "FSDP 64", "full").estimate.gathered_params == P * 2
    c = plan.chosen
    assert (c.sharding.name, c.policy, c.data_parallel, c.batch) == ("TP 8 x FSDP 8", "default", "simple_fsdp", 1)
    setup = replace(KERNELS, batch_size=2, seq_len=4096, compute_dtype="bfloat16", shard_degree=64, tp=8,
                    data_parallel="simple_fsdp", memory_policy="default", device_type="cuda",
                    materialise_sharded=True)  # fmt: skip
    assert estimate_memory(shape, setup).total > plan.target.budget  # batch 2 does not fit
    assert plan.offload[0] is False and plan.scan[0] is True  # 80 identical blocks, captured
    # the roofline: a TP group of 8 shares one 4096-token sequence's FLOPs
    step = plan.step
    assert step.model_flops == flops_per_token(args, 4096) * 4096 / 8
    assert step.step_time_s == pytest.approx(step.model_flops / (989e12 * 0.5))
    assert step.mfu == pytest.approx(0.5) and step.tokens_per_s == pytest.approx(4096 * 8 / step.step_time_s)


def test_qwen3_235b_on_v7x_64_plans_the_longest_sequence_that_fits():
    args, shape, plan = plan_of("qwen3_moe", "235B-A22B", "v7x:64", tp_plan=False)
    P, A = 235_093_634_560, 22_190_763_520
    assert (plan.params_total, plan.params_active) == (P, A)
    assert all(o.sharding.tp == 1 for o in plan.options)  # no TP plan for the MoE family
    # at 4096 tokens nothing fits: the smallest peak is FSDP2's eager step
    asked = min(plan.asked_options, key=lambda o: o.estimate.total)
    assert (asked.sharding.name, asked.policy) == ("FSDP 64", "none") and asked.estimate.total > plan.target.budget
    assert plan.seq_len == 2048 and any("nothing fits at seq 4096" in n for n in plan.notes)
    c = plan.chosen
    assert (c.sharding.name, c.policy, c.data_parallel, c.batch) == ("FSDP 64", "none", "fsdp2", 1)
    assert c.estimate.params == math.ceil(P / 64) * 4 and c.estimate.optimizer_state == 2 * c.estimate.params
    # the captured options all carry SimpleFSDP's gathered bf16 copy of every weight
    assert all(o.estimate.gathered_params == P * 2 for o in plan.options if o.policy != "none")
    assert any("gathered bf16 copies" in n for n in plan.notes)
    assert plan.offload == (False, "an on-device option fits (FSDP 64, memory policy none)")
    assert plan.scan[0] is False
    assert plan.step.model_flops == flops_per_token(args, 2048) * 2048


def test_offload_is_needed_when_only_offload_fits():
    _, _, plan = plan_of("llama3", "70B", "h100:64")
    # batch 1 of each TP policy (the FSDP and HSDP options need far more: their gathered copies)
    one = {o.policy: estimate_memory(*_shape_setup(plan, o)).total for o in plan.options if o.sharding.tp > 1}
    on_device = min(v for k, v in one.items() if k != "offload")
    assert one["offload"] < on_device
    memory = int((one["offload"] + on_device) / 2 / HEADROOM)  # between batch-1 offload and every on-device batch 1
    target = Target("h100", 64, "cuda", memory, "set by the test", 989e12, 8)
    _, _, plan = plan_of("llama3", "70B", target)
    assert plan.chosen.policy == "offload" and plan.offload[0] is True and plan.scan[0] is True
    assert plan.chosen.estimate.activations_host > plan.chosen.estimate.activations


def _shape_setup(plan, opt):
    _, shape, _ = model("llama3", "70B")
    setup = replace(KERNELS, batch_size=1, seq_len=plan.seq_len, compute_dtype="bfloat16", shard_degree=64, tp=8,
                    data_parallel="simple_fsdp", memory_policy=opt.policy, device_type="cuda",
                    materialise_sharded=True)  # fmt: skip
    return shape, setup


runner = CliRunner()


def test_onboard_plan_writes_the_target_recipe_and_torchrun(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED["Llama-3.1-70B"][2]))
    made = runner.invoke(app, ["new-model", "l70", "--hf-config", str(tmp_path / "config.json"), "--dir",
                               str(tmp_path), "--device", "cpu", "--twin"])  # fmt: skip
    assert made.exit_code == 0, made.stderr
    root = tmp_path / "onboarding" / "l70"
    bad = runner.invoke(app, ["plan", "l70", "--dir", str(tmp_path), "--target", "h100:12"])
    lines = bad.stderr.strip().splitlines()
    assert bad.exit_code == 2 and len(lines) == 1 and "multiple of it" in lines[0], bad.stderr
    assert not list(root.glob("recipe.*-*.toml"))
    result = runner.invoke(app, ["plan", "l70", "--dir", str(tmp_path), "--target", "h100:64", "--json"])
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["chosen"]["sharding"] == "TP 8 x FSDP 8" and out["runs_on_twin"] is True
    assert out["recipe"] == str(root / "recipe.h100-64.seq4096.toml")
    cfg = load_config(root / "recipe.h100-64.seq4096.toml")
    assert cfg.model.hf_config == str(root / "config.json")  # the full model, not the twin the gates ran
    p = cfg.parallelism
    assert (p.data_parallel, p.dp_shard, p.dp_replicate, p.tp) == ("simple_fsdp", 8, 1, 8)
    assert (cfg.graph_trainer.enable, cfg.graph_trainer.memory_policy, cfg.graph_trainer.scan_layers) == (
        True,
        "default",
        True,
    )
    # the recipe's plain loss (kept by a CPU timing at the twin's vocabulary) is planned as fused_ce: without
    # [tokens, 128256] fp32 logits a second sequence fits (test_llama3_70b_on_h100_64_by_hand: not with plain)
    assert (cfg.training.batch_size, cfg.training.seq_len, cfg.device.type) == (2, 4096, "cuda")
    levers = {lv["key"]: lv["plan"] for lv in out["levers"]}
    assert cfg.kernels.loss == levers["kernels.loss"] == "fused_ce"
    assert (cfg.training.dtype, cfg.training.mixed_precision_param) == ("float32", "bfloat16")
    assert load_config(root / "recipe.toml").model.hf_config.endswith("twin.json")  # recipe.toml untouched
    cd, _, line = out["torchrun"].partition(" && ")
    argv = shlex.split(line)
    args = get_args_parser().parse_args(argv[1:])
    assert (args.nnodes, args.nproc_per_node) == ("8", "8") and argv[-1] == "recipe.h100-64.seq4096.toml"
    text = runner.invoke(app, ["plan", "l70", "--dir", str(tmp_path), "--target", "h100:64"])
    assert text.exit_code == 0 and "PREDICTED step time" in text.stdout and "TP 8 x FSDP 8" in text.stdout
