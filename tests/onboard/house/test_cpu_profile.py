"""tests/cpu_profile.py, the suite's CPU profile: a test's children count in its row, and the summary adds up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]

CASES = """
import subprocess, sys, time

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", "t = __import__('time').process_time()\\nwhile __import__('time').process_time() - t < 0.4: pass"], check=True)

def test_sleeps():
    time.sleep(0.2)
"""


def test_a_child_s_cpu_counts_in_its_test_and_the_summary_adds_up(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {**os.environ, "PYTHONPATH": str(TESTS), "CPU_PROFILE_DIR": str(tmp_path / "prof")}
    env.pop("PYTEST_ADDOPTS", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "cpu_profile", "-p", "no:cacheprovider",
                          "-p", "no:xdist", str(tmp_path / "test_cases.py")], cwd=tmp_path, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    out = subprocess.run([sys.executable, str(TESTS / "cpu_profile.py"), str(tmp_path / "prof"), "5"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    got = json.loads(out.stdout)
    rows = {t["test"].split("::")[1]: t for t in got["tests_costliest"]}
    assert got["tests"] == 2 and set(rows) == {"test_burns_in_a_child", "test_sleeps"}
    assert rows["test_burns_in_a_child"]["cpu_s"] >= 0.4  # the child's CPU, counted once it was waited for
    assert rows["test_sleeps"]["wall_s"] >= 0.2 and rows["test_sleeps"]["cpu_s"] < 0.2  # sleeping costs no CPU
    assert abs(got["cpu_s"] - sum(t["cpu_s"] for t in rows.values())) <= 0.1  # each rounded to 0.1 s
    bad = subprocess.run([sys.executable, str(TESTS / "cpu_profile.py"), str(tmp_path / "none")],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "usage" in bad.stderr
    bad_n = subprocess.run([sys.executable, str(TESTS / "cpu_profile.py"), str(tmp_path / "prof"), "five"],
                           capture_output=True, text=True)  # fmt: skip
    assert bad_n.returncode == 2 and "usage" in bad_n.stderr and not bad_n.stdout
