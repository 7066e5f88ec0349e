"""The simple_fsdp rung's proof of the recipe's expert, context and pipeline degrees
(onboard/rungs/parallel_degrees.py) on narrowed debug workspaces (narrow.py), judged by the
shipped checklist.

Without processes: the gate's runs are one process (ep = cp = pp = 1, each said as an override)
and an edit of a degree makes the rung stale; a combination titan_core refuses (never launched)
and a rank's refusal fail the gate by name; a degree off by more than the bound fails it; a
recipe asking none passes with parallel_degrees_needed = []. One 2-rank gloo launch each: cp = 2
and pp = 2 (1F1B) on llama3, proved against one process on the same rows. ep = 2 on qwen3_moe
runs through the whole ladder, eager and parity first (test_simple_fsdp_e2e.py). And a MoE twin
keeps at least 4 experts, so ep = 2 has some to split.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest
from real_size_configs import PUBLISHED

from onboard.errors import BadInput
from onboard.ladder.contract import RungContext
from onboard.ladder.gates import evaluate, load_checklist
from onboard.ladder.table import TABLE
from onboard.rungs import gate_recipe
from onboard.rungs import parallel_degrees
from onboard.rungs.parallel_degrees import DegreeProof
from onboard.sizing.fit import choose_twin, gate_fit
from onboard.sizing.twin.derive import derive_twin
from onboard.workspace.scaffold import plan_workspace
from titan_core.config.loader import ConfigError
from titan_core.models import get_family
from titan_core.measure.numerics import curve_max_rel
from titan_core.launcher import LaunchResult, WorldRun

DEGREE_CRITERIA = ("parallel_degrees_proved", "parallel_degrees_exact")


def ctx_for(ws, tmp_path, lines=None):
    log = lines.append if lines is not None else (lambda line: None)
    return RungContext(workspace=ws, attempt_dir=tmp_path / "attempt", evidence={}, log=log)


def with_degrees(ws, parallelism: str, grad_accum: int = 1, seq_len: int = 32):
    text = ws.recipe_path.read_text()
    assert "seed = 0" in text and "seq_len = 32" in text, "the recipe template changed"
    text = text.replace("seed = 0", f"seed = 0\ngrad_accum = {grad_accum}")
    text = text.replace("seq_len = 32", f"seq_len = {seq_len}")
    ws.recipe_path.write_text(text + f"\n[parallelism]\n{parallelism}\n")
    return ws


def judged(m: dict, precision: str = "fp32") -> dict:
    """The degree criteria of the shipped checklist on `m` (the rung's other numbers are not these tests')."""
    results = evaluate(load_checklist("simple_fsdp"), {**m, "precision": precision})
    return {r["name"]: r for r in results if r["name"] in DEGREE_CRITERIA}


def test_the_gate_runs_one_process_and_an_edited_degree_makes_the_rung_stale(narrow_ws, tmp_path):
    ws = with_degrees(narrow_ws("qwen3_moe"), "ep = 2\nep_capacity_factor = 1.5")
    ctx = ctx_for(ws, tmp_path)
    base = gate_recipe.job_config(ctx)
    p = base.parallelism
    assert (p.ep, p.cp, p.pp, p.ep_capacity_factor) == (1, 1, 1, 0.0)  # eager and the sharded runs: one process
    overrides = gate_recipe.gate_overrides(ctx, base)
    assert "the gate runs parallelism.ep = 1 (recipe says 2)" in overrides
    assert "the gate runs parallelism.ep_capacity_factor = 0.0 (recipe says 1.5)" in overrides
    reads = TABLE["simple_fsdp"].reads_recipe_key
    for key in ("ep", "cp", "pp", "pp_schedule", "pp_layers", "ep_capacity_factor"):
        assert reads(f"parallelism.{key}"), key
    recipe = gate_recipe.recipe(ctx)
    assert parallel_degrees.needed(recipe) == ["ep"]
    cfg, world, notes = parallel_degrees.degree_config(base, recipe, "ep", tmp_path / "ep", 3)
    # ep = 2 is carved from 2 data-parallel ranks, B/2 rows each; the capacity that drops rows is off, said
    assert (world, cfg.parallelism.ep, cfg.parallelism.dp_shard, cfg.training.batch_size) == (2, 2, -1, 2)
    assert cfg.parallelism.ep_capacity_factor == 0.0 and "dropless" in notes[0]
    assert (cfg.training.dtype, cfg.data.repeat_batch, cfg.training.steps) == ("float32", False, 3)
    one = parallel_degrees.baseline_config(cfg, base, world, tmp_path / "baseline")
    assert (one.training.batch_size, one.training.grad_accum, one.parallelism.ep) == (2, 2, 1)


def refusing_world(launched: list):
    """A run_world whose ranks all refuse their config as titan_core's ranks do (exit 2, `error: ...`)."""

    def run_world(cfg, nproc, *, timeout_s=None):
        launched.append((nproc, {d: getattr(cfg.parallelism, d) for d in ("ep", "cp", "pp")}))
        asked = "+".join(d for d in ("cp", "pp") if getattr(cfg.parallelism, d) > 1)
        tail = ["[rank0]: starting", f"error: a refusal of {asked}"]
        failure = "error: rank 0 of 2 failed first (exit code 2, 1.0 s after start); the last lines of its output:"
        return WorldRun([], LaunchResult(2, failure, 0, 1.0, [tail, []]))

    return run_world


