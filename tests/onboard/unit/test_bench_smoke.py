"""The cheapest benches, run as a user runs them with their tiniest settings (bench_runs.py, a
background job of the session: tests/background.py): each prints one JSON report whose speed comes
through titan_core.measure.timing (a comparison with its interval), with the machine's load and the
protocol's settings."""

from __future__ import annotations

import json
import statistics

import pytest
from timing_checks import check_comparison

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reports() -> dict:
    """{test name: its bench's report}, from the background job that ran them all."""
    import background

    _, done, _ = background.wait("benches")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _report(reports: dict, name: str) -> dict:
    report = reports[name]
    assert "error" not in report, report.get("error")
    return report


def _check(report: dict, candidate: str, baseline: str) -> dict:
    assert report["timing_protocol"]["max_rounds"] == 3 and report["timing_protocol"]["min_rounds"] == 2
    assert all(isinstance(report["load_avg_1m"][k], float) for k in ("start", "end"))
    (c,) = [c for c in report["comparisons"] if (c["candidate"], c["baseline"]) == (candidate, baseline)]
    check_comparison(c, report["timing_protocol"]["min_effect"])  # the outcome is the one its interval gives
    assert 2 <= c["rounds"] <= 3 and c["paired"]
    assert isinstance(c["load_before"], float) and isinstance(c["load_after"], float)
    assert c["describe"].startswith(candidate) and "CI" in c["describe"]
    return c


def test_exec_modes_tiny(reports):
    report = _report(reports, "test_exec_modes_tiny")
    _check(report, "graph_none", "eager")
    assert {r["mode"] for r in report["train"]} == {"eager", "graph_none"}
    assert all("error" not in r for r in report["train"])
    for r in report["train"]:  # the median is of the steady steps, and tokens/s is the same steps' speed
        assert r["step_time_median_s"] == statistics.median(r["step_times_s"])
        assert min(r["step_times_s"]) <= r["tokens_per_step"] / r["tokens_per_s"] <= max(r["step_times_s"])


def test_fused_ce_tiny(reports):
    report = _report(reports, "test_fused_ce_tiny")
    c = _check(report, "fused_ce", "naive")
    assert report["fused"]["time_s"] == c["candidate_median_s"]
    # the plain loss holds at least the [256, 2048] fp32 logits at once (measured ~12 MB here)
    assert report["naive"]["peak_loss_memory_bytes"] >= 256 * 2048 * 4 and report["loss_abs_diff"] < 1e-4


@pytest.mark.hf
def test_trainer_vs_hf_tiny(reports):
    pytest.importorskip("transformers", reason="the HF side needs the [hf] extra (transformers)")
    report = _report(reports, "test_trainer_vs_hf_tiny")
    c = _check(report, "titan_core", "HF")
    assert report["titan_step_s_median"] == c["candidate_median_s"]


@pytest.mark.hf
def test_ladder_speedup_tiny(reports):
    """The three sides on a narrowed workspace whose ledger says the tuning rung raised the batch 2 -> 4
    (bench_runs.ladder_workspace): the baseline gets the batch back, eager, while the final recipe
    keeps what the ladder wrote."""
    pytest.importorskip("transformers", reason="the HF side needs the [hf] extra (transformers)")
    report = _report(reports, "test_ladder_speedup_tiny")
    for candidate, baseline in (("baseline", "hf"), ("final", "baseline"), ("final", "hf")):
        c = _check(report, candidate, baseline)
        assert report["ratios"][f"{candidate}_vs_{baseline}"]["throughput"] == c["speedup"]
    assert report["baseline"] == {"restored": {"training.batch_size": 2}, "assumed_default": {}, "tokens_per_step": 64}
    assert report["final"]["tokens_per_step"] == 128 and report["hf"]["tokens_per_step"] == 64
    assert set(report["tokens_per_s"]) == {"hf", "baseline", "final"}
    assert all(v > 0 for v in report["tokens_per_s"].values())
