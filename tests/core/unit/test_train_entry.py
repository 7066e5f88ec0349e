"""`python -m titan_core.train`: bad input exits 2 with one clear line; --print-config round trip."""

import os
import subprocess
import sys
import tomllib

import pytest

from titan_core.config import from_dict, load_config
from titan_core.config.loader import to_dict
from titan_core.train import main

TINY = ["--training.steps=2", "--training.batch_size=2", "--training.seq_len=16", "--metrics.rich=false"]


def _run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_print_config_loads_back_to_the_same_config(tmp_path, capsys):
    code, out, _ = _run(["--print-config", "--training.steps=11", "--optimizer.lr=1e-3", "--device.type=cpu"], capsys)
    assert code == 0
    again = from_dict(tomllib.loads(out))
    assert to_dict(again) == to_dict(
        load_config(None, ["--training.steps=11", "--optimizer.lr=1e-3", "--device.type=cpu"])
    )
    recipe = tmp_path / "r.toml"
    recipe.write_text(out)
    code, out2, _ = _run(["--config", str(recipe), "--print-config"], capsys)
    assert code == 0 and out2 == out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--training.stepss=3"], "unknown key 'training.stepss' (did you mean 'steps'?)"),
        (["--training.steps=x"], "training.steps: expected an integer"),
        (["--config", "/nonexistent/recipe.toml"], "config file not found"),
        (["--model.family=llamma"], "unknown model family 'llamma' (did you mean 'llama3'?)"),
        (["--model.flavor=debugmodle"], "unknown flavor 'debugmodle'"),
        (["--device.type=tpu"], "torch_tpu is not installed"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, needle, tmp_path, capsys):
    code, out, err = _run(argv + TINY + [f"--metrics.output_dir={tmp_path}"], capsys)
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert "Traceback" not in err


def test_malformed_toml_in_a_subprocess_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[training\nsteps=")
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "titan_core.train", "--config", str(bad)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: malformed TOML")
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
