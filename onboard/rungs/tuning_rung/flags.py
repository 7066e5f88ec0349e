"""Compiler and runtime flags, declared per device kind, and how one is applied to a run.

A flag acts through one or more of:

- `config`: recipe keys (`device.threads`, `graph_trainer.compile`): `apply_flag` sets them on a
  copy of the JobConfig, and a kept flag becomes a recipe edit of the same keys;
- `libtpu`: XLA/libtpu flags, appended to `tpu.libtpu_init_flags`; titan_core hands that string
  to libtpu as LIBTPU_INIT_ARGS before torch_tpu loads (`devices.resolve_device`), so they are
  recipe keys too;
- `env` / `inductor`: environment variables of the run and torch._inductor.config options.
  No recipe key holds them (titan_core's config has no environment section), so they are
  declared, rendered as the command prefix that sets them, and never written to a recipe.

`scope` says whether a flag can be tried inside a running process. `in_process`: the Trainer
reads it when it is built (intra-op threads; the Graph Trainer's own inductor compile).
`process`: read once when the process or a runtime starts (OpenMP, glibc malloc, the CUDA
caching allocator, libtpu) or fixed when dynamo first compiles a frame (inductor options:
dynamo's cache does not key on them, so two settings cannot be timed side by side in one
process). A `process` flag is only tried by runs in fresh processes.

The TPU table cannot run on a machine without a TPU: there it is rendered (`libtpu_init_args`)
and passed through the config, which tests check; nothing claims it was measured.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator

from titan_core.config.loader import get_key, with_keys
from titan_core.config.execution_modes import execution_mode

DEVICE_KINDS = ("cpu", "cuda", "tpu")


@dataclass(frozen=True)
class Flag:
    name: str
    """Unique within its device kind, e.g. `threads=2`, `inductor.max_autotune`."""
    device: str
    """cpu | cuda | tpu: the device kind the flag is for."""
    comment: str
    """One line: what it does and why it may help."""
    config: tuple[tuple[str, Any], ...] = ()
    """(dotted recipe key, value) pairs it sets."""
    libtpu: tuple[str, ...] = ()
    """libtpu flags (`--xla_...=value`) appended to tpu.libtpu_init_flags."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables of the run."""
    inductor: tuple[tuple[str, Any], ...] = ()
    """torch._inductor.config options (dotted, e.g. `triton.cudagraphs`); `env` holds the variable
    inductor reads them from at import, for a fresh process."""
    scope: str = "in_process"
    """in_process | process (see the module docstring)."""
    needs: str = ""
    """What must hold for it to act: "inductor" (the recipe compiles with inductor), "graph_trainer"
    (the recipe's mode is the Graph Trainer), "distributed" (more than one rank), "" (always)."""
    never: str = ""
    """Set when the flag cannot act on a training step at all: why (it is declared to say so)."""

    @property
    def recipe_keys(self) -> bool:
        """Whether a recipe can hold everything the flag sets (config keys and libtpu flags only)."""
        return not self.env and not self.inductor

    def render(self) -> str:
        """The flag as a person would type it: `--key=value` overrides, then `VAR=value` prefixes."""
        parts = [f"--{k}={_text(v)}" for k, v in self.config]
        if self.libtpu:
            parts.append(f"LIBTPU_INIT_ARGS='{' '.join(self.libtpu)}'")
        parts += [f"{k}={v}" for k, v in self.env]
        return " ".join(parts)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _inductor(name: str, device: str, comment: str, option: str, value: Any, var: str, var_value: str, **kw) -> Flag:
    return Flag(name, device, comment, inductor=((option, value),), env=((var, var_value),), scope="process",
                needs="inductor", **kw)  # fmt: skip


