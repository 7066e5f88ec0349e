"""The declared flag tables (onboard.rungs.tuning_rung.flags): every flag documented; the TPU flags rendered
into LIBTPU_INIT_ARGS and passed to libtpu through the recipe's tpu.libtpu_init_flags (no TPU here:
nothing is run, the environment torch_tpu would load with is checked); the CUDA flags rendered as the
environment and inductor options of a run; and which flags this process can try, with the reason
for each one it cannot."""

from __future__ import annotations

import os
import sys
import types

import pytest

from titan_core.runtime import devices
from titan_core.config.sections import JobConfig
from onboard.rungs.tuning_rung.flags import (
    CUDA_FLAGS,
    DEVICE_KINDS,
    TPU_FLAGS,
    apply_flag,
    flag_environment,
    flags_for,
    libtpu_init_args,
    merge_libtpu,
    recipe_values,
    table,
    why_not,
)

TPU_ARGS = (
    "--xla_tpu_scoped_vmem_limit_kib=98304 --xla_tpu_enable_latency_hiding_scheduler=true "
    "--xla_tpu_enable_async_collective_fusion=true --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true --xla_tpu_overlap_compute_collective_tc=true "
    "--xla_enable_async_all_gather=true"
)


@pytest.mark.parametrize("kind", DEVICE_KINDS)
def test_every_declared_flag_has_one_line_saying_what_it_does(kind):
    flags = flags_for(kind, cores=4)
    assert len({f.name for f in flags}) == len(flags) and all(f.device == kind for f in flags)
    for f in flags:
        assert f.comment and "\n" not in f.comment and len(f.comment) < 200, f.name
        assert f.config or f.libtpu or f.env or f.inductor, f"{f.name} sets nothing"
        assert f.scope in ("in_process", "process") and f.render()
        if f.scope == "in_process":  # the Trainer reads it when built: recipe keys only
            assert f.recipe_keys and not f.env and not f.inductor, f.name
    assert [r["flag"] for r in table(kind, cores=4)] == [f.name for f in flags]


def test_tpu_flags_are_rendered_into_libtpu_init_args():
    assert libtpu_init_args(TPU_FLAGS) == TPU_ARGS
    cfg = JobConfig()
    cfg.tpu.libtpu_init_flags = "--xla_tpu_scoped_vmem_limit_kib=65536 --xla_foo=1"
    for flag in TPU_FLAGS:
        cfg = apply_flag(cfg, flag)
    # the recipe's own flag stays; one the table also sets takes the table's value, never twice
    assert cfg.tpu.libtpu_init_flags == "--xla_foo=1 " + TPU_ARGS
    assert merge_libtpu("--a=1 --b=2", ["--a=3"]) == "--b=2 --a=3"
    vmem = TPU_FLAGS[0]
    assert recipe_values(vmem, JobConfig()) == {"tpu.libtpu_init_flags": "--xla_tpu_scoped_vmem_limit_kib=98304"}
    assert vmem.render() == "LIBTPU_INIT_ARGS='--xla_tpu_scoped_vmem_limit_kib=98304'"


def test_tpu_flags_reach_libtpu_through_the_config(monkeypatch):
    """titan_core puts tpu.libtpu_init_flags into LIBTPU_INIT_ARGS before torch_tpu (and libtpu) load.
    No TPU here: torch_tpu is a stand-in module, and torch refuses the `tpu` device right after."""
    cfg = JobConfig()
    for flag in TPU_FLAGS:
        cfg = apply_flag(cfg, flag)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_user_flag=true")
    monkeypatch.setitem(sys.modules, "torch_tpu", types.ModuleType("torch_tpu"))
    with pytest.raises(RuntimeError, match="tpu"):  # no backend registers the device type on this machine
        devices.resolve_device("tpu", libtpu_init_flags=cfg.tpu.libtpu_init_flags)
    assert os.environ["LIBTPU_INIT_ARGS"] == "--xla_user_flag=true " + TPU_ARGS


def test_cuda_flags_are_rendered_as_the_runs_environment_and_inductor_options():
    by_name = {f.name: f for f in CUDA_FLAGS}
    assert by_name["inductor.max_autotune"].render() == "TORCHINDUCTOR_MAX_AUTOTUNE=1"
    assert by_name["inductor.cudagraphs"].render() == "TORCHINDUCTOR_CUDAGRAPHS=1"
    assert by_name["cuda.expandable_segments"].render() == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert by_name["graph_trainer.inductor"].render() == "--graph_trainer.compile=inductor"
    assert not by_name["inductor.max_autotune"].recipe_keys and recipe_values(by_name["nccl.nvls"], JobConfig()) == {}


def test_flag_environment_sets_and_restores_env_and_inductor_options(monkeypatch):
    import torch._inductor.config as inductor_config

    monkeypatch.delenv("TORCHINDUCTOR_CUDAGRAPHS", raising=False)
    flag = next(f for f in CUDA_FLAGS if f.name == "inductor.cudagraphs")
    before = inductor_config.triton.cudagraphs
    with flag_environment(flag):
        assert os.environ["TORCHINDUCTOR_CUDAGRAPHS"] == "1" and inductor_config.triton.cudagraphs is True
    assert "TORCHINDUCTOR_CUDAGRAPHS" not in os.environ and inductor_config.triton.cudagraphs == before


def test_what_this_process_can_try_and_why_not_the_rest():
    cfg = JobConfig()
    cfg.device.threads = 1
    by_name = {f.name: f for f in flags_for("cpu", cores=2)}
    assert why_not(by_name["threads=2"], cfg, device="cpu") is None
    assert why_not(by_name["threads=1"], cfg, device="cpu") == "the recipe already has it"
    assert "does not run the Graph Trainer" in why_not(by_name["graph_trainer.inductor"], cfg, device="cpu")
    assert "compiles nothing with inductor" in why_not(by_name["inductor.max_autotune"], cfg, device="cpu")
    assert "inference" in why_not(by_name["inductor.freezing"], cfg, device="cpu")
    passive = why_not(by_name["omp.passive_wait"], cfg, device="cpu")
    assert "when the process starts" in passive and passive.endswith("OMP_WAIT_POLICY=PASSIVE")
    cfg.compile.enable = True  # now inductor options act, but only in a fresh process
    assert "fresh one: TORCHINDUCTOR_MAX_AUTOTUNE=1" in why_not(by_name["inductor.max_autotune"], cfg, device="cpu")
    cfg.compile.enable, cfg.graph_trainer.enable = False, True
    assert why_not(by_name["graph_trainer.inductor"], cfg, device="cpu") is None
    assert why_not(TPU_FLAGS[0], cfg, device="cpu") == "a tpu flag; this run is on cpu"
    nvls = next(f for f in CUDA_FLAGS if f.name == "nccl.nvls")
    assert "one rank" in why_not(nvls, cfg, device="cuda")
    assert apply_flag(cfg, by_name["threads=2"]).device.threads == 2 and cfg.device.threads == 1
