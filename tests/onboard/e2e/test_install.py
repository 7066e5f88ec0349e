"""A non-editable install carries templates/, checklists/ and skills/ and works from another folder.

The wheel is built from a clean copy of the source tree (no stale build/ folder), installed
with --no-deps into a fresh venv that sees this venv's packages through a .pth line (so
torch is not reinstalled, and this checkout's editable install is not on the path).
"""

import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hang_guard import hang_guard

REPO = Path(__file__).resolve().parents[3]
DATA = ("templates", "checklists", "skills")
SKIP = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                              "onboarding", "demo-run", "runs", ".cache")  # fmt: skip


def run(*cmd, cwd=None):
    with hang_guard(300, " ".join(str(c) for c in cmd)) as guard:
        result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=guard.timeout_s)
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.slow
def test_wheel_install_finds_its_data_from_another_folder(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=SKIP)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", src, "-w", tmp_path / "w")
    [wheel] = (tmp_path / "w").glob("titan_onboard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for kind in DATA:
        shipped = [p for p in (REPO / kind).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        if kind != "skills":  # the skill may land later; templates and checklists must be there now
            assert shipped, f"no {kind}/ in the source tree"
        for p in shipped:
            assert f"onboard/_data/{kind}/{p.relative_to(REPO / kind)}" in names, f"{p} missing from {wheel.name}"

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    vpy = venv / "bin" / "python"
    vsite = Path(run(vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (vsite / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")  # torch & co., not their .pth files
    run(sys.executable, "-m", "pip", "--python", vpy, "install", "--no-deps", "--no-index", "-q", wheel)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run(
        vpy, "-c", "import onboard.workspace.resources as r; print(r.data_dir('templates'))", cwd=elsewhere
    ).strip()
    assert Path(where).is_relative_to(venv), f"templates found at {where}, not in the installed package"
    run(venv / "bin" / "onboard", "new-model", "m", "--preset", "llama3/debugmodel", cwd=elsewhere)
    ws = elsewhere / "onboarding" / "m"
    for name in ("recipe.toml", "adapter.py", "README.md", "config.json", "ladder.json"):
        assert (ws / name).is_file(), name
    if (REPO / "templates" / "test_parity.py.j2").is_file():
        assert (ws / "test_parity.py").is_file()
    # waive reads checklists/eager.yaml from the installed data
    run(venv / "bin" / "onboard", "waive", "m", "eager", "loss_falls", "--why", "install test", cwd=elsewhere)
    assert "install test" in (ws / "ladder.json").read_text()
    if (REPO / "skills" / "onboard-model" / "SKILL.md").is_file():
        run(venv / "bin" / "onboard", "skill", "install", "--agent", "claude", cwd=elsewhere)
        assert (elsewhere / ".claude/skills/onboard-model/SKILL.md").is_file()
