"""Every numeric field of every native family's config, and of FLUX's, fed values no model can
be built from: new-model exits 2 with one line `<file>: <field> = <value> is not accepted; ...`,
no traceback, nothing written. In-process (typer's CliRunner): a refusal happens while the
config is read, before any model or workspace is made, so the whole sweep takes seconds.

The tiny configs are the families' debug flavors as their adapters export them (each HF
model_type a native family runs: llama, mistral, qwen2, qwen3, qwen3_moe, glimmer, and
FLUX's diffusers config), with a pad id added. A value that is valid for a field by the
model's own semantics stays accepted: ACCEPTED lists each, with why.
"""

import json
import math
from pathlib import Path

import pytest
import typer.main
import typer.testing
from typer.testing import CliRunner

from onboard.cli.app import app
from titan_core.models import get_family, resolve_args

runner = CliRunner()
FLAVORS = {  # HF model_type -> (family, flavor)
    "llama": ("llama3", "debugmodel"), "mistral": ("llama3", "debugmodel_mistral"),
    "qwen2": ("qwen3", "debugmodel_qwen2"), "qwen3": ("qwen3", "debugmodel"), "qwen3_moe": ("qwen3_moe", "debugmodel"),
    "glimmer": ("glimmer", "debugmodel"), "flux": ("flux", "debugmodel"),
}  # fmt: skip
BAD = {"0": 0, "-1": -1, "1e30": 1e30, "inf": math.inf, "nan": math.nan, "float_for_int": None, "text": "7", "bool": True}
"""The values each numeric field is fed (float_for_int: the field's own value as a float, e.g.
4.0, only where an integer is meant)."""
ACCEPTED = {
    ("rms_norm_eps", "0"): "a norm without an epsilon still computes (upstream classes accept 0)",
    ("router_aux_loss_coef", "0"): "no auxiliary load-balancing loss",
    ("no_rope_layer_interval", "0"): "0: no layer skips RoPE",
    ("max_window_layers", "0"): "Qwen windows the layers from this index on: 0 is every layer",
    ("pad_token_id", "0"): "token 0 is a token of the vocabulary",
    ("num_layers", "0"): "FLUX with single-stream blocks only (the config keeps some)",
    ("num_single_layers", "0"): "FLUX with double-stream blocks only (the config keeps some)",
}
"""(field, value name) -> why the value is valid for that field: accepted, not refused."""


def tiny_config(model_type: str) -> dict:
    family, flavor = FLAVORS[model_type]
    cfg = get_family(family).adapter.hf_config(resolve_args(family, flavor))
    return cfg if family == "flux" else {**cfg, "pad_token_id": 0}


def leaves(cfg: dict, kinds: tuple[type, ...]) -> list[tuple[str, ...]]:
    """Paths (key, or parent and key) of the values of `kinds` (bools apart) at the top level and one level in."""
    out = []
    for key, value in cfg.items():
        if isinstance(value, dict):
            out += [(key, k) for k, v in value.items() if isinstance(v, kinds) and not isinstance(v, bool)]
        elif isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
            out.append((key,))
    return out


def with_value(cfg: dict, path: tuple[str, ...], value) -> dict:
    out = json.loads(json.dumps(cfg))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.fixture(autouse=True)
def one_command(monkeypatch):
    """The click command typer builds from `app`, built once for the hundreds of invocations of a test
    (CliRunner rebuilds it from the app's signatures on each: half the time of a refusal)."""
    command = typer.main.get_command(app)
    monkeypatch.setattr(typer.testing, "_get_command", lambda _app: command)


def new_model(folder: Path, cfg: dict):
    folder.mkdir(exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(cfg))  # NaN and Infinity as Python's json writes them (and reads them back)
    return runner.invoke(app, ["new-model", "m", "--hf-config", str(path), "--dir", str(folder), "--json"])


def refusal_problems(folder: Path, result, field: str) -> list[str]:
    """What is wrong with `result` as a refusal of `field`: [] when it is exit 2, one line naming
    the file and the field, no traceback, nothing written."""
    lines = result.stderr.strip().splitlines()
    head = f"error: {(folder / 'config.json').resolve()}: {field} = "
    problems = []
    if result.exit_code != 2:
        problems.append(f"exit {result.exit_code}: {result.exception!r}")
    elif len(lines) != 1 or not lines[0].startswith(head) or "is not accepted; " not in lines[0]:
        problems.append(f"not one line `{head}... is not accepted; ...`: {result.stderr!r}")
    if "Traceback" in result.stderr or (folder / "onboarding").exists():
        problems.append("a traceback, or a workspace folder left behind")
    return problems


@pytest.mark.parametrize("model_type", sorted(FLAVORS))
def test_every_numeric_field_refuses_every_bad_value(tmp_path, model_type):
    cfg = tiny_config(model_type)
    assert new_model(tmp_path / "valid", cfg).exit_code == 0  # the tiny config itself is accepted
    failures, refused = [], 0
    for path in leaves(cfg, (int, float)):
        field, original = ".".join(path), _get(cfg, path)
        for name, value in BAD.items():
            if name == "float_for_int":
                if isinstance(original, float):
                    continue  # a float field: a float is what it takes
                value = float(original)
            folder = tmp_path / f"{field}-{name}"
            result = new_model(folder, with_value(cfg, path, value))
            if (path[-1], name) in ACCEPTED:
                if result.exit_code != 0:
                    failures.append(f"{field} = {value!r} should be accepted ({ACCEPTED[path[-1], name]}): {result.stderr}")
                continue
            refused += 1
            failures += [f"{field} = {value!r}: {p}" for p in refusal_problems(folder, result, field)]
    assert not failures, "\n".join(failures)
    assert refused >= 8 * 6, refused  # every value, on at least the six sizes every config has


@pytest.mark.parametrize("model_type", sorted(FLAVORS))
def test_every_true_false_field_refuses_a_text_or_a_number(tmp_path, model_type):
    # "false" read as true (a non-empty text) was FLUX's guidance_embeds; a 0 or 1 is no bool either
    cfg = tiny_config(model_type)
    failures = []
    for path in [p for p in leaves(cfg, (bool,)) if isinstance(_get(cfg, p), bool)]:
        for value in ("false", 0, 1):
            folder = tmp_path / f"{'.'.join(path)}-{value}"
            result = new_model(folder, with_value(cfg, path, value))
            failures += [f"{'.'.join(path)} = {value!r}: {p}" for p in refusal_problems(folder, result, ".".join(path))]
    assert not failures, "\n".join(failures)


def _get(cfg: dict, path: tuple[str, ...]):
    node = cfg
    for key in path:
        node = node[key]
    return node
