"""The rung table (onboard/ladder/table.py): one declaration per rung of the ladder, each naming its
runner module, its Measurements and recipe keys that exist in the recipe."""

from __future__ import annotations

import importlib.util
from dataclasses import fields, is_dataclass

import pytest

from onboard.ladder.contract import Measurements
from onboard.ladder.table import RUNGS, TABLE, TUNING_KEYS, RungSpec, default_specs, earns_key
from titan_core.config.loader import get_key
from titan_core.config.execution_modes import MODE_KEYS
from titan_core.config.sections import JobConfig


@pytest.mark.parametrize("rung", RUNGS)
def test_each_rung_is_declared_with_its_runner_and_measurements(rung):
    declared = TABLE[rung]
    assert declared.name == rung and declared.runner in (f"onboard.rungs.{rung}_rung", f"onboard.rungs.{rung}_rung.rung")
    assert importlib.util.find_spec(declared.runner) is not None  # found, not imported
    assert issubclass(declared.measurements, Measurements)


@pytest.mark.parametrize("rung", RUNGS)
def test_every_earned_key_is_a_recipe_key(rung):
    cfg = JobConfig()
    for key in TABLE[rung].earns:
        section, _, name = key.partition(".")
        if name == "*":
            assert is_dataclass(getattr(cfg, section)), key
        else:
            get_key(cfg, key)  # raises for a key the recipe does not have


def test_what_the_rungs_read_and_earn():
    assert TABLE["kernels"].reads_recipe_key("compile.enable") and not TABLE["eager"].reads_recipe_key("compile.enable")
    assert not any(TABLE["kernels"].reads_recipe_key(k) for k in TUNING_KEYS)
    assert TABLE["tuning"].reads_recipe_key is None  # it reads every key
    parity = TABLE["parity"].reads_recipe_key
    assert parity("model.hf_config") and parity("lora.target_modules") and not parity("training.steps")
    assert earns_key(TABLE["kernels"], "kernels.loss") and not earns_key(TABLE["kernels"], "training.steps")
    assert all(earns_key(TABLE["compile"], k) for k in MODE_KEYS.values())
    assert not earns_key(TABLE["eager"], "compile.enable")
    assert {f.name for f in fields(TABLE["parity"].measurements)} >= {"pytest_passed", "features"}


def test_a_spec_takes_the_tables_declaration_and_a_fake_declares_itself():
    spec = next(s for s in default_specs() if s.name == "parity")
    assert spec.built and spec.module is None and spec.declared is TABLE["parity"]

    class Fake:
        def not_applicable(self, ws, recipe):
            return "never here"

    fake = RungSpec("parity", None, module=Fake())
    assert fake.declared.not_applicable(None, {}) == "never here" and fake.declared.evidence_problem is None
    assert fake.reads_recipe_key() is None  # a fake without the hook reads every key
