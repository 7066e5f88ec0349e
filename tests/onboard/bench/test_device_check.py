"""bench/device_check.py (the one command a lent GPU runs) in its CPU tiny mode, run as a person runs it,
so that the check cannot rot between the GPU's visits: every part trains, the three execution modes agree,
the memory estimate meets a measured peak, the kernels' comparisons are made, and the --out file is the
JSON printed. Bad input is refused with exit 2 (the script's main() in this process: argument handling)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import hang_guard

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = "bench/device_check.py"
SLICES = ("llama3_8b", "qwen3_moe_30b_a3b")
MODES = ("eager", "graph", "compile")

# 35-50 s on the shared 2-core machine; whole_machine: it times steps, a climb beside it would be their noise
pytestmark = [pytest.mark.slow, pytest.mark.whole_machine]


def _run(*args: str, base_s: float = 30) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTHONPATH=str(ROOT))
    with hang_guard(base_s, f"{SCRIPT} {' '.join(args)}") as guard:
        # the script's own budget ends it (with the parts it finished) before the guard fires
        budget = ["--budget-s", f"{0.8 * guard.timeout_s:.0f}"] if "--tiny" in args else []
        return subprocess.run([sys.executable, SCRIPT, *args, *budget], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=guard.timeout_s, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("device_check") / "device_check.json"
    proc = _run("--device", "cpu", "--tiny", "--out", str(out), base_s=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout), out


def test_out_file_is_the_printed_json(tiny):
    report, out = tiny
    assert json.loads(out.read_text()) == report
    assert report["complete"] and report["ok"]
    assert not list(out.parent.glob(".*.tmp"))  # the atomic write left no temp file behind
    assert report["settings"]["device"] == "cpu" and report["settings"]["tiny"]
    assert report["versions"]["torch"] and report["device"]["type"] == "cpu"


def test_every_mode_trains_and_the_modes_agree(tiny):
    from titan_core.models import resolve_args
    from titan_core.models.common.stats import flops_per_token

    report, _ = tiny
    s = report["settings"]
    for sl in SLICES:
        spec = _parts().slice_spec(sl, tiny=True)
        args = resolve_args(spec["family"], spec["flavor"], spec["overrides"])
        step1 = {}
        for mode in MODES:
            p = report["parts"][f"{sl}/{mode}"]
            assert p["ok"] and p["ran"], p
            assert len(p["step_times_s"]) == s["timed_steps"]
            assert len(p["losses"]) == s["warmup_steps"] + s["timed_steps"]
            assert all(math.isfinite(x) for x in p["losses"])
            assert 0 < p["tokens_per_s_min"] <= p["tokens_per_s_median"] <= p["tokens_per_s_max"]
            # MFU from titan_core's own FLOPs per token of the slice, over the trainer's CPU peak
            assert p["flops_per_token"] == flops_per_token(args, spec["seq"])
            assert p["mfu"] == pytest.approx(p["flops_per_token"] * p["tokens_per_s_median"] / p["trainer_peak_flops"])
            step1[mode] = p["step1_loss"]
        # a random init over a 256-token vocabulary starts near ln 256
        assert abs(step1["eager"] - math.log(256)) < 0.5
        for mode in ("graph", "compile"):  # fp32: the same first step up to rounding
            assert abs(step1[mode] - step1["eager"]) <= 1e-5 * step1["eager"], step1
        assert report["slices"][sl]["step1_losses_agree"] is True
    assert report["parts"]["llama3_8b/graph"]["graph"]["trace_s"] > 0
    assert report["parts"]["llama3_8b/compile"]["compiled_modules"] >= 2
    assert report["parts"]["qwen3_moe_30b_a3b/eager"]["swaps"] == {"moe.dense": 2}


def test_memory_estimate_against_the_measured_peak(tiny):
    report, _ = tiny
    for name, p in report["parts"].items():
        if not p.get("ran"):
            continue
        m = p["memory"]
        # CPU: TensorPeak (titan_core/memory/tensor_peak.py) over a step plus the tensors held before it
        assert "TensorPeak" in m["measured_by"], name
        assert m["estimate_bytes"] > 0 and m["measured_peak_bytes"] > 0, name
        # the estimate tracks tensors within a few percent here (0.90-1.05 measured): a wrong
        # estimate or a measurement that misses the step shows as a ratio far from 1
        assert 0.5 <= m["measured_over_estimate"] <= 2.0, (name, m)
        assert m["measured_over_estimate"] == round(m["measured_peak_bytes"] / m["estimate_bytes"], 4)


def test_fused_ce_and_float8(tiny):
    from titan_core.kernels.float8 import FLOAT8_LOSS_REL

    report, _ = tiny
    f = report["fused_ce"]
    assert f["ran"] and f["losses_agree"] and f["loss_rel_diff"] <= 1e-5
    # the plain loss holds the [64, 256] fp32 logits at once; the fused one a 16-token chunk of them
    assert f["fused_peak_bytes"] < f["plain_peak_bytes"] and f["saved_bytes"] >= 32 * 256 * 4
    assert report["parts"]["fused_ce"]["swaps"] == {"loss.fused_ce(chunk=16)": 1}
    f8 = report["float8"]
    if importlib.util.find_spec("torchao") is None:
        assert f8["ran"] is False and f8["why"].startswith("torchao not importable")
        return
    assert f8["ran"] and f8["emulated"] and f8["float8_tokens_per_s"] > 0 and f8["baseline_tokens_per_s"] > 0
    # every linear of the two blocks (q, k, v, o, w1, w2, w3), not the output head
    assert report["parts"]["float8"]["swaps"] == {"float8.tensorwise": 14}
    # within the bound titan_core holds float8 to against the same run without it
    assert abs(f8["step1_loss"] - f8["baseline_step1_loss"]) <= FLOAT8_LOSS_REL * f8["baseline_step1_loss"]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--device", "cpu"], "runs only with --tiny"),
        (["--device", "cpu", "--tiny", "--out", "/nonexistent-folder/x.json"], "does not exist"),
        (["--device", "cuda"], "CUDA is not available"),
    ],
)
def test_bad_input_is_refused(args, says, capsys):
    """The script's `main(argv)` in this process (what `sys.exit(main())` exits with): a refusal is
    argument handling, before any job's process starts."""
    if args == ["--device", "cuda"] and _cuda():
        pytest.skip("this machine has CUDA")
    code = _script().main(args)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], err


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _parts():
    return _bench_module("_device_parts")


def _script():
    return _bench_module("device_check")


def _bench_module(name: str):
    """bench/<name>.py imported from its folder (device_check imports _device_parts beside it)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))
