"""`onboard plan` with expert, context and pipeline parallelism: the memory model's pieces, the step's
collectives, and the two big published configs planned at the sequence asked for.

Every model is built on meta (nothing allocated). The memory pieces are checked against numbers
derivable by hand from the parameter counts: FSDP2's per-block gather against SimpleFSDP's whole
gathered model, experts divided by ep, the embedding and head vocab-sharded under TP, the fused loss
head's one chunk against [tokens, vocab] logits, CP halving activations, PP's stage and its in-flight
microbatches. Qwen3-235B-A22B and Llama-3.1-70B (tests/real_size_configs.py, the published config.json)
get plans that fit at seq 4096 on v7x:1024, the MoE with ep > 1, and recipes titan_core's loader reads and
its check_parallelism accepts;
where nothing fits, `onboard plan` exits 1 with one line and writes nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.sizing.plan import layout_memory as plan_memory
from onboard.sizing.plan.hardware import HARDWARE
from onboard.sizing.plan.planner import GIB, Target, parse_target, plan_training
from onboard.sizing.plan.workspace import plan_lines
from onboard.sizing.plan.layout_memory import (
    Layout,
    MemSetup,
    device_memory,
    in_flight,
    loss_head_bytes,
    stored_elements,
)
from onboard.sizing.plan.step_time import (
    COMPUTE_EFFICIENCY,
    Efficiency,
    StepInputs,
    communication,
    expert_slowdown,
    predict_step,
    torus_hops,
)
from plan_models import accepting
from real_size_configs import PUBLISHED
from titan_core.config import load_config
from titan_core.parallel import check_parallelism
from titan_core.memory.estimate import ModelShape, TrainSetup
from titan_core.models.common.param_counts import count_params
from titan_core.models.common.stats import flops_per_token
from titan_core.models.registry import build_meta, get_family

L70_P, L70_R = 70_553_706_496, 2 * 128256 * 8192 + 8192
Q235_EXPERTS = 94 * 128 * 3 * 4096 * 1536
_MODELS: dict = {}


def shapes(family: str, flavor: str):
    if (family, flavor) not in _MODELS:
        args = get_family(family).flavors[flavor]
        meta = build_meta(family, args)
        _MODELS[family, flavor] = (args, ModelShape.from_model(meta, args), count_params(meta))
    return _MODELS[family, flavor]


def eager(seq=4096, **kw) -> MemSetup:
    return MemSetup(**{"policy": "none", "data_parallel": "fsdp2", "seq_len": seq, "device_type": "tpu", **kw})


# ---- memory ----------------------------------------------------------------------------------------------
def test_fsdp_gathers_two_blocks_where_simple_fsdp_keeps_the_whole_model():
    _, ps, _ = shapes("llama3", "70B")
    lay = Layout(64)
    per_block = eager()
    whole = replace(eager(), policy="full", data_parallel="simple_fsdp")
    two = device_memory(ps, lay, per_block, batch=1).gathered_params
    assert two == 2 * math.ceil(2 * (L70_P - L70_R) / 80 + L70_R)  # bf16: two blocks and the root (embed, head)
    assert device_memory(ps, lay, whole, batch=1).gathered_params == 2 * L70_P  # titan_core's SimpleFSDP today
    assert two < 2 * L70_P / 10
    # SimpleFSDP gathering again for the backward (reshard_after_forward) gathers inline: one block, no prefetch
    regathering = replace(eager(), data_parallel=plan_memory.REGATHERING)
    assert device_memory(ps, lay, regathering, batch=1).gathered_params == 2 * math.ceil((L70_P - L70_R) / 80 + L70_R)


def test_experts_are_divided_by_ep():
    _, ps, (total, _) = shapes("qwen3_moe", "235B-A22B")
    assert ps.expert_params == Q235_EXPERTS and ps.expert_params == Q235_EXPERTS
    assert ps.block_params + ps.expert_params + ps.embed_params + ps.head_params + ps.other_params == total
    one, eight = Layout(64), Layout(64, ep=8)
    g1, g8 = (device_memory(ps, lay, eager(), batch=1).gathered_params for lay in (one, eight))
    # two blocks in flight: each holds 1/ep of its experts; what each rank stores is the same shard either way
    assert g1 - g8 == pytest.approx(2 * 2 * Q235_EXPERTS / 94 * (1 - 1 / 8), rel=1e-6)
    assert stored_elements(ps, one) == stored_elements(ps, eight) == math.ceil(total / 64)
    assert Layout(64, ep=8).edp == 8 and Layout(16, cp=4, ep=8).edp == 8


def test_tp_vocab_shards_the_embedding_and_head():
    _, ps, _ = shapes("llama3", "70B")
    tp = Layout(8, tp=8)
    norm = ps.other_params  # the final norm stays whole on every TP rank
    assert norm == 8192 and stored_elements(ps, Layout(64)) == math.ceil(L70_P / 64)
    assert stored_elements(ps, tp) == math.ceil(((L70_P - norm) / 8 + norm) / 8)
    captured = replace(eager(), policy="default", data_parallel="simple_fsdp")
    assert device_memory(ps, tp, captured, batch=1).gathered_params == 2 * math.ceil((L70_P - norm) / 8 + norm)


def test_the_fused_loss_head_holds_one_chunk_not_the_logits():
    _, ps, _ = shapes("llama3", "70B")
    lay, vocab_tp, tokens = Layout(8, tp=8), 128256 // 8, 8 * 4096
    plain_saved, plain_t = loss_head_bytes(ps, lay, eager(loss="plain"), batch=8)
    fused_saved, fused_t = loss_head_bytes(ps, lay, eager(loss="fused_ce", ce_chunk=1024), batch=8)
    # plain: the fp32 log-softmax saved, two [tokens, vocab/tp] fp32 gradients and the logits' fp32 upcast in flight
    assert plain_t == tokens * vocab_tp * (2 * 4 + 4)
    # fused_ce: one [ce_chunk, vocab/tp] fp32 chunk, then the cat of dh's [tokens, dim] parts
    assert fused_t == 1024 * vocab_tp * 4 + tokens * 8192 * 2
    assert plain_saved - fused_saved > tokens * vocab_tp * 4 - vocab_tp * 8192 * 4 - tokens * 8192 * 2 * 2 > 0
    plain = device_memory(ps, lay, eager(loss="plain"), batch=8)
    fused = device_memory(ps, lay, eager(loss="fused_ce"), batch=8)
    assert fused.total < plain.total


def test_cp_divides_the_activations_and_pp_keeps_a_stage():
    _, ps, _ = shapes("llama3", "70B")
    a1 = device_memory(ps, Layout(8), eager(loss="plain"), batch=2).activations
    a2 = device_memory(ps, Layout(4, cp=2), eager(loss="plain"), batch=2).activations
    # every saved tensor is per token (plain loss: no fixed dW), but attention keeps K and V gathered from both cp
    # ranks: the other half of the sequence's, 2 x kv_dim bf16 per token per layer
    gathered_kv = 2 * 2 * 4096 * 8 * 128 * 2 / 2 * 80
    assert a2 == pytest.approx(a1 / 2 + gathered_kv, rel=1e-9)
    # PP: 20 of 80 layers per stage and the larger end (the head with the final norm), one FSDP shard of it
    stage = ps.block_params * 20 / 80 + ps.head_params + ps.other_params
    assert stored_elements(ps, Layout(16, pp=4)) == math.ceil(stage / 16)
    # the first stage holds pp microbatches under 1F1B, every one under GPipe, (v-1)pp + 2(pp-1) chunks of 1/v
    assert in_flight(Layout(16, pp=4), 16) == 4 and in_flight(Layout(16, pp=4, pp_schedule="gpipe"), 16) == 16
    assert in_flight(Layout(16, pp=4, pp_schedule="interleaved1F1B"), 16) == (4 + 6) / 2


def descent(ps, lay: Layout, s: MemSetup, budget: int) -> int:
    """The largest batch as first written: the linear solution from batches 1 and 2, then down one at a time to
    the first that fits (0 when batch 1 does not)."""
    one, two = (device_memory(ps, lay, s, batch=b) for b in (1, 2))
    if one.total > budget:
        return 0
    best = min([plan_memory.MAX_BATCH] + [1 + (budget - one.moments[k]) // (two.moments[k] - one.moments[k])
                                          for k in one.moments if two.moments[k] > one.moments[k]])  # fmt: skip
    best = max(1, best)
    while best > 1 and device_memory(ps, lay, s, batch=best).total > budget:
        best -= 1
    return best


def test_the_largest_batch_is_the_one_the_descent_from_the_linear_solution_finds():
    """largest_batch's bracket lands where the one-at-a-time descent from the linear solution does, with the
    estimate at that batch. A pipeline's first stage holds the larger of its microbatches' layers and the last
    stage's loss head, the fused loss a fixed [vocab, dim] beside per-token parts: not linear in the batch, so
    the linear solution can be hundreds of batches past the largest that fits (every moment only grows with
    the batch, so a bracket closes on it)."""
    _, ps, _ = shapes("qwen3_moe", "235B-A22B")
    budget = parse_target("v7x:1024").budget
    layouts = ((Layout(1, tp=4, ep=8, cp=16, pp=16), 64), (Layout(2, tp=2, ep=2, cp=16, pp=16, pp_schedule=
               "interleaved1F1B"), 64), (Layout(4, tp=2, ep=16, cp=16, pp=8), 32), (Layout(256, ep=16), 1),
               (Layout(16, ep=16, cp=4), 1))  # (layout, its microbatches)  # fmt: skip
    for lay, micro in layouts:
        for policy in ("none", "default", "full"):
            s = MemSetup(policy, "simple_fsdp", 4096, grad_accum=micro, loss="fused_ce", moe="loop")
            for room in (budget, budget // 2, budget // 4):
                fit, mem = plan_memory.largest_batch(ps, lay, s, room)
                assert fit == descent(ps, lay, s, room), (lay, policy, room)
                assert mem == device_memory(ps, lay, s, batch=max(1, fit))


# ---- the step ----------------------------------------------------------------------------------------------
def step_inputs(args, seq=4096, batch=1, micro=1, **kw) -> StepInputs:
    fpt = flops_per_token(args, seq)
    return StepInputs(batch=batch, microbatches=micro, seq_len=seq, policy="none", data_parallel="fsdp2",
                      flops_per_token=fpt, attention_flops_per_token=fpt - flops_per_token(args, 0),
                      inactive_params=0, dense_moe=False, **{"mode": "compile", **kw})  # fmt: skip


def test_collectives_cross_the_link_their_group_spans():
    args, ps, _ = shapes("llama3", "70B")
    h100 = HARDWARE["h100"]
    (inside,) = communication(ps, Layout(8), step_inputs(args), h100)
    (across,) = communication(ps, Layout(64), step_inputs(args), h100)
    assert (inside.link, inside.bandwidth, across.link, across.bandwidth) == ("NVLink", 450e9, "network", 50e9)
    # FSDP2: two bf16 all-gathers and one fp32 reduce-scatter of (n-1)/n of the weights per microbatch
    assert across.bytes == pytest.approx(63 / 64 * L70_P * (2 * 2 + 4)) and across.overlap.startswith("FSDP2 prefetches")
    # hidden under a long enough compute, but for the first gather and the last reduce-scatter
    (hidden,) = communication(ps, Layout(64), step_inputs(args), h100, compute_s=1e3)
    assert 0 < hidden.exposed_s < hidden.seconds / 40
    # under PP a stage gathers once per step (pipelining defers reshard and sync), whatever its microbatches
    (pp_fsdp, *_) = communication(ps, Layout(16, pp=4), step_inputs(args, micro=16), HARDWARE["v7x"])
    frac_bytes = (ps.block_params / 4 + ps.head_params + ps.other_params) * 15 / 16 * (2 + 4)
    assert pp_fsdp.bytes == pytest.approx(frac_bytes)


def test_expert_parallelism_trades_an_exposed_all_to_all_for_full_expert_matmuls():
    args, ps, _ = shapes("qwen3_moe", "235B-A22B")
    v7x = HARDWARE["v7x"]
    x = step_inputs(args)
    a2a = next(c for c in communication(ps, Layout(1024, ep=8), x, v7x) if c.name.startswith("EP"))
    assert a2a.bytes == pytest.approx(4 * 94 * 7 / 8 * 4096 * 8 * 4096 * 2) and not a2a.overlapped
    assert torus_hops(v7x, 8) == 1.5 and a2a.bandwidth == pytest.approx(600e9 / 1.5)
    assert torus_hops(HARDWARE["h100"], 8) == 1.0  # NVSwitch: one hop
    # an expert sees 4096 x 8 / 128 = 256 rows without EP, under v7x's ridge of 2307 / 7.38 = 313 FLOPs per byte
    assert expert_slowdown(ps, Layout(1024), x, v7x, v7x.peak_bf16) == pytest.approx(2307e12 / 7380e9 / 256)
    assert expert_slowdown(ps, Layout(1024, ep=8), x, v7x, v7x.peak_bf16) == 1.0
    step = predict_step(ps, Layout(1024, ep=8), x, peak_bf16=v7x.peak_bf16, peak_fp8=v7x.peak_fp8, hw=v7x,
                        eff=Efficiency(0.5))  # fmt: skip
    # the all-to-all on the critical path, in full; FSDP2's gathers prefetched, exposed only past each layer's compute
    a2a_step = next(c for c in step.comm if c.name.startswith("EP"))
    assert a2a_step.exposed_s == pytest.approx(a2a_step.seconds)
    assert step.step_time_s == pytest.approx(step.compute_s + sum(c.exposed_s for c in step.comm))


# ---- the two big configs, through the command ------------------------------------------------------------
runner = CliRunner()


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory):
    base = tmp_path_factory.mktemp("big")
    for name in ("Qwen3-235B-A22B", "Llama-3.1-70B"):
        ws = name.replace("-", "_").replace(".", "_").lower()
        (base / f"{ws}.json").write_text(json.dumps(PUBLISHED[name][2]))
        made = runner.invoke(app, ["new-model", ws, "--hf-config", str(base / f"{ws}.json"), "--dir", str(base),
                                   "--device", "cpu", "--twin"])  # fmt: skip
        assert made.exit_code == 0, made.stderr
    return base


@pytest.mark.parametrize("ws, moe", [("qwen3_235b_a22b", True), ("llama_3_1_70b", False)])
def test_the_big_configs_fit_seq_4096_on_v7x_1024_and_the_recipe_carries_the_degrees(workspaces, ws, moe):
    res = runner.invoke(app, ["plan", ws, "--dir", str(workspaces), "--target", "v7x:1024", "--seq", "4096", "--json"])
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    d, c = out["degrees"], out["chosen"]
    assert out["seq_len"] == 4096 and c["batch"] >= 1 and c["peak_bytes"] <= out["target"]["budget_bytes"]
    assert d["pp"] * d["dp_replicate"] * d["dp_shard"] * d["cp"] * d["tp"] == 1024
    assert (d["ep"] > 1) == moe and (d["dp_shard"] * d["cp"]) % d["ep"] == 0
    why = out["degrees_why"]
    assert set(why) == {"tp", "ep", "cp", "pp", "dp_replicate"} and all(why.values())
    assert why["ep"].startswith(f"ep {d['ep']}") and ("no experts" in why["ep"]) != moe
    p = out["prediction"]
    assert 0 < p["mfu"] < COMPUTE_EFFICIENCY["tpu"] and p["step_time_s"] >= p["compute_s"] and p["comm"]
    assert any(cm["name"].startswith("EP all-to-all") for cm in p["comm"]) == moe
    cfg = load_config(out["recipe"])  # titan_core's loader: types and ranges
    assert check_parallelism(cfg, 1024).ep == d["ep"]  # and titan_core runs the combination written
    assert out["options_accepted"] + out["refused"]["options"] == out["options_fitting"]
    assert all(o["refused"] is None for o in out["options"]) and out["refused"]["reasons"]
    par = cfg.parallelism
    assert (par.dp_shard, par.dp_replicate, par.tp, par.ep, par.cp, par.pp) == tuple(
        d[k] for k in ("dp_shard", "dp_replicate", "tp", "ep", "cp", "pp"))  # fmt: skip
    assert (cfg.training.seq_len, cfg.training.batch_size, cfg.training.grad_accum) == (4096, c["batch"],
                                                                                        c["grad_accum"])  # fmt: skip
    # the text `onboard plan` prints without --json is plan_lines of this same result (the command prints it line
    # by line: test_plan.py runs that path): the plan is not made again to read it
    text = "\n".join(plan_lines(out))
    assert f"ep {d['ep']}" in text and "chosen: " in text
    assert ("EP all-to-all over" in text and "exposed" in text) == moe


def test_nothing_fits_exits_1_with_one_line_and_keeps_the_seq(workspaces):
    root = workspaces / "onboarding" / "llama_3_1_70b"
    before = sorted(root.glob("recipe.v5e-*.toml"))
    res = runner.invoke(app, ["plan", "llama_3_1_70b", "--dir", str(workspaces), "--target", "v5e:8"])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and res.stdout == "", res.stderr
    assert lines[0].startswith("error: nothing fits --seq 4096 on 8 x v5e: the smallest peak is ")
    js = runner.invoke(app, ["plan", "llama_3_1_70b", "--dir", str(workspaces), "--target", "v5e:8", "--json"])
    out = json.loads(js.stdout)
    assert js.exit_code == 1 and out["chosen"] is None and out["recipe"] is None and out["seq_len"] == 4096
    assert f"error: {out['error']}" == lines[0]
    assert sorted(root.glob("recipe.v5e-*.toml")) == before == []


def test_what_would_fit_names_a_shorter_seq_and_more_devices():
    args, ps, counts = shapes("llama3", "8B")
    kernels = TrainSetup(batch_size=1, seq_len=1, loss="fused_ce")

    def plan(target, seq):
        return plan_training(ps, counts, lambda s: flops_per_token(args, s), target, seq_len=seq, kernels=kernels,
                             tp_plan=True, accept=accepting("llama3", "8B", target, kernels))  # fmt: skip

    one = plan(parse_target("h100:1"), 4096)  # 8B x 16 bytes of weights and AdamW: over one H100
    assert one.chosen is None and one.seq_len == 4096
    assert "--target h100:4 fits --seq 4096 (FSDP 4" in one.would_fit  # h100:2 is 64 GiB of weights and state
    # 8 devices between the smallest peaks at seq 4096 and 262144 (full activation checkpointing and CP keep the
    # activations of shorter sequences under the optimizer step): --seq 4096 fits, 262144 is not cut silently
    peak = {s: min(o.estimate.total for o in plan(replace(parse_target("h100:8"), memory_bytes=GIB), s).options)
            for s in (4096, 262144)}  # fmt: skip
    assert peak[4096] < peak[262144]
    mid = Target("h100", 8, "cuda", int((peak[4096] + peak[262144]) / 2 / 0.9), "set by the test", 989e12, 8)
    cut = plan(mid, 262144)
    assert cut.chosen is None and cut.seq_len == 262144 and "fits here" in cut.would_fit
    assert plan(mid, 4096).chosen is not None


def test_the_search_tries_each_degree_only_where_it_applies():
    _, ps, counts = shapes("qwen3_moe", "235B-A22B")
    args = get_family("qwen3_moe").flavors["235B-A22B"]
    plan = plan_training(ps, counts, lambda s: flops_per_token(args, s), parse_target("v7x:64"), seq_len=4096,
                         kernels=TrainSetup(batch_size=1, seq_len=1, loss="fused_ce", moe="tokamax"), tp_plan=False)
    lays = {o.layout for o in plan.options}
    assert all(lay.world == 64 and lay.tp == 1 for lay in lays)  # no TP plan for the MoE family
    assert all((lay.dp_shard * lay.cp) % lay.ep == 0 and 128 % lay.ep == 0 for lay in lays)
    assert {lay.cp for lay in lays} == {1, 2, 4, 8, 16} and {lay.pp for lay in lays} >= {1, 2, 4, 8, 16}
    assert not any(o.captured for o in plan.options if o.layout.pp > 1)  # a pipeline is not one captured step
    assert {lay.ep for lay in lays} == {1, 2, 4, 8, 16, 32, 64}
    dense = ModelShape.from_model(build_meta("llama3", get_family("llama3").flavors["8B"]),
                                  get_family("llama3").flavors["8B"])  # fmt: skip
    assert dense.expert_params == 0
