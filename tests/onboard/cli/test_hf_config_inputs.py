"""`onboard new-model --hf-config` on what is not a config file: a FIFO or a device named as what it is,
a file over titan_core's MAX_CONFIG_BYTES refused from its size; one line, exit 2, nothing written
(the reader itself: tests/core/unit/test_config_file_reader.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app


def _fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "fifo.json")
    return tmp_path / "fifo.json"


def _huge(tmp_path: Path) -> Path:
    with open(tmp_path / "config.json", "wb") as f:
        f.truncate(200 * 10**6)  # sparse
    return tmp_path / "config.json"


@pytest.mark.parametrize("make, needle", [
    (_fifo, "is a FIFO, not a regular file"),
    (lambda tmp_path: Path("/dev/zero"), "/dev/zero is a character device, not a regular file"),
    (_huge, "is 200,000,000 bytes"),
])  # fmt: skip
def test_new_model_names_a_config_that_is_no_file(tmp_path, make, needle):
    path = make(tmp_path)
    if not path.exists():
        pytest.skip(f"no {path} here")
    project = tmp_path / "project"
    result = CliRunner().invoke(app, ["new-model", "m", "--hf-config", str(path), "--dir", str(project)],
                                env={"COLUMNS": "300"})  # fmt: skip
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: HF config ") and needle in lines[0], result.stderr
    assert "not found" not in lines[0]
    assert not (project / "onboarding" / "m").exists()
