"""`onboard compat`: which transformers architectures run on the transformers path, rung by rung.

Per `model_type` a short probe: a tiny config built with transformers' own config class
(2 layers, hidden 64, vocab 256; experts and windows shrunk where the class has them), a
workspace scaffolded by `new-model --path transformers` in a temporary folder, then the
product's own rungs on it, judged by their own checklists:

    eager          onboard/rungs/eager_rung.py      (titan_core's trainer)
    parity         onboard/rungs/parity_rung.py     (the workspace's test_parity.py: wrapped vs plain class, fp32)
    compile        onboard/rungs/compile_rung.py    (per-block compile, zero graph breaks, titan_core.compile explain)
    graph_trainer  onboard/rungs/graph_trainer_rung.py (whole-step capture, bit-identical to eager)
    fused_loss     titan_core.kernels.compare_kernel for kernels.loss = fused_ce, the kernels
                   checklist's tolerances (the kernels rung's own comparison, without its timing)

Each probe runs in its own process with a time limit, so one architecture's crash, hang or
memory blow-up is that row's failing cell with a one-line reason. A config the probe cannot
build small (a composite multimodal config, a class that refuses the sizes) is "not probed",
with why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

RUNGS = ("eager", "parity", "compile", "graph_trainer", "fused_loss")
TIMEOUT_S = 300
"""Wall-clock limit of one architecture's probe (all its rungs)."""
MAX_PARAMS = 20_000_000
"""A tiny config still above this has sizes the probe does not know how to shrink: not probed."""
SIZES = {
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 512, "head_dim": 16,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
}  # fmt: skip
"""Config fields set when the class has them (and they are set in its defaults)."""
SLIDING_WINDOW = 32
"""Below the probe's seq_len (64), so a windowed model really masks."""
SEQ_LEN = 64
REASON_CHARS = 200


def one_line(text: str) -> str:
    """`text` as one table-safe line of at most REASON_CHARS characters."""
    line = " ".join(str(text).split()).replace("|", "/")
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 3] + "..."


class NotProbed(Exception):
    """The probe cannot build a tiny config of this model_type; the message says why."""


def causal_lm_types() -> list[str]:
    """Every model_type transformers maps to a causal-LM class, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_types(model_types: list[str]) -> list[str]:
    """`model_types` if transformers has a causal-LM class for each; BadInput naming the first that has none."""
    from onboard.errors import BadInput
    from titan_core.models.transformers.hf_classes import require_transformers

    require_transformers()
    known = causal_lm_types()
    for mt in model_types:
        if mt not in known:
            close = [k for k in known if mt.lower() in k][:5]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise BadInput(f"MODEL_TYPE '{mt}': transformers has no causal-LM class of that model_type{hint}")
    return list(dict.fromkeys(model_types))


def tiny_config(model_type: str) -> dict[str, Any]:
    """The config dict of a tiny `model_type`, from its transformers config class; NotProbed if it cannot be."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise NotProbed(f"transformers has no config class for '{model_type}'")
    cls = CONFIG_MAPPING[model_type]
    try:
        default = cls()
    except Exception as e:  # noqa: BLE001 -- any refusal of the class is the reason
        raise NotProbed(f"{cls.__name__}() cannot be built offline: {type(e).__name__}: {e}") from None
    if default.get_text_config() is not default:
        raise NotProbed(f"{cls.__name__} is composite (a text config inside); the probe builds text-only configs")
    kw = {k: v for k, v in SIZES.items() if getattr(default, k, None) is not None}
    if getattr(default, "sliding_window", None):
        kw["sliding_window"] = SLIDING_WINDOW
    # special tokens of the full vocabulary would index past the tiny one; dropout off (GPT-2's
    # attn_pdrop / resid_pdrop / embd_pdrop default to 0.1): pretraining's usual setting, and
    # the probe asks whether the path runs the architecture, not whether kernels do dropout
    for k, v in default.to_dict().items():
        if ("dropout" in k or k.endswith("pdrop")) and isinstance(v, float) and v > 0:
            kw[k] = 0.0
        if k.endswith("_token_id") and isinstance(v, int) and v >= SIZES["vocab_size"]:
            kw[k] = SIZES["vocab_size"] - 1
        elif k.endswith("_token_id") and isinstance(v, list):
            kw[k] = [t if t < SIZES["vocab_size"] else SIZES["vocab_size"] - 1 for t in v]
    try:
        cfg = cls(**kw).to_dict()
    except Exception as e:  # noqa: BLE001
        raise NotProbed(f"{cls.__name__} refuses the tiny sizes: {type(e).__name__}: {e}") from None
    cfg["model_type"] = model_type
    return cfg


