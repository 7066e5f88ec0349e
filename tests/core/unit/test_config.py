"""Config tree: TOML loading, typed overrides, --print-config round trip, swap registry."""

import warnings

import pytest
import torch
from torch import nn

from titan_core.config import ConfigError, JobConfig, apply_overrides, describe, from_dict, load_config, to_toml
from titan_core.config.loader import to_dict
from titan_core.models.common.swaps import apply_swaps, register_swap
from titan_core.models.common.protocol import ModelBase


def test_overrides_are_typed():
    cfg = apply_overrides(
        JobConfig(),
        [
            "--training.steps=7",
            "--optimizer.lr=3e-4",
            "--training.deterministic",
            "--kernels.swaps=attention.naive,attention.sdpa",
            "--lr_scheduler.decay",
            "linear",
            "--model.overrides={n_layers = 2}",
        ],
    )
    assert cfg.training.steps == 7 and isinstance(cfg.training.steps, int)
    assert cfg.optimizer.lr == 3e-4
    assert cfg.training.deterministic is True
    assert cfg.kernels.swaps == ["attention.naive", "attention.sdpa"]
    assert cfg.lr_scheduler.decay == "linear"
    assert cfg.model.overrides == {"n_layers": 2}


@pytest.mark.parametrize(
    "override, needle",
    [
        ("--training.stepz=3", "did you mean 'steps'"),
        ("--trainin.steps=3", "did you mean 'training'"),
        ("--training.steps=three", "expected an integer"),
        ("--training.deterministic=maybe", "expected true/false"),
        ("--lr_scheduler.decay=exp", "not one of cosine, linear, none"),
        ("--training.steps", "has no value"),
        ("--steps=3", "must name a section and a key"),
    ],
)
def test_bad_overrides(override, needle):
    with pytest.raises(ConfigError, match=needle):
        apply_overrides(JobConfig(), [override])


def test_toml_loading_and_errors(tmp_path):
    good = tmp_path / "r.toml"
    good.write_text('[model]\nflavor = "debugmodel"\n[training]\nsteps = 3\nseq_len = 64\n')
    cfg = load_config(good, ["--training.steps=4"])
    assert (cfg.training.steps, cfg.training.seq_len) == (4, 64)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[training\nsteps = 3")
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_config(bad)
    unknown = tmp_path / "u.toml"
    unknown.write_text("[training]\nbatchsize = 3\n")
    with pytest.raises(ConfigError, match="did you mean 'batch_size'"):
        load_config(unknown)
    wrong_type = tmp_path / "w.toml"
    wrong_type.write_text('[training]\nsteps = "many"\n')
    with pytest.raises(ConfigError, match="training.steps: expected an integer"):
        load_config(wrong_type)


def test_print_config_round_trip():
    cfg = apply_overrides(
        JobConfig(), ["--optimizer.lr=0.1", "--model.overrides={dim = 64, rope_scaling = {factor = 8.0}}"]
    )
    import tomllib

    again = from_dict(tomllib.loads(to_toml(cfg)))
    assert to_dict(again) == to_dict(cfg)
    assert again.optimizer.lr == 0.1


def test_every_field_documented():
    docs = describe()
    for section, fields in to_dict(JobConfig()).items():
        for key in fields:
            assert docs[section].get(key), f"{section}.{key} has no docstring"


class _Leaf(nn.Module):
    def forward(self, x):
        return x


class _Doubled(nn.Module):
    def forward(self, x):
        return 2 * x


class _Tree(ModelBase):  # swaps read a model's swap_paths and swap_refusals (ModelBase: none)
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): nn.ModuleDict({"core": _Leaf()}) for i in range(3)})
        self.head = _Leaf()


register_swap("test.double_core", "layers.*.core")(lambda old, path: _Doubled())
register_swap("test.double_layer1", "layers.1.core")(lambda old, path: _Doubled())
register_swap("test.nothing", "nowhere.*")(lambda old, path: _Doubled())


