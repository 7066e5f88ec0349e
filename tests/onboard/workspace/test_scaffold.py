"""Scaffolding: rendered files are valid and mean what they say; the port's model.py is the
family's model; a failed write leaves nothing behind."""

import importlib.util
import json
import tomllib

import pytest
import torch

import onboard.workspace.scaffold as scaffold
from onboard.errors import BadInput
from onboard.workspace.scaffold import closest_family, plan_workspace, write_workspace
from onboard.workspace.layout import Workspace
from titan_core.config import load_config
from titan_core.models.model_builder import build_model_from_config
from titan_core.models import build_meta, get_family, resolve_args
from titan_core.models.common.protocol import missing_members


def load_file(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make(tmp_path, name, **kw):
    return write_workspace(plan_workspace(name, tmp_path, **kw))


def test_preset_workspace_files_are_valid_and_consistent(tmp_path):
    root = make(tmp_path, "dbg", preset="llama3/debugmodel", device="cpu")
    recipe = tomllib.loads((root / "recipe.toml").read_text())
    assert recipe["model"] == {
        "family": "llama3",
        "flavor": "debugmodel",
        "hf_config": "config.json",
        "adapter_file": "adapter.py",
    }
    assert recipe["device"]["type"] == "cpu"
    cfg = json.loads((root / "config.json").read_text())
    args = resolve_args("llama3", "debugmodel")
    assert cfg == get_family("llama3").adapter.hf_config(args)  # the upstream parity compares against
    # the architecture the recipe describes (through config.json) is the preset's
    job = load_config(root / "recipe.toml")
    job.model.hf_config = str(root / "config.json")
    _, recipe_args, _ = build_model_from_config(job.model)
    assert recipe_args == args
    ledger = json.loads((root / "ladder.json").read_text())
    assert ledger["workspace"]["path"] == "native" and ledger["attempts"] == [] and ledger["waivers"] == []
    ws = Workspace.load(tmp_path, "dbg")
    assert (ws.family, ws.device, ws.path_kind, ws.hf_config_path) == ("llama3", "cpu", "native", root / "config.json")


def test_generated_adapter_round_trips_through_the_family_adapter(tmp_path):
    root = make(tmp_path, "q", preset="qwen3/debugmodel")
    adapter = load_file(root / "adapter.py", "ws_adapter_q")
    args = resolve_args("qwen3", "debugmodel")
    model = build_meta("qwen3", args)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    sd = model.state_dict()
    back = adapter.from_hf(adapter.to_hf(sd))
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    assert isinstance(adapter.ADAPTER, type(get_family("qwen3").adapter))
    assert adapter.args_from_hf(json.loads((root / "config.json").read_text()))[0] == args


@pytest.mark.parametrize("preset", ["llama3/debugmodel", "qwen3_moe/debugmodel", "glimmer/debugmodel"])
def test_port_model_py_computes_exactly_what_the_family_computes(tmp_path, preset):
    family, flavor = preset.split("/")
    root = make(tmp_path, "p", preset=preset, path="port")
    port = load_file(root / "model.py", f"ws_model_{family}")
    args = resolve_args(family, flavor, {"n_layers": 2})
    native = build_meta(family, args)
    native.to_empty(device="cpu")
    native.init_weights(seed=0)
    with torch.device("meta"):
        ported = port.build_model(args)
    assert missing_members(ported) == []  # all of TrainableModel: titan_core trains it as it trains the family
    ported.to_empty(device="cpu")
    ported.init_weights(seed=0)
    assert ported.state_dict().keys() == native.state_dict().keys()  # same module paths: adapters still apply
    ported.load_state_dict(native.state_dict())
    tokens = torch.randint(0, args.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    assert torch.equal(ported(tokens), native(tokens))
    assert torch.equal(ported.loss(tokens, tokens)[0], native.loss(tokens, tokens)[0])


def test_port_recipe_trains_through_titan_core_with_model_py(tmp_path):
    root = make(tmp_path, "p", preset="llama3/debugmodel", path="port")
    job = load_config(root / "recipe.toml")
    # the recipe names its files relative to itself; loading resolves them against its folder
    assert job.model.module_file == str((root / "model.py").resolve())
    assert job.model.hf_config == str((root / "config.json").resolve())
    assert job.model.adapter_file == str((root / "adapter.py").resolve())
    _, _, model = build_model_from_config(job.model)
    assert type(model).__module__.startswith("titan_port_") and type(model).__name__ == "Model"


def test_closest_family_is_the_one_that_reads_most_keys():
    moe = {**get_family("qwen3_moe").adapter.hf_config(resolve_args("qwen3_moe", "debugmodel")), "model_type": "mymoe"}
    assert closest_family(moe)[0] == "qwen3_moe"
    dense = {**get_family("llama3").adapter.hf_config(resolve_args("llama3", "debugmodel")), "model_type": "x"}
    assert closest_family(dense)[0] == "llama3"  # ties go to the first family


def test_port_of_a_config_no_adapter_reads_still_lists_its_keys(tmp_path):
    cfg = {
        **get_family("llama3").adapter.hf_config(resolve_args("llama3", "debugmodel")),
        "model_type": "odd",
        "hidden_act": "gelu",
        "embedding_multiplier": 12.0,
    }
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    plan = plan_workspace("odd", tmp_path, hf_config=tmp_path / "c.json", path="port")
    assert plan.unconsumed == ["embedding_multiplier"]  # not every key: only those no family reads
    assert any("cannot read config.json: hidden_act 'gelu'" in t for t in plan.todos)
    assert "TODO(port): the llama3 adapter cannot read config.json" in plan.files["adapter.py"]
    compile(plan.files["model.py"], "model.py", "exec")
    compile(plan.files["adapter.py"], "adapter.py", "exec")


def test_failed_write_leaves_no_workspace_and_no_temp_folder(tmp_path, monkeypatch):
    plan = plan_workspace("w", tmp_path, preset="llama3")

    def broken_save(self):
        raise OSError("disk full")

    monkeypatch.setattr(scaffold.Ledger, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        write_workspace(plan)
    assert not (tmp_path / "onboarding").exists()  # it did not exist before: nothing is left


def test_workspace_appearing_after_planning_is_not_overwritten(tmp_path):
    plan = plan_workspace("w", tmp_path, preset="llama3")
    make(tmp_path, "w", preset="qwen3")  # someone else got there first
    with pytest.raises(BadInput, match="already exists"):
        write_workspace(plan)
    assert "qwen3" in (tmp_path / "onboarding/w/adapter.py").read_text()
    assert [p.name for p in (tmp_path / "onboarding").iterdir()] == ["w"]


def test_pinned_threads_reach_the_trainer_config(tmp_path):
    root = make(tmp_path, "t", preset="llama3", threads=(1, "shared CPU"))
    assert "threads = 1  # shared CPU" in (root / "recipe.toml").read_text()
    assert load_config(root / "recipe.toml").device.threads == 1
    plain = make(tmp_path, "u", preset="llama3")
    assert load_config(plain / "recipe.toml").device.threads == 0  # torch's default unless asked
