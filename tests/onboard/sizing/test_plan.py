"""`onboard plan`: the full model on a target, every per-device number derivable by hand from
the parameter counts, the decisions (layout, memory policy, offload, scan) taken from those
numbers, and the recipe and torchrun line it writes.

Llama-3.1-70B on h100:64 and Qwen3-235B-A22B on v7x:64, built on meta (nothing allocated). The
parallel degrees' own pieces (EP, CP, PP, vocab sharding, the fused loss, the step's collectives)
are tests/onboard/sizing/test_plan_parallel.py.
"""

from __future__ import annotations

import json
import re
import math
import shlex
from dataclasses import replace

import pytest
from torch.distributed.run import get_args_parser

from titan_core.runtime.argv import LAUNCH
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.sizing.plan.hardware import HARDWARE
from onboard.sizing.plan.planner import GIB, HEADROOM, Target, parse_target, plan_training
from onboard.sizing.plan.layout_memory import device_memory, stored_elements
from onboard.sizing.plan.search import TIE
from onboard.sizing.plan.step_time import COMPUTE_EFFICIENCY
from plan_models import accepting
from real_size_configs import PUBLISHED
from titan_core.memory.activations import layer_bytes_per_token
from titan_core.config import ConfigError, load_config
from titan_core.memory.estimate import ModelShape, TrainSetup
from titan_core.models.common.param_counts import count_params
from titan_core.models.common.stats import flops_per_token
from titan_core.models.registry import build_meta, get_family
from titan_core.runtime.devices import PEAK_BF16_FLOPS

KERNELS = TrainSetup(batch_size=1, seq_len=1)  # the recipe's kernels: plain loss, sdpa, loop experts


def model(family: str, flavor: str):
    args = get_family(family).flavors[flavor]
    meta = build_meta(family, args)
    return args, ModelShape.from_model(meta, args), count_params(meta)


