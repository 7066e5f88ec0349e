"""The cheapest benches, run through their own command lines with their tiniest settings: each prints one
JSON report whose speed comes through titan_core.measure.timing (a comparison with its interval), with the
machine's load and the protocol's settings.

The benches that start processes of their own (exec_modes, fused_ce: each mode or variant measured in a
process of its own) run as a user runs them, `python bench/<name>.py ...`; the one-process benches
(trainer_vs_hf, ladder_speedup, activation_checkpoint, lora_memory) run their script as `__main__` in this process
(the same file, command line and stdout; ladder_speedup's one-rank process group is an in-memory store's,
destroyed at its end), which spares a second interpreter its torch, titan_core and transformers imports.
Every bench runs with one intra-op thread (OMP_NUM_THREADS=1 for a process, torch.set_num_threads(1) in
this one): on a busy 2-core machine a second thread spins at every op for a core someone else holds (3x
the CPU for the same steps)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import hang_guard
from timing_checks import check_comparison

from onboard.ladder.gates import interval_measured

ROOT = Path(__file__).resolve().parents[3]
SHORT = ["--max-rounds", "3", "--min-rounds", "2"]

# whole_machine: the benches time things, the climbs would be their noise
pytestmark = [pytest.mark.slow, pytest.mark.whole_machine]


def _run(bench: str, *args: str) -> dict:
    """`python bench/<bench> ARGS --max-rounds 3 --min-rounds 2`: its stdout, one JSON document."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    with hang_guard(300, f"bench/{bench}") as guard:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "bench" / bench), *args, *SHORT],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=guard.timeout_s,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _run_here(bench: str, *args: str) -> dict:
    """The same command line, the script run as `__main__` in this process (its folder first on sys.path,
    as `python bench/<bench>` puts it): what it printed to stdout, one JSON document."""
    from onboard.rungs.train_run import process_threads

    script = ROOT / "bench" / bench
    argv, path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = [str(script), *args, *SHORT], [str(script.parent)]
    out = io.StringIO()
    try:
        with process_threads(1), contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
    return json.loads(out.getvalue())


def _check(report: dict, candidate: str, baseline: str) -> dict:
    assert report["timing_protocol"]["max_rounds"] == 3 and report["timing_protocol"]["min_rounds"] == 2
    assert all(isinstance(report["load_avg_1m"][k], float) for k in ("start", "end"))
    (c,) = [c for c in report["comparisons"] if (c["candidate"], c["baseline"]) == (candidate, baseline)]
    check_comparison(c, report["timing_protocol"]["min_effect"])  # the outcome is the one its interval gives
    assert 2 <= c["rounds"] <= 3 and c["paired"]
    assert isinstance(c["load_before"], float) and isinstance(c["load_after"], float)
    # a 2-3 round interval may be too wide to say anything: then it is not printed (gates.comparison_line)
    shown = "CI" if interval_measured(c["ci_low"], c["ci_high"]) else "interval not measured"
    assert c["describe"].startswith(candidate) and shown in c["describe"]
    return c


def test_exec_modes_tiny():
    report = _run(
        "exec_modes.py", "--shapes", "tiny", "--modes", "eager,graph_none", "--steps", "3", "--trace-layers", ""
    )
    _check(report, "graph_none", "eager")
    assert {r["mode"] for r in report["train"]} == {"eager", "graph_none"}
    assert all("error" not in r for r in report["train"])
    for r in report["train"]:  # the median is of the steady steps, and tokens/s is the same steps' speed
        assert r["step_time_median_s"] == statistics.median(r["step_times_s"])
        assert min(r["step_times_s"]) <= r["tokens_per_step"] / r["tokens_per_s"] <= max(r["step_times_s"])


def test_fused_ce_tiny():
    report = _run(
        "fused_ce.py", "--tokens", "256", "--hidden", "64", "--vocab", "2048", "--chunk", "128", "--iters", "1"
    )
    c = _check(report, "fused_ce", "naive")
    assert report["fused"]["time_s"] == c["candidate_median_s"]
    # the plain loss holds at least the [256, 2048] fp32 logits at once (measured ~12 MB here)
    assert report["naive"]["peak_loss_memory_bytes"] >= 256 * 2048 * 4 and report["loss_abs_diff"] < 1e-4


@pytest.mark.hf
def test_trainer_vs_hf_tiny():
    pytest.importorskip("transformers", reason="the HF side needs the [hf] extra (transformers)")
    report = _run_here("trainer_vs_hf.py", "--batch", "2", "--seq", "32")
    c = _check(report, "titan_core", "HF")
    assert report["titan_step_s_median"] == c["candidate_median_s"]


