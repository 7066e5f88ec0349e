"""The execution mode of a config is read in one place (titan_core/config/execution_modes.py): every reader gets
the same mode, and a config with both switches on meets the same refusal wherever it is read."""

from __future__ import annotations

import pytest

from titan_core.config import ConfigError, JobConfig
from titan_core.config.loader import get_key
from titan_core.config.execution_modes import (
    MODE_KEYS, MODES, TWO_MODES, execution_mode, mode_switches, set_execution_mode,
)  # fmt: skip
from titan_core.memory.estimate import TrainSetup
from titan_core.parallel import check_parallelism


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_is_read_back_as_set_and_the_estimate_prices_it(mode):
    cfg = JobConfig()
    set_execution_mode(cfg, mode)
    assert execution_mode(cfg) == mode == TrainSetup.from_config(cfg).mode
    assert {key: get_key(cfg, key) for key in MODE_KEYS.values()} == mode_switches(mode)
    recipe: dict = {}
    set_execution_mode(recipe, mode)  # a recipe dict reads the same
    assert execution_mode(recipe) == mode


def test_a_recipe_dict_without_a_switch_has_it_off():
    assert execution_mode({}) == "eager" and execution_mode({"compile": {"enable": True}}) == "compile"


def test_both_switches_on_is_one_refusal_wherever_it_is_read():
    both = JobConfig()
    both.compile.enable = both.graph_trainer.enable = True
    for read in (execution_mode, lambda c: check_parallelism(c, 1), TrainSetup.from_config):
        with pytest.raises(ConfigError) as e:
            read(both)
        assert str(e.value) == TWO_MODES
    with pytest.raises(ConfigError, match="pick one"):
        execution_mode({"compile": {"enable": True}, "graph_trainer": {"enable": True}})


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown execution mode 'scan'"):
        set_execution_mode(JobConfig(), "scan")