def plan_of(family, flavor, target, *, seq=4096, tp_plan=True, kernels=KERNELS):
    """The plan as `onboard plan` makes it: only options titan_core accepts are chosen."""
    args, shape, counts = model(family, flavor)
    target = parse_target(target) if isinstance(target, str) else target
    plan = plan_training(
        shape, counts, lambda s: flops_per_token(args, s), target, seq_len=seq, kernels=kernels, tp_plan=tp_plan,
        accept=accepting(family, flavor, target, kernels),
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


def test_one_device_table_with_a_source_per_row():
    # the peaks are titan_core's own (the trainer's MFU uses them): one table, read, not copied
    for kind, hw in HARDWARE.items():
        key = f"tpu {kind}" if hw.device_type == "tpu" else kind
        assert hw.peak_bf16 == PEAK_BF16_FLOPS[key] == parse_target(kind).peak_flops
        assert hw.peak_fp8 >= hw.peak_bf16 and hw.hbm_bw > 0 and hw.scale_up_bw > hw.scale_out_bw > 0
        assert len(hw.source) > 40 and (kind.upper() in hw.source.upper() or "Ironwood" in hw.source)
    # published figures, halved to one direction: v7x ICI 1,200 GB/s bidirectional, H100 NVLink 900 GB/s
    assert HARDWARE["v7x"].scale_up_bw == 600e9 and HARDWARE["h100"].scale_up_bw == 450e9
    assert HARDWARE["h100"].scale_out_bw == 50e9 and HARDWARE["v7x"].peak_fp8 == 4614e12


def test_llama3_70b_on_h100_64_by_hand():
    args, shape, plan = plan_of("llama3", "70B", "h100:64")
    P = 70_553_706_496
    assert shape.params == plan.params_total == P
    R = 2 * 128256 * 8192 + 8192  # embedding, head, final norm
    assert shape.outside_blocks == R
    # FSDP over 64: fp32 parameters, gradients and AdamW's two moments, each sharded 64 ways
    fsdp = option(plan, "FSDP 64", "none").estimate
    assert fsdp.params == math.ceil(P / 64) * 4 == fsdp.grads and fsdp.optimizer_state == 2 * fsdp.params
    # FSDP2 gathers a block at a time: this block and the prefetched next, plus the root unit (embedding, head)
    assert fsdp.gathered_params == 2 * math.ceil(2 * (P - R) / 80 + R)
    # TP 8 x FSDP 8: everything split 64 ways, the embedding and head too (vocab-sharded over TP), but the final
    # norm, whole on every TP rank
    tp = option(plan, "TP 8 x FSDP 8", "default").estimate
    assert tp.params == math.ceil(((P - 8192) / 8 + 8192) / 8) * 4
    assert tp.gathered_params == math.ceil((P - 8192) / 8 + 8192) * 2  # SimpleFSDP keeps every gathered TP slice
    # activations per token per layer on the chosen TP widths: what one eager layer saves in bf16; full recompute
    # keeps the block input
    c = plan.chosen
    tp_ = c.layout.tp
    bf16 = replace(KERNELS, seq_len=4096, compute_dtype="bfloat16", device_type="cuda")
    assert plan.activations_per_token_layer["none"] == layer_bytes_per_token(
        replace(shape, n_heads=64 // tp_, n_kv_heads=max(1, 8 // tp_), ffn_hidden_dim=28672 // tp_), bf16, moe=False,
        rope=True, policy="none")  # fmt: skip
    assert plan.activations_per_token_layer["full"] == 8192 * 2
    # nothing fits on plain 64-way FSDP at seq 4096 without checkpointing: eager saves 140 GiB of activations, a
    # captured step gathers 131
    assert not any(o.fits for o in plan.options if o.sharding.name == "FSDP 64" and o.policy in ("none", "default"))
    assert option(plan, "FSDP 64", "full").estimate.gathered_params in (P * 2, fsdp.gathered_params)
    # the chosen option is the first of the ranking: the most predicted tokens/s, a tie going to headroom
    assert c is plan.ranked()[0] and all(c.tokens_per_s >= o.tokens_per_s * (1 - TIE) for o in plan.ranked())
    assert c.largest_batch >= c.batch >= 1 and c.estimate.total <= plan.target.budget
    assert device_memory(plan.shape, c.layout, c.setup, batch=c.largest_batch + 1).total > plan.target.budget
    assert plan.why_chosen.startswith(c.label) and "runner-up" in plan.why_chosen
    # the step: compute at the mode's efficiency, times the bubble, plus what each collective leaves exposed
    step = plan.step
    assert step.step_time_s == pytest.approx(step.compute_s * step.bubble + sum(cm.exposed_s for cm in step.comm))
    assert all(0 <= cm.exposed_s <= cm.seconds + 1e-12 for cm in step.comm)
    for cm in step.comm:  # titan_core has no async TP, no overlapped dispatch, a blocking K/V gather
        if cm.name.startswith(("TP", "EP", "CP")):
            assert cm.exposed_s == pytest.approx(cm.seconds)
    assert step.mfu == pytest.approx(step.model_flops / (step.step_time_s * 989e12)) and step.mfu < 0.39


def test_qwen3_235b_on_v7x_64_fits_the_asked_seq_and_says_why_its_ep():
    # the old plan cut this to seq 2048: every rank held every expert, SimpleFSDP's whole bf16 model gathered
    args, shape, plan = plan_of("qwen3_moe", "235B-A22B", "v7x:64", tp_plan=False)
    P, A = 235_093_634_560, 22_190_763_520
    assert (plan.params_total, plan.params_active) == (P, A)
    assert all(o.sharding.tp == 1 for o in plan.options)  # no TP plan for the MoE family
    assert plan.seq_len == plan.seq_len_asked == 4096 and plan.would_fit is None
    c = plan.chosen
    assert 128 % c.layout.ep == 0 and c.fits
    assert c.estimate.params == stored_elements(plan.shape, c.layout) * 4
    assert c.estimate.optimizer_state == 2 * c.estimate.params
    if c.layout.pp == 1:
        assert c.estimate.params == math.ceil(P / 64) * 4
    # without EP or checkpointing plain FSDP does not fit (two layers of every expert gathered, beside the eager
    # activations); ep and the experts' roofline are weighed, and the ep degree says against what
    assert not any(o.fits for o in plan.options if o.layout.name == "FSDP 64" and o.policy == "none")
    assert any(o.usable and o.layout.ep > 1 for o in plan.options)
    other = "ep 1" if c.layout.ep > 1 else "ep "
    assert plan.reasons["ep"].startswith(f"ep {c.layout.ep}") and f"the best with {other}" in plan.reasons["ep"]
    assert plan.step.model_flops == pytest.approx(flops_per_token(args, 4096) * c.batch * 4096 * c.microbatches
                                                  / (c.layout.cp * c.layout.pp))  # fmt: skip


def test_offload_is_chosen_only_when_nothing_on_the_device_runs():
    # at 128k tokens eager full checkpointing with CP holds less than the Graph Trainer's offload (which keeps
    # SimpleFSDP's gathered weights and the functional update's copies): offload is the last resort
    fused, seq = replace(KERNELS, loss="fused_ce"), 131072
    _, _, plan = plan_of("llama3", "70B", "h100:64", seq=seq, kernels=fused)
    assert plan.chosen is not None and plan.chosen.policy != "offload" and plan.offload[0] is False
    offload = [o for o in plan.options if o.policy == "offload" and o.fits]
    assert offload and all(o.estimate.activations_host > 0 for o in offload)
    # when titan_core ran nothing on the device, the offloading step is chosen, and the plan says it is needed
    base = accepting("llama3", "70B", plan.target, fused)

    def only_offload(o):
        return base(o) if o.policy == "offload" else "a stand-in refusal of every on-device option"

    args, shape, counts = model("llama3", "70B")
    forced = plan_training(shape, counts, lambda s: flops_per_token(args, s), plan.target, seq_len=seq, kernels=fused,
                           tp_plan=True, accept=only_offload)  # fmt: skip
    assert forced.chosen.policy == "offload" and forced.offload[0] is True and forced.chosen.captured
    assert forced.chosen.estimate.activations_host > forced.chosen.estimate.activations


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
    unknown = runner.invoke(app, ["plan", "l70", "--dir", str(tmp_path), "--target", "z100:8"])
    assert unknown.exit_code == 2 and "KIND must be one of" in unknown.stderr
    # a target the plan cannot meet: exit 1, one line naming what would fit, nothing written
    short = runner.invoke(app, ["plan", "l70", "--dir", str(tmp_path), "--target", "h100:3"])
    lines = short.stderr.strip().splitlines()
    assert short.exit_code == 1 and lines[-1].startswith("error: nothing fits --seq 4096 on 3 x h100"), short.stderr
    assert re.search(r"--target h100:\d+ fits --seq 4096 \(", lines[-1])
    long = runner.invoke(app, ["plan", "l70", "--dir", str(tmp_path), "--target", "h100:64", "--seq", "1048576"])
    assert long.exit_code == 1 and "fits --seq 1048576 on 64 x h100" in long.stderr
    assert re.search(r"--seq \d+ fits here \(", long.stderr), long.stderr
    assert not list(root.glob("recipe.*-*.toml"))
    result = runner.invoke(app, ["plan", "l70", "--dir", str(tmp_path), "--target", "h100:64", "--json"])
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    c, d = out["chosen"], out["degrees"]
    assert out["runs_on_twin"] is True and out["why_chosen"].startswith(c["sharding"])
    assert out["recipe"] == str(root / "recipe.h100-64.seq4096.toml")
    cfg = load_config(root / "recipe.h100-64.seq4096.toml")
    assert cfg.model.hf_config == str(root / "config.json")  # the full model, not the twin the gates ran
    p = cfg.parallelism
    assert (p.dp_shard, p.dp_replicate, p.tp, p.ep, p.cp, p.pp) == tuple(
        d[k] for k in ("dp_shard", "dp_replicate", "tp", "ep", "cp", "pp"))  # fmt: skip
    assert cfg.training.grad_accum == c["grad_accum"]
    assert set(out["degrees_why"]) == {"tp", "ep", "cp", "pp", "dp_replicate"}
    # the mode and memory policy written are the chosen option's: the Graph Trainer's policy, or checkpointing
    captured = c["mode"] in ("graph_trainer", "scan")
    assert (cfg.graph_trainer.enable, cfg.compile.enable) == (captured, c["mode"] == "compile")
    if captured:
        assert cfg.graph_trainer.memory_policy == c["policy"] and cfg.graph_trainer.scan_layers == (c["mode"] == "scan")
        assert cfg.activation_checkpoint.mode == "none"
    else:
        ac = {"none": "none", "default": "selective", "full": "full"}[c["policy"]]
        assert cfg.activation_checkpoint.mode == ac and c["activation_checkpoint"] in ("none", "selective op", "full")
    # the recipe's plain loss (kept by a CPU timing at the twin's vocabulary) is planned as fused_ce
    assert (cfg.training.batch_size, cfg.training.seq_len, cfg.device.type) == (c["batch"], 4096, "cuda")
    levers = {lv["key"]: lv["plan"] for lv in out["levers"]}
    assert cfg.kernels.loss == levers["kernels.loss"] == "fused_ce"
    assert (cfg.training.dtype, cfg.training.mixed_precision_param) == ("float32", "bfloat16")
    assert load_config(root / "recipe.toml").model.hf_config.endswith("twin.json")  # recipe.toml untouched
    cd, _, line = out["torchrun"].partition(" && ")
    argv = shlex.split(line)
    assert tuple(argv[:3]) == LAUNCH
    args = get_args_parser().parse_args(argv[3:])
    assert (args.nnodes, args.nproc_per_node) == ("8", "8") and argv[-1] == "recipe.h100-64.seq4096.toml"
    text = runner.invoke(app, ["plan", "l70", "--dir", str(tmp_path), "--target", "h100:64"])
    assert text.exit_code == 0 and "PREDICTED step time" in text.stdout and f"chosen: {c['sharding']}" in text.stdout
    assert "  why: " in text.stdout and "exposed (" in text.stdout