@pytest.mark.hf
def test_ladder_speedup_tiny(tmp_path):
    """The three sides on a narrowed workspace whose ledger says the tuning rung raised the batch 2 -> 4:
    the baseline gets the batch back, eager, while the final recipe keeps what the ladder wrote."""
    pytest.importorskip("transformers", reason="the HF side needs the [hf] extra (transformers)")
    from onboard.workspace.scaffold import plan_workspace, write_workspace

    plan = plan_workspace("tiny", tmp_path, preset="llama3/debugmodel", device="cpu", threads=(1, "tests"))
    root = write_workspace(plan)
    config = json.loads((root / "config.json").read_text())
    config.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=256)  # fmt: skip
    (root / "config.json").write_text(json.dumps(config))
    recipe = root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("seq_len = 128", "seq_len = 32"))
    edit = {"key": "training.batch_size", "value": 4, "why": "tuning rung (batch): ..."}
    ledger = {"attempts": [{"rung": "tuning", "measurements": {"untuned_values": {"training.batch_size": 2}},
                            "details": {}, "recipe_edit": {"edits": [edit]}}]}  # fmt: skip
    (root / "ladder.json").write_text(json.dumps(ledger))
    report = _run_here("ladder_speedup.py", str(root))
    for candidate, baseline in (("baseline", "hf"), ("final", "baseline"), ("final", "hf")):
        c = _check(report, candidate, baseline)
        ratio = report["ratios"][f"{candidate}_vs_{baseline}"]
        if c["outcome"] == "not measured":  # a smoke run's few rounds: no figure, no interval
            assert ratio == {"throughput": None, "interval": None, "outcome": "not measured", "rounds": c["rounds"]}
        else:
            assert ratio["throughput"] == c["speedup"] and ratio["outcome"] == c["outcome"]
    assert report["baseline"] == {"restored": {"training.batch_size": 2}, "assumed_default": {}, "tokens_per_step": 64}
    assert report["final"]["tokens_per_step"] == 128 and report["hf"]["tokens_per_step"] == 64
    assert set(report["tokens_per_s"]) == {"hf", "baseline", "final"}
    assert all(v > 0 for v in report["tokens_per_s"].values())


def test_activation_checkpoint_bench_tiny():
    """Every policy's numerics bit-identical to none, what the forward keeps smaller under full, and each policy
    timed against none through the timing protocol."""
    report = _run_here("activation_checkpoint.py", "--shapes", "tiny")
    (shape,) = report["shapes"]
    policies = shape["policies"]
    assert set(policies) == {"none", "full", "selective_op", "selective_layer_2"}
    assert report["bit_identical"] and all(p["grads_bit_identical"] for p in policies.values())
    assert policies["full"]["kept_after_forward"] < policies["none"]["kept_after_forward"]
    assert policies["selective_layer_2"]["checkpointed_blocks"] == ["layers.0"]
    for name in ("full", "selective_op", "selective_layer_2"):
        _check(report, name, "none")


@pytest.mark.hf
def test_lora_memory_bench_tiny():
    """LoRA against full fine-tuning: only the adapters train and hold AdamW's two moments (8 bytes a
    parameter in fp32, and a step counter each), the step's peak is smaller, and the steps are timed
    against each other through the timing protocol."""
    pytest.importorskip("peft")
    report = _run_here("lora_memory.py", "--shapes", "tiny")
    (shape,) = report["shapes"]
    full, lora = shape["runs"]["full"], shape["runs"]["lora"]
    assert full["trainable_params"] == full["params"] and 0 < lora["trainable_params"] < full["trainable_params"]
    assert lora["params"] == full["params"] + lora["trainable_params"]  # the adapters beside the frozen base
    for run in (full, lora):
        state = run["optimizer_state_bytes"]
        assert 8 * run["trainable_params"] <= state < 8 * run["trainable_params"] + 4096  # moments + counters
    assert shape["state_fraction"] == round(lora["optimizer_state_bytes"] / full["optimizer_state_bytes"], 6)
    assert lora["step_peak_bytes"] < full["step_peak_bytes"]
    assert report["state_within_target"] == (shape["state_fraction"] <= 0.02)
    _check(report, "lora", "full")


def test_cpu_bf16_matmul_bench_tiny(monkeypatch):
    """torch's bf16 gemm against the fp32 products rounded once (titan_core/runtime/cpu_bf16.py) in one bf16
    Trainer: the same loss to bf16's rounding, every gradient within it, each path timed against the other
    through the timing protocol, and one product's error from fp64 on both paths; the process left as it was.
    Where this CPU's bf16 gemm is native the bench says so and times nothing; here it runs its comparison
    anyway (against oneDNN's kernel), so the smoke run is the same on every CPU."""
    from titan_core.runtime import cpu_bf16

    was = cpu_bf16.enabled()
    monkeypatch.setattr(cpu_bf16, "bf16_gemm_is_native", lambda: False)
    report = _run_here("cpu_bf16_matmul.py", "--shapes", "tiny")
    (shape,) = report["shapes"]
    assert shape["params_dtype"] == "torch.bfloat16" and report["bf16_gemm_is_native"] is False
    assert shape["loss"]["rel"] <= 2.0**-8 and shape["grad_max_rel_l2"] <= 2.0**-7
    _check(report, "fp32_products", "torch_kernel")
    _check(report, "fp32_product", "torch_kernel_product")
    errors = report["product"]["rel_err_vs_fp64"]
    assert 0 < errors["fp32_products"] <= 2.0**-8 and 0 < errors["torch_kernel"] <= 2.0**-8
    assert cpu_bf16.enabled()  # the bench ends on the path a bf16 run here takes
    if not was:  # a CPU whose gemm is native: its processes keep oneDNN's kernel
        cpu_bf16.disable()