def test_a_combination_titan_core_refuses_fails_the_gate_without_a_launch(narrow_ws, tmp_path, monkeypatch):
    ws = with_degrees(narrow_ws("llama3"), 'cp = 2\npp = 2\npp_schedule = "1F1B"', grad_accum=2)
    launched = []
    monkeypatch.setattr("titan_core.launcher.run_world", refusing_world(launched))
    # titan_core composes cp with pp now: its check stands in refusing the pair, as it refuses what it does not run
    check = parallel_degrees.check_parallelism

    def refusing_the_pair(cfg, world):
        if cfg.parallelism.cp > 1 and cfg.parallelism.pp > 1:
            p = cfg.parallelism
            raise ConfigError(f"parallelism.cp = {p.cp} with pp = {p.pp}: a stand-in refusal")
        return check(cfg, world)

    monkeypatch.setattr(parallel_degrees, "check_parallelism", refusing_the_pair)
    lines = []
    ctx = ctx_for(ws, tmp_path, lines)
    m = parallel_degrees.run(ctx, gate_recipe.job_config(ctx))
    # each degree alone went to its ranks (which refused it here); the combination never left titan_core's check
    assert launched == [(2, {"ep": 1, "cp": 2, "pp": 1}), (2, {"ep": 1, "cp": 1, "pp": 2})]
    assert m["parallel_degrees_needed"] == ["cp", "pp", "cp+pp"] and m["parallel_degrees_unproved"] == 3
    assert m["parallel_degrees"]["cp"]["refused"] == "a refusal of cp"  # the rank's own `error:` line
    combo = m["parallel_degrees"]["cp+pp"]
    assert combo["world_size"] == 4 and combo["proved"] is False
    assert combo["refused"] == "parallelism.cp = 2 with pp = 2: a stand-in refusal"
    assert m["parallel_degrees_unproved_why"][2] == f"cp+pp: titan_core refuses it: {combo['refused']}"
    assert m["parallel_degrees_max_rel_err"] == math.inf and ctx.runs == []  # a refusal trains nothing
    # each refusal said once, as its degree ran; the summary names the degrees without repeating it
    assert sum(combo["refused"] in line for line in lines) == 1
    assert any("not proved: cp, pp, cp+pp (why above)" in line for line in lines)
    results = judged(m)
    assert not results["parallel_degrees_proved"]["ok"] and results["parallel_degrees_proved"]["value"] == 3
    assert "titan_core refuses it" in results["parallel_degrees_proved"]["hint"]
    assert not results["parallel_degrees_exact"]["ok"]