def _gate_reason(criteria: list[dict]) -> str | None:
    """The first failing criterion as `name: value (comparator threshold)`, None when all pass."""
    bad = next((c for c in criteria if not c["ok"]), None)
    if bad is None:
        return None
    value, thr = bad["value"], bad["threshold"]
    if bad["comparator"] == "is_true" or value is None:
        return f"{bad['name']}: {bad['hint']}"
    return f"{bad['name']}: {value!r} (needs {bad['comparator']} {thr!r})"


def _why_not(result, m: dict) -> str:
    """A more telling reason than the criterion where the rung measured one."""
    for key in ("capture_error", "first_break", "first_host_sync", "error"):
        if m.get(key):
            return f"{key}: {m[key]}"
    err = (result.details or {}).get("error") if result is not None else None
    return f"{err}" if isinstance(err, str) else ""


def _run_rung(ws, rung: str, evidence: dict, log) -> dict:
    """One of the product's rungs on `ws`, judged by its checklist as the engine judges it."""
    import importlib

    from onboard.engine.gates import evaluate, gate_passed
    from onboard.rungs.contract import RungContext
    from onboard.rungs.harness import checklist

    attempt = ws.runs_dir / rung / "attempt-1"
    attempt.mkdir(parents=True, exist_ok=True)
    ctx = RungContext(workspace=ws, attempt_dir=attempt, evidence=dict(evidence), log=log)
    try:
        result = importlib.import_module(f"onboard.rungs.{rung}_rung").run(ctx)
    except Exception as e:  # noqa: BLE001 -- the architecture's crash is this cell's reason
        return {"status": "fail", "reason": one_line(f"{type(e).__name__}: {e}")}
    if result.not_applicable:
        return {"status": "not_applicable", "reason": one_line(result.not_applicable)}
    criteria = evaluate(checklist(rung), result.measurements, evidence)
    if gate_passed(criteria):
        evidence[rung] = result.measurements
        return {"status": "pass", "reason": ""}
    why = _gate_reason(criteria)
    extra = _why_not(result, result.measurements)
    return {"status": "fail", "reason": one_line(f"{why}; {extra}" if extra and extra not in why else why)}


def _fused_loss(ws) -> dict:
    """kernels.loss = fused_ce against the plain loss, the kernels rung's comparison and tolerances."""
    from titan_core.config import load_config
    from onboard.rungs.kernel_compare import compare_kernel

    from onboard.rungs import harness
    from onboard.rungs.kernels_rung import compare_shape, tolerances, within_tolerance

    cfg = load_config(ws.recipe_path)
    batch, seq, _ = compare_shape(cfg.training.batch_size, cfg.training.seq_len)
    try:
        cmp = compare_kernel(family=cfg.model.family, args=harness.model_args(cfg), flag="kernels.loss=fused_ce",
                             batch=batch, seq_len=seq, base=cfg.kernels)  # fmt: skip
    except Exception as e:  # noqa: BLE001
        return {"status": "fail", "reason": one_line(f"{type(e).__name__}: {e}")}
    errors = {"loss_rel_err": cmp.loss_rel_err, "logits_rel_err": cmp.logits_rel_err,
              "max_grad_rel_err": cmp.max_grad_rel_err}  # fmt: skip
    if within_tolerance(errors, tolerances()):
        return {"status": "pass", "reason": ""}
    worst = ", ".join(f"{k} {v:.1e}" for k, v in errors.items())
    return {"status": "fail", "reason": one_line(f"fused_ce vs plain: {worst} (worst grad {cmp.worst_param})")}


