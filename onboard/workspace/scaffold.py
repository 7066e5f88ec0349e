"""`onboard new-model`: decide everything about a workspace, render it, then move it into place.

Nothing touches the disk until every input has been validated and every file rendered in
memory; the files are then written to a temp folder next to the destination and renamed
into place, so bad input (exit 2) leaves nothing behind and a crash leaves no half workspace.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable


from onboard.errors import BadInput
from onboard.workspace.fsutil import BACKUP_INFIX, backup_aside, default_mode, fsync_dir
from onboard.workspace.ledger import Ledger, now_iso
from onboard.workspace.lock import WorkspaceLock
from onboard.workspace.layout import (
    HF_CONFIG, LEDGER, TWIN, name_lock, recover_locked, temp_prefix, validate_name, workspaces_dir,
)  # fmt: skip
from onboard.workspace import arch_semantics as sem
from onboard.workspace.arch_diff import architecture_differences
from onboard.workspace.render import render
from titan_core.config import ConfigError
from titan_core.config.hf_config import read_hf_config_text
from titan_core.models import FAMILY_NAMES, family_for_hf_model_type, get_family, resolve_args
from titan_core.models.registry import NATIVE_FAMILIES
from titan_core.models.common.hf_adapter import NEUTRAL_KEYS, AdapterError
from titan_core.models.common.mapping_errors import ArchitectureError
from titan_core.models.transformers.adapter import TransformersAdapter
from titan_core.models.transformers.hf_classes import config_object

DEVICES = ("auto", "cpu", "cuda", "tpu")
PATHS = ("native", "port", "transformers")
# Where a config key usually lands in a port; matched by substring, first match wins.
KEY_HINTS = (
    (
        "softcap",
        "soft-cap: final logits go through softcap() in forward and the loss head; attention "
        "scores need a core that caps them",
    ),
    (
        "sliding_window",
        "attention window: Attention(window=...) per layer; check whether the window counts "
        "the query itself (off by one)",
    ),
    ("layer_types", "per-layer attention kind (sliding vs full): args.layer_window(i) / global_every"),
    ("tie_word_embeddings", "tie the output head to tok_embeddings (args.tie_embeddings)"),
    ("bias", "a bias on projections: nn.Linear(..., bias=True) in Attention or FeedForward"),
    ("rope", "RoPE: theta, scaling type, layout (half-split vs interleaved) in rope_inv_freq / apply_rope"),
    ("head_dim", "a per-head width that is not hidden_size // num_attention_heads"),
    ("act", "MLP activation in FeedForward (the families use SwiGLU with silu)"),
    ("norm", "norm type, placement (pre / post / sandwich) or epsilon in Block"),
    ("eps", "norm epsilon"),
    ("scalar", "attention scale (Attention.scale) or another scalar multiplier"),
    ("multiplier", "a scalar multiplier (embedding, residual or logits scale)"),
    ("expert", "MoE: router, top-k, expert width, shared expert in Block"),
    ("moe", "MoE layer layout in Block"),
)


@dataclass
class Plan:
    """Everything new-model decided, before anything is written."""

    name: str
    root: Path
    family: str
    flavor: str | None
    path_kind: str
    model_type: str
    source: str
    device: str
    hf_config: dict
    hf_config_text: str
    weights: Path | None
    unconsumed: list[str]
    todos: list[str] = field(default_factory=list)
    adapter_todos: list[str] = field(default_factory=list)
    arch_differences: list[str] = field(default_factory=list)
    """Structural differences the config keys cannot show (a port: onboard/workspace/arch_diff.py)."""
    arch_note: str | None = None
    """Why the structure was not compared, when it was not."""
    upstream_tensors: list[dict] = field(default_factory=list)
    """The upstream tensors the family adapter has no name for or names in another layout, one record
    each (arch_tensors.UpstreamTensor as a dict); their lines are among `arch_differences`."""
    closest_reason: str = ""
    args_summary: str = ""
    attention: str = ""
    """transformers path: the kernels.attention the recipe starts with, when not the default ("" keeps it)."""
    attention_why: str = ""
    threads: tuple[int, str] | None = None
    twin: dict | None = None
    """The twin the gates run on (onboard/sizing/twin/setup.py): {config, rows, summary, reason}; None: the full model."""
    files: dict[str, str] = field(default_factory=dict)
    backup: Path | None = None
    """Where `--force` moved the workspace it replaced (`<NAME>.backup-<time>` beside it); None when none."""

    def meta(self) -> dict:
        """The `workspace` record of ladder.json."""
        return {
            "name": self.name,
            "family": self.family,
            "flavor": self.flavor,
            "path": self.path_kind,
            "model_type": self.model_type,
            "source": self.source,
            "hf_config": HF_CONFIG,
            "weights": str(self.weights) if self.weights else None,
            "device": self.device,
            "twin": {k: self.twin[k] for k in ("summary", "reason", "rows")} | {"file": TWIN} if self.twin else None,
            "created": now_iso(),
            "unconsumed_keys": self.unconsumed,
            "todos": self.todos,
            "architecture_differences": self.arch_differences,
            "upstream_tensors": self.upstream_tensors,
            "onboard_version": _version(),
        }


def exists_refusal(root: Path) -> BadInput:
    """The one line new-model (and the demo) refuse an existing workspace with."""
    keep = f"{root.name}{BACKUP_INFIX}<time>"
    return BadInput(f"workspace {root} already exists; pass --force to replace it (the old one is then kept as {keep})")


def _version() -> str:
    try:
        return metadata.version("titan-onboard")
    except metadata.PackageNotFoundError:
        return "unknown"


PRESET_NAMES = {"llama3_debug": "llama3/debugmodel", "flux_debug": "flux/debugmodel"}
"""Short names of the presets the README and the demo use."""


def families_line() -> str:
    return ", ".join(
        f"{n} ({', '.join(get_family(n).adapter.hf_model_types)})" for n in NATIVE_FAMILIES
    )


# ---- reading the inputs ------------------------------------------------------------------
def preset_config(preset: str) -> tuple[str, str, dict]:
    """(family, flavor, HF config dict) for FAMILY[/FLAVOR] or a PRESET_NAMES name; the flavor
    defaults to debugmodel."""
    family, _, flavor = PRESET_NAMES.get(preset, preset).partition("/")
    flavor = flavor or "debugmodel"
    known = NATIVE_FAMILIES
    if family not in known:
        raise BadInput(
            f"unknown family '{family}' in --preset; families: {', '.join(known)}; presets: {', '.join(PRESET_NAMES)}"
        )
    try:
        args = resolve_args(family, flavor)
    except ConfigError as e:
        raise BadInput(f"--preset {preset}: {e}") from None
    return family, flavor, get_family(family).adapter.hf_config(args)


def read_weights(path: Path | None) -> Path | None:
    if path is None:
        return None
    path = Path(path).resolve()
    if not path.is_dir():
        raise BadInput(f"--weights {path} is not a folder")
    if not any(path.glob("*.safetensors")):
        raise BadInput(f"--weights {path} holds no *.safetensors files")
    return path


# ---- deciding ----------------------------------------------------------------------------
def closest_family(cfg: dict) -> tuple[str, str]:
    """(family, why) for a config no family claims: the one whose adapter reads most of its keys."""
    scores = {}
    for name in FAMILY_NAMES:
        try:
            _, used = get_family(name).adapter.args_from_hf(cfg)
            scores[name] = len(used)
        except (AdapterError, TypeError, ValueError):
            scores[name] = -1  # cannot read it at all: the worst match
    best = max(FAMILY_NAMES, key=lambda n: scores[n])  # max keeps the first on ties
    if scores[best] < 0:
        return best, "no family's adapter can read this config; starting from the first one"
    return best, f"its adapter reads {scores[best]} of the config's {len(cfg)} keys, the most of any family"


def _canonical_keys(family: str) -> set[str]:
    """Keys the family reads from its own exported config: what it would consume of a
    config it cannot parse (used to list the rest when its adapter rejects a config)."""
    fam = get_family(family)
    args = fam.flavors.get("debugmodel") or next(iter(fam.flavors.values()))
    return fam.adapter.args_from_hf(fam.adapter.hf_config(args))[1]


def _hint(cfg: dict, key: str) -> str:
    """What a port does with an unconsumed key: the concrete change for a key of a known pattern
    (arch_semantics.key_change, from its value), else KEY_HINTS' pointer by the key's name."""
    return sem.key_change(cfg, key) or next(
        (h for sub, h in KEY_HINTS if sub in key),
        "decide whether it changes the computation; implement it here or confirm it is irrelevant to training",
    )


def plan_workspace(
    name: str,
    base: Path,
    *,
    hf_config: Path | None = None,
    preset: str | None = None,
    weights: Path | None = None,
    path: str | None = None,
    device: str = "auto",
    force: bool = False,
    threads: tuple[int, str] | None = None,
    not_causal: Callable[[dict[str, Any]], str | None] | None = None,
) -> Plan:
    """Validate the inputs and decide the workspace; raises BadInput, writes nothing.

    `threads` = (count, why) pins the recipe's CPU intra-op threads, with the reason as
    the recipe comment (the demo uses it); None leaves torch's default. `not_causal`: the
    transformers path's probe of whether the config's class is a causal LM at all
    (onboard.compat.causal.not_causal_reason, which new-model passes: compat sits above the
    workspace layer); None: the caller has checked (compat's climb probes it first).
    """
    validate_name(name)
    if (hf_config is None) == (preset is None):
        raise BadInput("give exactly one of --hf-config PATH or --preset FAMILY[/FLAVOR]")
    if path is not None and path not in PATHS:
        raise BadInput(f"--path must be one of {', '.join(PATHS)}, got '{path}'")
    if device not in DEVICES:
        raise BadInput(f"--device must be one of {', '.join(DEVICES)}, got '{device}'")
    root = workspaces_dir(base) / name
    if root.exists() and not force:
        raise exists_refusal(root)
    weights_dir = read_weights(weights)

    flavor = None
    if preset is not None:
        family, flavor, cfg = preset_config(preset)
        text = json.dumps(cfg, indent=2) + "\n"
        source = f"--preset {family}/{flavor}"
    else:
        cfg, text = read_hf_config_text(hf_config, require_model_type=True)  # ConfigError: exit 2, as BadInput
        fam = family_for_hf_model_type(cfg["model_type"])
        family = fam.name if fam else None
        source = f"--hf-config {Path(hf_config).resolve()}"
    model_type = cfg["model_type"]
    where = Path(hf_config).resolve() if hf_config is not None else f"--preset {preset}"
    # An unknown model_type is an error unless a path is asked for: silently starting a
    # port would turn a typo in model_type into an hour of porting.
    path_kind = path or "native"
    if family is None and path_kind == "native":
        raise BadInput(
            f"unknown model_type '{model_type}': no titan_core family runs it (families: {families_line()}); "
            "two paths can: --path transformers runs transformers' own class through titan_core, "
            "--path port starts a native port from the closest family"
        )
    upstream = get_family(family).kind.upstream if family is not None else "transformers"
    if upstream != "transformers" and path_kind != "native":  # both paths start from a transformers class
        raise BadInput(
            f"--path {path_kind} is for causal LMs; a {model_type} model (a {upstream} class) runs on the {family} "
            "family (leave --path out)"
        )
    if path_kind == "transformers":
        plan = _plan_transformers(
            name, root, cfg, text, model_type=model_type, source=source, device=device, weights=weights_dir,
            threads=threads, where=where, not_causal=not_causal,
        )  # fmt: skip
        plan.files = render(plan)
        return plan
    todos, adapter_todos, closest_reason = [], [], ""
    if family is None:
        family, closest_reason = closest_family(cfg)
        todos.append(
            f"model_type '{model_type}' has no titan_core family; this port starts from {family} ({closest_reason})"
        )
    adapter = get_family(family).adapter
    args_summary = ""
    try:
        args, _ = adapter.args_from_hf(cfg)
        unconsumed = adapter.unconsumed_keys(cfg)
        args_summary = args.describe()
    except ArchitectureError as e:
        # no model of any path can be built from it (a zero, a fraction, heads that do not
        # divide): refused on the port path too, where another adapter error is a TODO
        raise BadInput(f"{where}: {e}") from None
    except (AdapterError, TypeError, ValueError) as e:
        if upstream != "transformers":  # no other path runs it: nothing else to advise
            raise BadInput(f"{where}: {e}") from None
        if path_kind == "native":
            raise BadInput(
                f"config.json of model_type '{model_type}' does not fit the {family} family ({e}); "
                "use --path port to port it, or --path transformers to run transformers' own class"
            ) from None
        unconsumed = sorted(k for k in cfg if k not in NEUTRAL_KEYS and k not in _canonical_keys(family))
        adapter_todos.append(f"the {family} adapter cannot read config.json: {e}; override args_from_hf below")
        todos.append(adapter_todos[-1])
    arch_differences, arch_note, upstream_tensors = [], None, []
    if path_kind == "port":
        diff = architecture_differences(cfg, family)
        arch_differences, arch_note = diff.differences, diff.note
        upstream_tensors = [dataclasses.asdict(t) for t in diff.tensors]
        adapter_todos += diff.adapter_lines  # the tensors adapter.py must name (also model.py's, as architecture:)
        todos += [f"architecture: {d}" for d in arch_differences]
        todos += [f"`{k}` = {json.dumps(cfg[k], sort_keys=True)} is not read by the {family} family: {_hint(cfg, k)}"
                  for k in unconsumed]
    plan = Plan(
        name=name, root=root, family=family, flavor=flavor, path_kind=path_kind, model_type=model_type,
        source=source, device=device, hf_config=cfg, hf_config_text=text, weights=weights_dir,
        unconsumed=unconsumed, todos=todos, adapter_todos=adapter_todos, closest_reason=closest_reason,
        arch_differences=arch_differences, arch_note=arch_note, upstream_tensors=upstream_tensors,
        args_summary=args_summary, threads=threads,
    )  # fmt: skip
    plan.files = render(plan)
    return plan


def _plan_transformers(name, root, cfg, text, *, model_type, source, device, weights, threads, where,
                       not_causal=None) -> Plan:
    """The transformers path: transformers' class for the config, run by titan_core's
    `transformers` family; BadInput when transformers is absent or cannot build a causal LM from it."""
    try:
        args, _ = TransformersAdapter().args_from_hf(cfg)
        text_cfg = config_object(cfg).get_text_config()
    except ConfigError as e:
        raise BadInput(f"--path transformers: {e}") from None
    except ArchitectureError as e:  # a value no model can be built from: the line names the field
        raise BadInput(f"{where}: {e}") from None
    except AdapterError as e:
        raise BadInput(f"{where}: --path transformers cannot run it: {e}") from None
    # an encoder, a permutation LM: measured on a tiny config of its class
    why = not_causal(cfg) if not_causal else None
    if why:
        raise BadInput(f"{where}: --path transformers trains causal LMs; {model_type} is {why}")
    cap = getattr(text_cfg, "attn_logit_softcapping", None)
    attention, why = "", ""
    if cap:
        attention = "naive"
        why = f"{model_type} soft-caps attention scores at {cap}; sdpa cannot, the naive reference does"
    return Plan(
        name=name, root=root, family="transformers", flavor=None, path_kind="transformers", model_type=model_type,
        source=source, device=device, hf_config=cfg, hf_config_text=text, weights=weights, unconsumed=[],
        args_summary=args.describe(), attention=attention, attention_why=why, threads=threads,
    )  # fmt: skip


# ---- writing ---------------------------------------------------------------------------
def write_workspace(plan: Plan, *, force: bool = False) -> Path:
    """Write the rendered files to a temp folder beside the destination, then rename it into place.

    All of it under the per-name lock (`name_lock`), after recovering what a crashed
    new-model of the same NAME left (`recover_locked`; workspace.py lists what a crash
    leaves at each instant and what recovery does with it). ladder.json is written last,
    so a temp folder that holds one is complete.
    """
    parent = plan.root.parent
    created = not parent.exists()
    parent.mkdir(parents=True, exist_ok=True)
    try:
        with name_lock(parent, plan.name):
            recover_locked(parent, plan.name)
            _write_locked(plan, force=force)
    except BaseException:
        if created:  # a failed first new-model leaves no empty onboarding/ behind
            try:
                parent.rmdir()
            except OSError:
                pass
        raise
    return plan.root


def _write_locked(plan: Plan, *, force: bool) -> None:
    parent = plan.root.parent
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(plan.name, "new"), dir=parent))
    try:
        os.chmod(tmp, default_mode("dir"))
        for fname, text in plan.files.items():
            _write_synced(tmp / fname, text)
        Ledger.new(tmp / LEDGER, plan.meta()).save()  # last: it marks the folder complete
        fsync_dir(tmp)
        if plan.root.exists():
            if not force:
                raise exists_refusal(plan.root)
            plan.backup = _replace(plan.root, tmp)
        else:
            os.rename(tmp, plan.root)
            fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already once renamed into place
        raise


def _write_synced(path: Path, text: str) -> None:
    # on disk before ladder.json is, so "holds ladder.json" means complete after a power cut too
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _replace(root: Path, new: Path) -> Path:
    """Swap a forced workspace in, under the old one's lock so no next-step is mid-run; returns
    where the old one is kept. It is renamed aside, the new one renamed in (the commit point),
    then the old one renamed to `NAME.backup-<time>` (never deleted: a porter's edits, the
    evidence). A failure between the two renames puts the old one back; a crash there or
    after the commit point leaves it to recovery (onboard/workspace/layout.py).
    """
    lock = WorkspaceLock(root).acquire()
    old = root.parent / f"{temp_prefix(root.name, 'old')}{secrets.token_hex(4)}"
    try:
        os.rename(root, old)
        lock.follow(old)  # the lock file moved with its folder
        try:
            os.rename(new, root)
        except BaseException:
            os.rename(old, root)
            lock.follow(root)
            raise
        fsync_dir(root.parent)
    finally:
        lock.release()
    return backup_aside(old, named_for=root)
