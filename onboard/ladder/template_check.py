"""Is the workspace's test_parity.py still the file new-model generated for it?

The parity gate believes what test_parity.py measures and writes. An edited test could write
anything into the results (numbers it made up, another workspace's results.json), so the rung
compares the file with the template rendered again for this workspace before it runs it, and
`onboard status` does the same for a passed parity entry: any difference, a comment included,
and the parity evidence does not count. Re-rendering (rather than a hash kept at scaffold time)
needs nothing the person could edit alongside the test: the template ships with onboard, and the
values it is rendered with come from the workspace's own files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onboard.sanitize import visible
from onboard.workspace.templates import render_file, template_env
from titan_core.config.hf_config import config_upstream, read_hf_config

if TYPE_CHECKING:
    from onboard.workspace.layout import Workspace

TEST_FILE = "test_parity.py"


def expected_text(ws: "Workspace") -> str:
    """test_parity.py as new-model renders it for `ws`; ConfigError where config.json cannot be read."""
    config = read_hf_config(ws.root / "config.json", require_model_type=True)
    weights = ws.weights_dir
    context = {  # the variables templates/test_parity.py.j2 reads, as scaffold.render sets them
        "name": ws.name,
        "model_type": visible(config["model_type"]),
        "path_kind": ws.path_kind,
        # render.py's flag, from the config alone so that `onboard status` loads no model
        "diffusion": config_upstream(config) == "diffusers",
        "weights_dir": str(weights) if weights else "",
        "has_weights": weights is not None,
    }
    return render_file(template_env(), TEST_FILE, context)


def tamper_problem(ws: "Workspace") -> str | None:
    """Why the workspace's test_parity.py is not the generated one (edited, missing, unreadable);
    None when it is. ConfigError where config.json, which the template names, cannot be read."""
    path = ws.root / TEST_FILE
    restore = f"run `onboard new-model {ws.name} ... --force` or restore it"
    try:
        actual = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{path} is missing; {restore}"
    except (OSError, UnicodeDecodeError) as e:
        return f"{path} cannot be read ({type(e).__name__}: {e}); {restore}"
    expected = expected_text(ws)
    if actual == expected:
        return None
    ours, theirs = expected.splitlines(), actual.splitlines()
    line = next((i for i, (a, b) in enumerate(zip(ours, theirs), 1) if a != b), min(len(ours), len(theirs)) + 1)
    return f"{path} differs from the template new-model renders for this workspace (from line {line}); {restore}"
