"""The one helper of each kind every caller uses: dotted recipe keys, byte sizes for people, the
dtype names, and a timing protocol built from settings."""

from __future__ import annotations

import typing

import pytest
import torch

from titan_core.config import ConfigError, JobConfig, get_key, set_key, with_keys
from titan_core.config.dtypes import DTYPES
from titan_core.config.loader import MISSING
from titan_core.config.sections import Training
from titan_core.measure.timing import TimingProtocol
from titan_core.memory.estimate import format_bytes


def test_a_dotted_key_reads_and_writes_a_config_and_a_recipe_dict_alike():
    cfg = JobConfig()
    assert get_key(cfg, "training.steps") == cfg.training.steps
    recipe = {"training": {"steps": 7}, "model": {"overrides": {"dim": 64}}}
    assert get_key(recipe, "training.steps") == 7 and get_key(recipe, "model.overrides.dim") == 64
    assert get_key(recipe, "device.type", None) is None and get_key(recipe, "training.steps.x", MISSING) is MISSING
    set_key(recipe, "device.type", "cpu")  # the table is made on the way
    assert recipe["device"] == {"type": "cpu"}
    changed = with_keys(cfg, {"training.steps": 3, "compile.enable": True})
    assert (changed.training.steps, changed.compile.enable) == (3, True)
    assert (cfg.training.steps, cfg.compile.enable) == (JobConfig().training.steps, False)  # a copy


def test_an_unknown_key_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"unknown key 'training\.stepz' \(did you mean 'steps'\?\)"):
        get_key(JobConfig(), "training.stepz")
    with pytest.raises(ConfigError, match="unknown key 'training.stepz'"):
        set_key(JobConfig(), "training.stepz", 3)  # never added to the dataclass
    with pytest.raises(ConfigError, match="unknown key 'nosuch.steps'"):
        get_key(JobConfig(), "nosuch.steps")


def test_bytes_read_in_one_style():
    sizes = [0, 512, 1536, 10 * 2**20, 553 * 2**20, 1.5 * 2**30, 30.5 * 2**30, 192 * 2**30, 1.3 * 2**40]
    assert [format_bytes(n) for n in sizes] == [
        "0 B",
        "512 B",
        "1.50 KiB",
        "10.0 MiB",
        "553 MiB",
        "1.50 GiB",
        "30.5 GiB",
        "192 GiB",
        "1.30 TiB",
    ]
    assert format_bytes(None) == "n/a" and format_bytes(None, missing="not recorded") == "not recorded"


def test_the_dtype_map_holds_every_name_a_recipe_takes():
    assert DTYPES == {"float32": torch.float32, "bfloat16": torch.bfloat16}
    hints = typing.get_type_hints(Training)
    for field in ("dtype", "mixed_precision_param", "mixed_precision_reduce"):
        assert typing.get_args(hints[field]) == tuple(DTYPES), field


def test_a_protocol_from_settings_keeps_defaults_for_unset_keys_and_fits_a_short_cap():
    d = TimingProtocol()
    assert TimingProtocol.from_dict({"warmup": None, "min_rounds": None, "max_rounds": None}) == d
    short = TimingProtocol.from_dict({"max_rounds": 3})
    assert (short.min_rounds, short.max_rounds, short.warmup) == (3, 3, d.warmup)
    assert TimingProtocol.from_dict({"min_rounds": 2, "max_rounds": 3}).min_rounds == 2
    with pytest.raises(ValueError, match=r"unknown timing protocol keys \['rounds'\]"):
        TimingProtocol.from_dict({"rounds": 3})