def probe(model_type: str, work: Path, log: Callable[[str], None] = lambda s: None,
          save: Callable[[dict], None] = lambda row: None) -> dict:  # fmt: skip
    """{"cells": {rung: {"status", "reason"}}} or {"not_probed": why}, run in this process under `work`;
    `save(row)` after every cell, so a crash later keeps the cells already measured."""
    from onboard.errors import BadInput
    from onboard.workspace.scaffold import plan_workspace, write_workspace
    from onboard.workspace.layout import Workspace

    try:
        cfg = tiny_config(model_type)
    except NotProbed as e:
        return {"not_probed": one_line(str(e))}
    cfg_path = work / "config.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    name = "compat_" + "".join(c if c.isalnum() else "_" for c in model_type)
    cells: dict[str, dict] = {}
    try:
        plan = plan_workspace(name, work, hf_config=cfg_path, path="transformers", device="cpu")
    except BadInput as e:
        return {"not_probed": one_line(f"new-model --path transformers refuses it: {e}")}
    n_params = _param_count(plan)
    if isinstance(n_params, str):
        reason = one_line(f"the model cannot be built: {n_params}")
        return {"cells": {r: {"status": "fail", "reason": reason} for r in RUNGS}}
    if n_params > MAX_PARAMS:
        return {"not_probed": f"the tiny config still has {n_params / 1e6:.0f}M parameters (sizes the probe does not shrink)"}
    plan.files["recipe.toml"] = plan.files["recipe.toml"].replace("seq_len = 128", f"seq_len = {SEQ_LEN}")
    write_workspace(plan)
    ws = Workspace.load(work, name)
    evidence: dict = {}
    for rung in RUNGS[:-1]:
        if rung != "eager" and "eager" not in evidence:
            cells[rung] = {"status": "not_run", "reason": "the eager rung failed"}
            continue
        log(f"compat: {model_type}: {rung}")
        cells[rung] = _run_rung(ws, rung, evidence, log)
        save({"cells": cells, "params": n_params})
    log(f"compat: {model_type}: fused_loss")
    cells["fused_loss"] = _fused_loss(ws)
    return {"cells": cells, "params": n_params}


def _param_count(plan) -> int | str:
    """Parameters of the workspace's model, built on meta; the error line when it cannot be built."""
    import torch

    from titan_core.models.transformers import ADAPTER, TransformersCausalLM

    try:
        args = ADAPTER.args_from_hf(plan.hf_config)[0]
        with torch.device("meta"):
            model = TransformersCausalLM(args)
        return sum(p.numel() for p in model.parameters())
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def run_isolated(model_type: str, *, timeout: float = TIMEOUT_S) -> dict:
    """`probe` in a child process with a time limit; a crash or timeout fails every cell not yet written."""
    from titan_core.runtime.die_with_parent import with_parent_death_signal

    with tempfile.TemporaryDirectory(prefix="onboard-compat-") as tmp:
        out = Path(tmp) / "probe.json"
        cmd = with_parent_death_signal([sys.executable, "-m", "onboard.compat", model_type, str(out)])
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
            failure = None if proc.returncode == 0 else f"probe process exited {proc.returncode}: " + (
                (proc.stderr.strip().splitlines() or ["no output"])[-1])
        except subprocess.TimeoutExpired:
            failure = f"probe exceeded {timeout:.0f} s"
        seconds = round(time.monotonic() - start, 1)
        row = json.loads(out.read_text()) if out.is_file() else {"cells": {}}
    if failure and "not_probed" not in row:
        for rung in RUNGS:
            row["cells"].setdefault(rung, {"status": "fail", "reason": one_line(failure)})
    row["seconds"] = seconds
    return row