def test_swaps_replace_by_glob_and_log(caplog):
    tree = _Tree()
    with caplog.at_level("INFO", logger="titan_core.swaps"):
        claimed = apply_swaps(tree, ["test.double_core"])
    assert sorted(claimed) == ["layers.0.core", "layers.1.core", "layers.2.core"]
    assert all(isinstance(tree.layers[str(i)]["core"], _Doubled) for i in range(3))
    assert isinstance(tree.head, _Leaf)
    assert sum("test.double_core" in r.message for r in caplog.records) == 3


def test_swap_conflicts_and_misses():
    with pytest.raises(ConfigError, match="both claim module 'layers.1.core'"):
        apply_swaps(_Tree(), ["test.double_core", "test.double_layer1"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_swaps(_Tree(), ["test.nothing"])
    assert any("matched no module" in str(w.message) for w in caught)
    with pytest.raises(ConfigError, match="unknown swap"):
        apply_swaps(_Tree(), ["test.double_cor"])


def test_swap_on_meta_model_keeps_outputs():
    from titan_core.kernels import swaps_for  # registers attention swaps
    from titan_core.models import build_meta, resolve_args

    args = resolve_args("llama3", "debugmodel", {"n_layers": 2})
    ref = build_meta("llama3", args)
    ref.to_empty(device="cpu")
    ref.init_weights(seed=0)
    swapped = build_meta("llama3", args)
    cfg = JobConfig()
    cfg.kernels.attention = "naive"
    claimed = apply_swaps(swapped, swaps_for(cfg.kernels))
    assert sorted(claimed) == ["layers.0.attention.core", "layers.1.attention.core"]
    swapped.to_empty(device="cpu")
    swapped.load_state_dict(ref.state_dict())
    swapped.inv_freq.copy_(ref.inv_freq)
    tokens = torch.randint(0, args.vocab_size, (2, 32))
    a, b = ref(tokens), swapped(tokens)
    assert ((a - b).norm() / a.norm()).item() <= 1e-5


def test_recipe_input_paths_are_relative_to_the_recipe(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    recipe = ws / "recipe.toml"
    recipe.write_text('[model]\nhf_config = "config.json"\n[data]\npath = "/abs/corpus"\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_config(recipe, ["--model.module_file=port/model.py"])
    assert cfg.model.hf_config == str(ws.resolve() / "config.json")
    assert cfg.data.path == "/abs/corpus"
    assert cfg.model.module_file == "port/model.py"  # overrides stay relative to the cwd


def test_every_recipe_path_is_anchored_by_the_loader(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    recipe = ws / "recipe.toml"
    recipe.write_text(
        '[model]\nhf_config = "config.json"\nmodule_file = "model.py"\n'
        '[data]\npath = "corpus"\ncache_dir = "cache"\n'
        '[metrics]\noutput_dir = "runs/train"\n[checkpoint]\nexport_hf = "hf"\n'
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_config(recipe)
    base = ws.resolve()
    assert (cfg.model.hf_config, cfg.model.module_file) == (str(base / "config.json"), str(base / "model.py"))
    assert (cfg.data.path, cfg.data.cache_dir) == (str(base / "corpus"), str(base / "cache"))
    # outputs too: a workspace's recipe writes into its own runs/ from any current directory
    assert (cfg.metrics.output_dir, cfg.checkpoint.export_hf) == (str(base / "runs/train"), str(base / "hf"))
    assert load_config(recipe, ["--metrics.output_dir=out"]).metrics.output_dir == "out"  # an override: the cwd's
    # a field at its default stays as it is (the tokenizer cache under the cwd), so that
    # --print-config output loaded as a recipe prints the same again
    recipe.write_text("[training]\nsteps = 1\n")
    assert load_config(recipe).data.cache_dir == load_config(None).data.cache_dir == ".cache/titan_core"
    assert load_config(recipe, ["--data.cache_dir=c"]).data.cache_dir == "c"
