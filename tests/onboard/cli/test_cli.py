"""CLI contract: bad input exits 2 with one clear line and writes nothing; --json keeps stdout pure."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.ladder.table import default_specs

runner = CliRunner()
LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "hidden_act": "silu", "tie_word_embeddings": False,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}  # fmt: skip


def onboard(*args):
    return runner.invoke(app, [str(a) for a in args])


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_config(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def assert_bad_input(result, *needles):
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "name, needle",
    [
        ("a/b", "must not contain '/'"),
        ("..", "must not contain"),
        ("../escape", "must not contain"),
        ("my model", "characters other than"),
        ("my-model", "characters other than"),
        ("modèle", "characters other than"),
        ("1model", "starts with a digit"),
        ("", "NAME is empty"),
    ],
)
def test_bad_names_exit_2_and_write_nothing(tmp_path, name, needle):
    cfg = write_config(tmp_path / "config.json", LLAMA)
    before = snapshot(tmp_path)
    assert_bad_input(onboard("new-model", name, "--hf-config", cfg, "--dir", tmp_path), needle)
    assert snapshot(tmp_path) == before and not (tmp_path / "onboarding").exists()
    assert not (tmp_path.parent / "escape").exists()


@pytest.mark.parametrize(
    "config, needles",
    [
        (None, ["HF config not found"]),
        ("{not json", ["malformed JSON"]),
        ("[1, 2]", ["is not a JSON object"]),
        ({**LLAMA, "model_type": None}, ["has no model_type"]),
        (
            {**LLAMA, "model_type": "gemma9"},
            ["unknown model_type 'gemma9'", "llama3 (llama, mistral)", "qwen3", "--path port"],
        ),
        ({**LLAMA, "hidden_act": "gelu"}, ["does not fit the llama3 family", "gelu", "--path port"]),
    ],
)
def test_bad_configs_exit_2_and_write_nothing(tmp_path, config, needles):
    cfg = tmp_path / "in" / "config.json"
    cfg.parent.mkdir()
    if config is not None:
        write_config(cfg, config)
    before = snapshot(tmp_path)
    assert_bad_input(onboard("new-model", "m", "--hf-config", cfg, "--dir", tmp_path), *needles)
    assert snapshot(tmp_path) == before and not (tmp_path / "onboarding").exists()


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--preset", "llama3/debugmodel"], "exactly one of --hf-config"),
        (["--path", "sideways"], "--path must be one of native, port"),
        (["--device", "abacus"], "--device must be one of"),
        (["--weights", "/nonexistent/w"], "is not a folder"),
    ],
)
def test_bad_options_exit_2(tmp_path, extra, needle):
    cfg = write_config(tmp_path / "config.json", LLAMA)
    before = snapshot(tmp_path)
    assert_bad_input(onboard("new-model", "m", "--hf-config", cfg, "--dir", tmp_path, *extra), needle)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "preset, needle",
    [("nosuch", "unknown family 'nosuch'"), ("llama3/huge", "unknown flavor 'huge'"), (None, "exactly one of")],
)
def test_bad_presets_exit_2(tmp_path, preset, needle):
    args = ["new-model", "m", "--dir", tmp_path] + (["--preset", preset] if preset else [])
    assert_bad_input(onboard(*args), needle)
    assert not (tmp_path / "onboarding").exists()


def test_weights_folder_without_safetensors_is_bad_input(tmp_path):
    (tmp_path / "w").mkdir()
    assert_bad_input(
        onboard("new-model", "m", "--preset", "llama3", "--weights", tmp_path / "w", "--dir", tmp_path),
        "no *.safetensors",
    )


def test_existing_workspace_needs_force_and_is_left_untouched(tmp_path):
    assert onboard("new-model", "m", "--preset", "llama3/debugmodel", "--dir", tmp_path).exit_code == 0
    ws = tmp_path / "onboarding" / "m"
    (ws / "adapter.py").write_text("# the porter's work\n")
    before = snapshot(tmp_path)
    assert_bad_input(onboard("new-model", "m", "--preset", "qwen3", "--dir", tmp_path), "already exists", "--force")
    assert snapshot(tmp_path) == before
    result = onboard("new-model", "m", "--preset", "qwen3", "--dir", tmp_path, "--force")
    assert result.exit_code == 0, result.stderr
    assert "qwen3" in (ws / "adapter.py").read_text() and "porter" not in (ws / "adapter.py").read_text()
    names = sorted(p.name for p in (tmp_path / "onboarding").iterdir())
    assert names[0] == "m" and len(names) == 2 and names[1].startswith("m.backup-")  # no temp folders left
    assert (tmp_path / "onboarding" / names[1] / "adapter.py").read_text() == "# the porter's work\n"  # kept


def test_new_model_json_lists_unconsumed_keys_everywhere(tmp_path):
    cfg = write_config(tmp_path / "config.json", {**LLAMA, "attn_logit_softcapping": 50.0, "use_qk_norm": True})
    result = onboard("new-model", "m", "--hf-config", cfg, "--dir", tmp_path, "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)  # stdout is exactly one JSON document
    assert data["unconsumed_keys"] == ["attn_logit_softcapping", "use_qk_norm"]
    assert (data["family"], data["path"], data["model_type"]) == ("llama3", "native", "llama")
    ws = Path(data["workspace"])
    assert (ws / "config.json").read_bytes() == cfg.read_bytes()  # copied byte for byte: hashes cover it
    readme = (ws / "README.md").read_text()
    assert "| `attn_logit_softcapping` | `50.0` |" in readme and "| `use_qk_norm` | `true` |" in readme
    assert "attn_logit_softcapping = 50.0" in (ws / "adapter.py").read_text()
    human = onboard("new-model", "m2", "--hf-config", cfg, "--dir", tmp_path)
    assert "attn_logit_softcapping = 50.0" in human.stdout and "use_qk_norm = true" in human.stdout


def test_port_path_writes_model_py_with_todos(tmp_path):
    cfg = {**LLAMA, "model_type": "gemma9", "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 64}
    result = onboard("new-model", "p", "--hf-config", write_config(tmp_path / "c.json", cfg), "--path", "port",
                     "--dir", tmp_path, "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    # glimmer reads final_logit_softcapping, so it reads more of this config than llama3 does
    assert (data["family"], data["path"]) == ("glimmer", "port")
    assert data["unconsumed_keys"] == ["query_pre_attn_scalar"]
    ws = Path(data["workspace"])
    model = (ws / "model.py").read_text()
    assert "# TODO(port): model_type 'gemma9' has no titan_core family; this port starts from glimmer" in model
    assert "# TODO(port): `query_pre_attn_scalar` = 64 is not read by the glimmer family" in model
    assert 'module_file = "model.py"' in (ws / "recipe.toml").read_text()
    assert "def build_model(args" in model


def test_unknown_workspace_and_broken_ledger_are_bad_input(tmp_path):
    assert_bad_input(onboard("status", "ghost", "--dir", tmp_path), "no workspace 'ghost'", "new-model")
    assert onboard("new-model", "m", "--preset", "llama3", "--dir", tmp_path).exit_code == 0
    (tmp_path / "onboarding/m/ladder.json").write_text("{truncated")
    assert_bad_input(onboard("next-step", "m", "--dir", tmp_path), "ladder.json is not valid JSON")
    result = onboard("status", "m", "--dir", tmp_path, "--json")
    assert result.exit_code == 2 and json.loads(result.stdout)["exit_code"] == 2


def test_waive_validates_rung_and_criterion_and_is_shown(tmp_path):
    assert onboard("new-model", "m", "--preset", "llama3", "--dir", tmp_path).exit_code == 0
    ledger = tmp_path / "onboarding/m/ladder.json"
    before = ledger.read_bytes()
    assert_bad_input(onboard("waive", "m", "warp", "x", "--why", "w", "--dir", tmp_path), "unknown rung 'warp'")
    assert_bad_input(onboard("waive", "m", "tuning", "x", "--why", "w", "--dir", tmp_path), "no criterion 'x'")
    assert_bad_input(
        onboard("waive", "m", "eager", "nope", "--why", "w", "--dir", tmp_path), "no criterion 'nope'", "loss_falls"
    )
    assert_bad_input(onboard("waive", "m", "eager", "loss_falls", "--why", "  ", "--dir", tmp_path), "--why")
    assert ledger.read_bytes() == before
    result = onboard(
        "waive", "m", "eager", "loss_falls", "--why", "toy model, person said ok", "--dir", tmp_path, "--json"
    )
    assert result.exit_code == 0
    waiver = json.loads(result.stdout)["waiver"]
    assert (waiver["rung"], waiver["criterion"], waiver["why"]) == ("eager", "loss_falls", "toy model, person said ok")
    assert json.loads(ledger.read_text())["waivers"] == [waiver]
    status = json.loads(onboard("status", "m", "--dir", tmp_path, "--json").stdout)
    assert status["waivers"] == [waiver]
    text = onboard("status", "m", "--dir", tmp_path).stdout
    assert "WAIVED CRITERIA" in text and "eager/loss_falls: toy model, person said ok" in text


def test_status_and_list_json(tmp_path):
    for name in ("a", "b"):
        assert onboard("new-model", name, "--preset", "llama3", "--dir", tmp_path).exit_code == 0
    status = json.loads(onboard("status", "a", "--dir", tmp_path, "--json").stdout)
    assert [(r["rung"], r["status"]) for r in status["rungs"]][:3] == [
        ("eager", "pending"),
        ("parity", "pending"),
        ("simple_fsdp", "pending"),
    ]
    built = {spec.name for spec in default_specs() if spec.built}
    for row in status["rungs"]:
        assert (row["status"] == "not built yet") == (row["rung"] not in built), row
    assert status["current_rung"] == "eager" and status["message"] == "next: run eager"
    listing = json.loads(onboard("list", "--dir", tmp_path, "--json").stdout)
    assert [w["workspace"] for w in listing["workspaces"]] == ["a", "b"]
    assert listing["workspaces"][0]["rungs"]["eager"] == "pending"
    empty = json.loads(onboard("list", "--dir", tmp_path / "nowhere", "--json").stdout)
    assert empty["workspaces"] == []


def test_train_passes_overrides_through_and_checks_nproc(tmp_path, monkeypatch):
    assert onboard("new-model", "m", "--preset", "llama3", "--dir", tmp_path).exit_code == 0
    monkeypatch.chdir(tmp_path / "onboarding/m")
    result = onboard(
        "train", "--config", "recipe.toml", "--training.steps=3", "--optimizer.lr", "0.5", "--print-config"
    )
    assert result.exit_code == 0, result.stderr
    assert "steps = 3" in result.stdout and "lr = 0.5" in result.stdout
    bad = onboard("train", "--config", "recipe.toml", "--training.stepz=3")
    assert bad.exit_code == 2 and "stepz" in bad.stderr
    # from another folder, the recipe's relative paths still mean the workspace's files
    monkeypatch.chdir(tmp_path)
    result = onboard("train", "--config", "onboarding/m/recipe.toml", "--metrics.output_dir=/tmp/x", "--print-config")
    assert result.exit_code == 0, result.stderr
    assert f'hf_config = "{tmp_path.resolve() / "onboarding/m/config.json"}"' in result.stdout
    assert 'output_dir = "/tmp/x"' in result.stdout  # the user's override wins
    zero = onboard("train", "--nproc", "0", "--config", "onboarding/m/recipe.toml")
    assert zero.exit_code == 2 and "at least 1" in zero.stderr
    # several ranks go through the launcher, which checks the config before starting any
    bad_world = onboard("train", "--nproc", "2", "--config", "onboarding/m/recipe.toml", "--training.stepz=1")
    assert bad_world.exit_code == 2 and "stepz" in bad_world.stderr


def test_skill_install_for_each_agent(tmp_path):
    claude = onboard("skill", "install", "--agent", "claude", "--dir", tmp_path, "--json")
    assert claude.exit_code == 0, claude.stderr
    assert (tmp_path / ".claude/skills/onboard-model/SKILL.md").is_file()
    (tmp_path / "AGENTS.md").write_text("# Project rules\n\nKeep it small.\n")
    for _ in range(2):  # re-installing replaces the section, never duplicates it
        result = onboard("skill", "install", "--agent", "codex", "--dir", tmp_path)
        assert result.exit_code == 0, result.stderr
    agents = (tmp_path / "AGENTS.md").read_text()
    assert agents.startswith("# Project rules\n\nKeep it small.\n")
    assert agents.count("## Skill: onboard-model") == 1
    assert ".agents/skills/onboard-model/SKILL.md" in agents
    assert (tmp_path / ".agents/skills/onboard-model/SKILL.md").is_file()
    assert_bad_input(onboard("skill", "install", "--agent", "vim", "--dir", tmp_path), "--agent must be one of")