def test_a_degree_off_by_more_than_the_bound_fails_and_a_recipe_asking_none_passes():
    bound = gate_recipe.bound("simple_fsdp", "parallel_degrees_exact", "fp32", {})
    off = DegreeProof("ep", {"ep": 2}, {"ep": 4}, 2, loss_max_rel_err=0.0, grad_norm_max_rel_err=3 * bound,
                      worst_step=1)  # fmt: skip
    fine = DegreeProof("cp", {"cp": 2}, {"cp": 2}, 2, loss_max_rel_err=bound / 10, grad_norm_max_rel_err=0.0,
                       worst_step=3)  # fmt: skip
    m = parallel_degrees.measure([off, fine], bound)
    assert m["parallel_degrees_unproved"] == 1 and m["parallel_degrees_max_rel_err"] == 3 * bound
    assert m["parallel_degrees_unproved_why"] == [
        f"ep: losses / grad norms 0.00e+00 / {3 * bound:.2e} from one process (worst step 1), bound {bound:g}"
    ]
    assert [m["parallel_degrees"][d]["proved"] for d in ("ep", "cp")] == [False, True]
    for precision in ("fp32", "bf16"):  # the degree runs are fp32 whatever the recipe computes in
        results = judged(m, precision)
        assert [name for name, r in results.items() if not r["ok"]] == list(DEGREE_CRITERIA)
        exact = results["parallel_degrees_exact"]
        assert exact["threshold"] == bound == 1e-5 and "fp32" in exact["bound_why"]
        assert "1/ep" in exact["hint"] and "positions not sliced" in exact["hint"]
    none = parallel_degrees.measure([], 0.0)
    assert none["parallel_degrees_needed"] == [] and none["parallel_degrees_max_rel_err"] == 0.0
    assert all(r["ok"] for r in judged(none).values())


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.whole_machine
@pytest.mark.slow
@pytest.mark.parametrize(
    "parallelism, grad_accum, seq_len, want",
    [
        # seq_len 30: 2 x cp does not divide it, so the proof cuts it to 28 and says so
        ("cp = 2", 1, 30, {"cp": 2, "pp": 1, "seq_len": 28, "batch_size": 4, "grad_accum": 1}),
        ('pp = 2\npp_schedule = "1F1B"', 2, 32, {"cp": 1, "pp": 2, "seq_len": 32, "batch_size": 4, "grad_accum": 2}),
    ],
    ids=["cp2", "pp2_1f1b"],
)
def test_a_dense_degree_is_proved_against_one_process(narrow_ws, tmp_path, parallelism, grad_accum, seq_len, want):
    ws = with_degrees(narrow_ws("llama3"), parallelism, grad_accum=grad_accum, seq_len=seq_len)
    lines = []
    ctx = ctx_for(ws, tmp_path, lines)
    m = parallel_degrees.run(ctx, gate_recipe.job_config(ctx))
    label = "cp" if want["cp"] == 2 else "pp"
    proof = m["parallel_degrees"][label]
    assert m["parallel_degrees_needed"] == [label] and m["parallel_degrees_unproved"] == 0, m
    assert proof["proved"] and proof["world_size"] == 2 and proof["steps_run"] == 3
    results = judged(m)
    assert all(r["ok"] for r in results.values()), results
    # the numbers are the two runs on disk: the 2-rank run as asked, one process on the same rows
    run_dir = tmp_path / "attempt" / "degrees" / label
    recipe = tomllib.loads((run_dir / "world_recipe.toml").read_text())
    assert {k: recipe["parallelism"][k] for k in ("cp", "pp")} == {k: want[k] for k in ("cp", "pp")}
    assert {k: recipe["training"][k] for k in ("seq_len", "batch_size", "grad_accum")} == {
        k: want[k] for k in ("seq_len", "batch_size", "grad_accum")}  # fmt: skip
    assert recipe["training"]["dtype"] == "float32" and recipe["data"]["repeat_batch"] is False
    if label == "pp":
        assert recipe["parallelism"]["pp_schedule"] == "1F1B"
    else:
        assert proof["notes"] == ["training.seq_len 30 -> 28: cp = 2 cuts each row into 4 equal chunks"]
        assert any("cp = 2: training.seq_len 30 -> 28" in line for line in lines)
    assert {p.name for p in (run_dir / "logs").iterdir()} == {"rank_0.log", "rank_1.log"}
    got, one = rows(run_dir / "metrics.jsonl"), rows(tmp_path / "attempt" / "degrees" / "baseline-0" / "metrics.jsonl")
    for key in ("loss", "grad_norm"):
        assert proof[f"{key}_max_rel_err"] == curve_max_rel([r[key] for r in got], [r[key] for r in one])[0]
    assert len({r["loss"] for r in got}) == 3  # fresh rows each step: three different losses
    assert [r["steps_run"] for r in ctx.runs] == [3, 3] and all(r["problem"] is None for r in ctx.runs)


def test_a_twin_too_big_keeps_four_experts_so_ep2_splits_some():
    """A top-2 MoE whose twin fits only below 4 experts is refused rather than given 3 (which ep = 2
    cannot split) or 2: onboard/sizing/fit.py halves experts down to max(top-k + 1, 4)."""
    family, _, published = PUBLISHED["Qwen3-235B-A22B"]
    cfg = {**published, "num_experts_per_tok": 2}
    adapter = get_family(family).adapter
    plan = plan_workspace("x", Path("/nonexistent"), preset=f"{family}/debugmodel", device="cpu")

    def recipe(gib: float) -> str:
        return plan.files["recipe.toml"].replace('type = "cpu"', f'type = "cpu"\nmemory_budget_gib = {gib}')

    totals = [gate_fit(derive_twin(cfg, adapter, experts=n).config, adapter, recipe_text=recipe(1.0)).estimate.total
              for n in (3, 4)]  # fmt: skip
    assert totals[0] < totals[1]
    between = recipe(sum(totals) / 2 / 2**30)  # the 3-expert twin fits, the 4-expert one does not
    with pytest.raises(BadInput, match="even the twin does not fit"):
        choose_twin(cfg, adapter, recipe_text=between)
    roomy = choose_twin(cfg, adapter, recipe_text=recipe(totals[1] * 1.01 / 2**30))
    assert roomy.twin.args.n_experts == 4 and roomy.twin_fit.fits