def sweep(model_types: list[str] | None = None, *, timeout: float = TIMEOUT_S,
          log: Callable[[str], None] = lambda s: None) -> dict:  # fmt: skip
    """The compat table: every probed model_type's cells, the not-probed ones with why, counts per rung."""
    import transformers

    types = model_types or causal_lm_types()
    rows, not_probed = {}, {}
    started = time.monotonic()
    for i, mt in enumerate(types, 1):
        log(f"compat: [{i}/{len(types)}] {mt}")
        row = run_isolated(mt, timeout=timeout)
        if "not_probed" in row:
            not_probed[mt] = row["not_probed"]
            log(f"compat: {mt}: not probed: {row['not_probed']}")
            continue
        rows[mt] = row
        log(f"compat: {mt}: " + ", ".join(f"{r} {row['cells'][r]['status']}" for r in RUNGS) + f" ({row['seconds']} s)")
    counts = {r: sum(row["cells"][r]["status"] == "pass" for row in rows.values()) for r in RUNGS}
    return {
        "transformers": transformers.__version__,
        "rungs": list(RUNGS),
        "requested": len(types),
        "probed": len(rows),
        "passing": counts,
        "all_pass": sum(all(row["cells"][r]["status"] == "pass" for r in RUNGS) for row in rows.values()),
        "rows": rows,
        "not_probed": not_probed,
        "seconds": round(time.monotonic() - started, 1),
    }


def render_markdown(result: dict, *, header: str = "") -> str:
    """The table as Markdown: counts, then model_type x rung, then the failing cells' reasons, then not probed."""
    rungs = result["rungs"]
    lines = [header.rstrip(), ""] if header else []
    lines += [
        f"transformers {result['transformers']}; {result['probed']} architectures probed of {result['requested']} "
        f"requested ({len(result['not_probed'])} not probed); every rung passing: {result['all_pass']}; "
        f"sweep {result['seconds']:.0f} s.",
        "",
    ]  # fmt: skip
    shipped = len(causal_lm_types())
    if result["requested"] < shipped:
        lines += [
            f"A subset: {result['requested']} of the {shipped} causal-LM model_types this transformers ships; "
            "`onboard compat` with no arguments (`make compat COMPAT_TYPES=`) probes them all, hours on 2 CPU cores.",
            "",
        ]
    lines += [
        "| rung | passing |", "|---|---|",
        *[f"| {r} | {result['passing'][r]} / {result['probed']} |" for r in rungs],
        "",
        "| model_type | " + " | ".join(rungs) + " |",
        "|---" * (len(rungs) + 1) + "|",
    ]  # fmt: skip
    reasons = []
    for mt, row in result["rows"].items():
        marks = []
        for r in rungs:
            cell = row["cells"][r]
            if cell["status"] == "pass":
                marks.append("pass")
            else:
                reasons.append(f"- **{mt} / {r}** ({cell['status']}): {cell['reason']}")
                marks.append(cell["status"].replace("_", " "))
        lines.append(f"| {mt} | " + " | ".join(marks) + " |")
    if reasons:
        lines += ["", "## Why not", "", *reasons]
    if result["not_probed"]:
        lines += ["", "## Not probed", "", *[f"- **{mt}**: {why}" for mt, why in result["not_probed"].items()]]
    return "\n".join(lines) + "\n"


def render_text(result: dict) -> str:
    """The table for a terminal: one row per model_type, a failing cell's reason under its row."""
    rungs = result["rungs"]
    width = max([len("model_type"), *map(len, result["rows"])])
    out = ["model_type".ljust(width) + "  " + "  ".join(r.ljust(13) for r in rungs)]
    for mt, row in result["rows"].items():
        out.append(mt.ljust(width) + "  " + "  ".join(row["cells"][r]["status"].ljust(13) for r in rungs))
        out += [f"{'':{width}}    {r}: {row['cells'][r]['reason']}" for r in rungs if row["cells"][r]["reason"]]
    out.append("passing: " + ", ".join(f"{r} {result['passing'][r]}/{result['probed']}" for r in rungs))
    out += [f"not probed: {mt}: {why}" for mt, why in result["not_probed"].items()]
    return "\n".join(out) + "\n"


def _child(argv: list[str]) -> int:
    """`python -m onboard.compat MODEL_TYPE OUT.json`: one probe, its row written to OUT.json."""
    model_type, out = argv
    work = Path(out).parent / "work"
    work.mkdir()
    def save(row: dict) -> None:
        Path(out).write_text(json.dumps(row))

    save(probe(model_type, work, log=lambda s: print(s, file=sys.stderr, flush=True), save=save))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
