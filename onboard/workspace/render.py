"""The workspace's files as text: new-model's templates rendered for one plan.

Kept apart from the scaffold's decisions; the template environment itself is templates.py, which
the ladder renders test_parity.py again with (onboard/ladder/template_check.py), loading no model.
"""

from __future__ import annotations

import json
from pathlib import Path

from onboard.sanitize import visible
from onboard.workspace.layout import HF_CONFIG, TWIN
from onboard.workspace.ledger import now_iso
from onboard.workspace.resources import data_dir
from onboard.workspace.templates import render_file, template_env
from titan_core.config.hf_config import config_upstream
from titan_core.models import get_family


def initial_hf(name: str, weights: Path | None, family: str, twin: dict | None, hf_config) -> tuple[str, str]:
    """(checkpoint.initial_hf for the recipe, or "" when it is left out; the recipe comment saying why).

    A workspace made with --weights trains from them: every rung runs the recipe, so every run
    starts from the checkpoint and the eager rung compares its step-1 loss with transformers'. Left
    out, with the reason in the recipe, where the recipe's model cannot load them: a twin (the gates
    train a smaller model than the checkpoint's; `onboard recipe` prints the full model's command),
    a model whose upstream is not transformers (initial_hf reads a causal LM's folder), a folder
    without the config.json that checkpoint.initial_hf reads.

    The arguments are the scaffold plan's fields of the same names (`twin`: its twin record, whose
    "config" is the twin's config; `hf_config`: the model's own)."""
    if weights is None:
        return "", ""
    where = str(weights)
    upstream = get_family(family).kind.upstream
    if upstream != "transformers":
        return "", (
            f"--weights {where} is for parity only: checkpoint.initial_hf loads causal language models, "
            f"not a {upstream} model's checkpoint"
        )
    if twin is not None and twin["config"] != hf_config:  # a twin of the full shape loads them
        return "", (
            f"no checkpoint.initial_hf: the gates train the twin ({TWIN}), which the full-size weights in {where} "
            f"do not fit; `onboard recipe {name}` prints the command that trains the full model from them"
        )
    if not (weights / HF_CONFIG).is_file():
        return "", (
            f"no checkpoint.initial_hf: {where} has no {HF_CONFIG}, which it reads (the model_type and the declared "
            f"dtype); copy the model's {HF_CONFIG} there and set checkpoint.initial_hf to train from these weights"
        )
    return where, (
        "--weights: every run starts from this checkpoint; the eager rung checks its step-1 loss against "
        "transformers' loss of it on the same batch"
    )


def _sample_len(plan) -> int:
    """The tokens of one sample of a model whose samples have a size of their own (flux's image
    tokens: the recipe's seq_len); 0 for a model of any length (a language model)."""
    if plan.path_kind != "native":  # a port's config is its own adapter's to read, and it is a causal LM's
        return 0
    cfg = plan.twin["config"] if plan.twin is not None else plan.hf_config  # the gates train the twin when there is one
    return get_family(plan.family).adapter.args_from_hf(cfg)[0].sample_spec().seq_len or 0


def render(plan) -> dict[str, str]:
    """{file name: text} of every file of the workspace except ladder.json, for a scaffold.Plan."""
    templates = data_dir("templates")
    env = template_env()
    adapter_cls = type(get_family(plan.family).adapter)
    has_test_parity = (templates / "test_parity.py.j2").is_file()
    start, start_why = initial_hf(plan.name, plan.weights, plan.family, plan.twin, plan.hf_config)
    context = dict(
        name=plan.name, family=plan.family, flavor=plan.flavor, path_kind=plan.path_kind,
        model_type=visible(plan.model_type), source=plan.source, device=plan.device,  # one line, whatever it holds
        weights_dir=str(plan.weights) if plan.weights else "", has_weights=plan.weights is not None,
        unconsumed=[(visible(k), json.dumps(plan.hf_config[k], sort_keys=True)) for k in plan.unconsumed], todos=plan.todos,
        adapter_todos=plan.adapter_todos, closest_reason=plan.closest_reason, args_summary=plan.args_summary,
        arch_differences=plan.arch_differences, arch_note=plan.arch_note or "",
        adapter_module=adapter_cls.__module__, adapter_class=adapter_cls.__qualname__,
        hf_architecture=visible((plan.hf_config.get("architectures") or [""])[0]), hf_config_file=HF_CONFIG,
        created=now_iso()[:19].replace("T", " "), has_test_parity=has_test_parity,
        threads=plan.threads[0] if plan.threads else 0, threads_why=plan.threads[1] if plan.threads else "",
        attention=plan.attention, attention_why=plan.attention_why,
        twin=plan.twin is not None, twin_file=TWIN, twin_rows=(plan.twin or {}).get("rows", []),
        twin_summary=(plan.twin or {}).get("summary", ""), twin_reason=(plan.twin or {}).get("reason", ""),
        diffusion=config_upstream(plan.hf_config) == "diffusers", image_tokens=_sample_len(plan),
        initial_hf=start, initial_hf_why=start_why,
    )  # fmt: skip
    names = ["recipe.toml", "adapter.py", "README.md"]
    if has_test_parity:
        names.append("test_parity.py")
    if plan.path_kind == "port":
        names.append("model.py")
    files = {n: render_file(env, n, context) for n in names}
    files[HF_CONFIG] = plan.hf_config_text
    if plan.twin is not None:
        files[TWIN] = json.dumps(plan.twin["config"], indent=2) + "\n"
    files[".gitignore"] = "runs/\n.onboard.lock\n"
    return files