def thread_flags(cores: int) -> tuple[Flag, ...]:
    """`threads=N` for the cores this process may use (and half of them, when that is a third choice)."""
    counts = sorted({cores, max(1, cores // 2)})
    return tuple(
        Flag(
            f"threads={n}",
            "cpu",
            f"{n} intra-op threads: matmuls and reductions split over {n} of the {cores} usable cores "
            "(on a shared CPU, spinning OpenMP threads can make more of them slower)",
            config=(("device.threads", n),),
        )
        for n in counts
    )


CPU_FLAGS: tuple[Flag, ...] = (
    Flag("graph_trainer.inductor", "cpu",
         "compile the Graph Trainer's captured step whole with inductor (fused C++ loops): "
         "fewer passes over memory, different rounding",
         config=(("graph_trainer.compile", "inductor"),), needs="graph_trainer"),
    _inductor("inductor.cpp_wrapper", "cpu",
              "inductor calls its kernels from generated C++ instead of Python: less host time per launch",
              "cpp_wrapper", True, "TORCHINDUCTOR_CPP_WRAPPER", "1"),
    _inductor("inductor.max_autotune", "cpu",
              "inductor times its C++ GEMM templates against aten's matmul per shape and keeps the faster "
              "(much longer compile)", "max_autotune", True, "TORCHINDUCTOR_MAX_AUTOTUNE", "1"),
    _inductor("inductor.cpp.fp_contract", "cpu",
              "lets the C++ compiler fuse a*b+c into one FMA (-ffp-contract=on): fewer instructions, "
              "different rounding", "cpp.enable_floating_point_contract_flag", "on",
              "TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG", "on"),
    _inductor("inductor.freezing", "cpu",
              "folds the weights into the compiled graph as constants", "freezing", True,
              "TORCHINDUCTOR_FREEZING", "1",
              never="inductor freezes weights only with gradients off (inference): a training step never "
                    "uses it"),  # fmt: skip
    Flag("omp.passive_wait", "cpu",
         "idle OpenMP threads sleep instead of spinning between ops: less contention on a shared CPU",
         env=(("OMP_WAIT_POLICY", "PASSIVE"),), scope="process"),
    Flag("malloc.mmap_threshold", "cpu",
         "glibc keeps freed blocks up to 32 MiB in its heap instead of unmapping them, so a step's "
         "activations are not page-faulted in again every step",
         env=(("MALLOC_MMAP_THRESHOLD_", "33554432"),), scope="process"),
)  # fmt: skip

CUDA_FLAGS: tuple[Flag, ...] = (
    Flag("graph_trainer.inductor", "cuda",
         "compile the Graph Trainer's captured step whole with inductor (Triton kernels): fewer "
         "launches and passes over memory, different rounding",
         config=(("graph_trainer.compile", "inductor"),), needs="graph_trainer"),
    _inductor("inductor.max_autotune", "cuda",
              "inductor times Triton / cuBLAS / CUTLASS GEMM choices per shape and keeps the fastest "
              "(much longer compile)", "max_autotune", True, "TORCHINDUCTOR_MAX_AUTOTUNE", "1"),
    _inductor("inductor.cudagraphs", "cuda",
              "each compiled graph replays as one CUDA graph: no per-kernel launch cost (helps host-bound "
              "steps; inputs need static addresses)", "triton.cudagraphs", True, "TORCHINDUCTOR_CUDAGRAPHS", "1"),
    _inductor("inductor.coordinate_descent", "cuda",
              "tunes each Triton kernel's block sizes and warps by coordinate descent after the heuristics",
              "coordinate_descent_tuning", True, "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", "1"),
    Flag("cuda.expandable_segments", "cuda",
         "the caching allocator grows segments in place instead of carving new blocks: less "
         "fragmentation, so a larger batch fits", env=(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),),
         scope="process"),
    Flag("nccl.avoid_record_streams", "cuda",
         "collective buffers are freed when their stream is waited on, not through recordStream: less "
         "memory held by in-flight FSDP all-gathers", env=(("TORCH_NCCL_AVOID_RECORD_STREAMS", "1"),),
         scope="process", needs="distributed"),
    Flag("nccl.nvls", "cuda",
         "NVLink SHARP: reductions done inside the NVSwitch (HGX H100/H200/B200), faster all-reduce and "
         "reduce-scatter", env=(("NCCL_NVLS_ENABLE", "1"),), scope="process", needs="distributed"),
)  # fmt: skip

# The libtpu flags of the published TorchTitan / PyTorch-on-TPU training recipes.
TPU_FLAGS: tuple[Flag, ...] = (
    Flag("xla.scoped_vmem_limit", "tpu",
         "VMEM (on-chip vector memory) one fused kernel may claim, in KiB: more keeps larger tiles on chip",
         libtpu=("--xla_tpu_scoped_vmem_limit_kib=98304",), scope="process"),
    Flag("xla.latency_hiding_scheduler", "tpu",
         "schedules ops so that collectives run while independent compute proceeds",
         libtpu=("--xla_tpu_enable_latency_hiding_scheduler=true",), scope="process"),
    Flag("xla.async_collective_fusion", "tpu",
         "fuses collectives (all-gathers included) into asynchronous ops that may span several compute steps",
         libtpu=("--xla_tpu_enable_async_collective_fusion=true",
                 "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
                 "--xla_tpu_enable_async_collective_fusion_multiple_steps=true"), scope="process"),
    Flag("xla.overlap_compute_collective", "tpu",
         "lets the TensorCore compute while a collective is in flight",
         libtpu=("--xla_tpu_overlap_compute_collective_tc=true",), scope="process"),
    Flag("xla.async_all_gather", "tpu",
         "issues FSDP's parameter all-gathers asynchronously, ahead of the layer that needs them",
         libtpu=("--xla_enable_async_all_gather=true",), scope="process"),
)  # fmt: skip


def flags_for(device: str, *, cores: int = 1) -> tuple[Flag, ...]:
    """The declared table of one device kind (CPU: the thread counts of this host first)."""
    if device == "cpu":
        return thread_flags(cores) + CPU_FLAGS
    if device == "cuda":
        return CUDA_FLAGS
    if device == "tpu":
        return TPU_FLAGS
    raise ValueError(f"no flag table for device kind '{device}' (known: {', '.join(DEVICE_KINDS)})")


def compiles_with_inductor(cfg) -> bool:
    """Whether a run of `cfg` hands graphs to inductor (per-block compile or the Graph Trainer's)."""
    mode = execution_mode(cfg)
    if mode == "compile":
        return cfg.compile.backend == "inductor"
    return mode == "graph_trainer" and cfg.graph_trainer.compile == "inductor"


def why_not(flag: Flag, cfg, *, device: str, world_size: int = 1) -> str | None:
    """Why `flag` cannot act on a run of `cfg` here (None: it can be tried in this process).

    `device`: the resolved device kind of the run; `world_size`: the ranks the try would use.
    """
    if flag.device != device:
        return f"a {flag.device} flag; this run is on {device}"
    if flag.never:
        return flag.never
    if flag.needs == "graph_trainer" and execution_mode(cfg) != "graph_trainer":
        return "acts on the Graph Trainer's captured step; the recipe does not run the Graph Trainer"
    if flag.needs == "inductor" and not compiles_with_inductor(cfg):
        return "an inductor option; the recipe compiles nothing with inductor"
    if flag.needs == "distributed" and world_size < 2:
        return "acts on collectives between ranks; the try runs one rank"
    if already_set(flag, cfg):
        return "the recipe already has it"
    if flag.scope == "process":
        where = "libtpu reads LIBTPU_INIT_ARGS" if flag.libtpu else "it is read"
        return (
            f"{where} when the process starts (or a graph first compiles), so it cannot be timed against "
            f"the recipe inside one process; try it in a fresh one: {flag.render()}"
        )
    return None


def already_set(flag: Flag, cfg) -> bool:
    """Whether `cfg` already does what `flag` sets (every config key and libtpu flag present)."""
    if not flag.config and not flag.libtpu:
        return False
    have = set(cfg.tpu.libtpu_init_flags.split())
    return all(get_key(cfg, k) == v for k, v in flag.config) and set(flag.libtpu) <= have


def apply_flag(cfg, flag: Flag):
    """A copy of `cfg` with the flag's recipe keys set and its libtpu flags appended (not duplicated)."""
    out = with_keys(cfg, dict(flag.config))
    if flag.libtpu:
        out.tpu.libtpu_init_flags = merge_libtpu(out.tpu.libtpu_init_flags, flag.libtpu)
    return out


def merge_libtpu(current: str, extra: tuple[str, ...] | list[str]) -> str:
    """`current` with the flags in `extra` added; a flag of the same name replaces the old value."""
    names = {f.split("=", 1)[0] for f in extra}
    kept = [f for f in current.split() if f.split("=", 1)[0] not in names]
    return " ".join(kept + list(extra))


def recipe_values(flag: Flag, cfg) -> dict[str, Any]:
    """{recipe key: value} that keeps `flag` in a recipe based on `cfg`; empty when no key can hold it."""
    if not flag.recipe_keys:
        return {}
    out = dict(flag.config)
    if flag.libtpu:
        out["tpu.libtpu_init_flags"] = merge_libtpu(cfg.tpu.libtpu_init_flags, flag.libtpu)
    return out


def libtpu_init_args(flags: list[Flag] | tuple[Flag, ...], base: str = "") -> str:
    """The LIBTPU_INIT_ARGS string `flags` give on top of `base` (the recipe's tpu.libtpu_init_flags)."""
    out = base
    for f in flags:
        out = merge_libtpu(out, f.libtpu)
    return out


@contextlib.contextmanager
def flag_environment(flag: Flag) -> Iterator[None]:
    """Run the body with the flag's environment variables and inductor options, then restore both.

    For a fresh process (or code that reads them lazily); a `process` flag set here does not
    change a runtime that already started, which is why `why_not` refuses to time one in-process.
    """
    saved = {k: os.environ.get(k) for k, _ in flag.env}
    os.environ.update(dict(flag.env))
    try:
        if flag.inductor:
            import torch._inductor.config as inductor_config  # lazy: seconds to import; only flags that set it pay

            with inductor_config.patch(dict(flag.inductor)):
                yield
        else:
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def table(device: str, *, cores: int = 1) -> list[dict[str, Any]]:
    """The declared table as rows for a report: name, comment, scope, how it is set."""
    return [
        {"flag": f.name, "device": f.device, "comment": f.comment, "scope": f.scope, "set_by": f.render(),
         "recipe_keys": f.recipe_keys, "needs": f.needs or None, "never": f.never or None}
        for f in flags_for(device, cores=cores)
    ]  # fmt: skip
