"""The cheapest benches, run as a user runs them with their tiniest settings, one after another:
`python tests/onboard/unit/bench_runs.py OUT` prints one JSON object {test name: the bench's report,
or {"error": ...}}. tests/background.py runs it from the start of the session beside the other
tests; test_bench_smoke.py asserts on the reports, which are about what a report holds and whether
its outcome follows from its interval, not about how fast this machine is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SHORT = ["--max-rounds", "3", "--min-rounds", "2"]
TIMEOUT_S = 600


def ladder_workspace(tmp: Path) -> Path:
    """A narrowed llama3 workspace whose ledger says the tuning rung raised the batch 2 -> 4."""
    from onboard.workspace.scaffold import plan_workspace, write_workspace

    plan = plan_workspace("tiny", tmp, preset="llama3/debugmodel", device="cpu", threads=(1, "tests"))
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
    return root


# test name -> (needs transformers, the bench's argv given a folder of its own)
BENCHES = {
    "test_exec_modes_tiny": (False, lambda tmp: ["exec_modes.py", "--shapes", "tiny", "--modes", "eager,graph_none",
                                                 "--steps", "3", "--trace-layers", ""]),
    "test_fused_ce_tiny": (False, lambda tmp: ["fused_ce.py", "--tokens", "256", "--hidden", "64", "--vocab", "2048",
                                               "--chunk", "128", "--iters", "1"]),
    "test_trainer_vs_hf_tiny": (True, lambda tmp: ["trainer_vs_hf.py", "--batch", "2", "--seq", "32"]),
    "test_ladder_speedup_tiny": (True, lambda tmp: ["ladder_speedup.py", str(ladder_workspace(tmp))]),
}  # fmt: skip


def run(bench: str, *args: str) -> dict:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", HF_HUB_OFFLINE="1")
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / bench), *args, *SHORT], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"bench/{bench}: no report within {TIMEOUT_S} s"}
    if proc.returncode != 0:
        return {"error": f"bench/{bench} exited {proc.returncode}: {proc.stderr[-3000:]}"}
    return json.loads(proc.stdout)


def main(out: Path) -> None:
    have_hf = importlib.util.find_spec("transformers") is not None
    reports = {}
    for name, (hf, argv) in BENCHES.items():
        if hf and not have_hf:
            continue
        tmp = out / name
        tmp.mkdir(parents=True, exist_ok=True)
        reports[name] = run(*argv(tmp))
    print(json.dumps(reports))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
