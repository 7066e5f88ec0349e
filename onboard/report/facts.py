"""What the report's summary and pictures show, computed from the ledger alone.

Pure functions of the rungs' latest entries (and the final recipe): the drawing
(onboard/report/pictures.py) only draws what these return, so a test checks the numbers
against the ledger and the drawn artists against these.

The timed runs (`waterfall_bars`: the summary's step times and the table of each rung's own run
beside the waterfall; the waterfall itself draws onboard.report.steps, the interleaved timings).
One bar per rung, in ladder order (onboard.ladder.table.RUNGS), for each rung whose latest entry
is passed or stale (a failed or invalid attempt kept nothing):

- a rung that timed a train step (`measurements.step_time_median_s`) gets a bar of exactly
  that step time and its `tokens_per_s`, whatever it kept: the label says what it ran,
  whether the ladder kept it, and how it was timed (processes, batch);
- a rung that changes the recipe without timing a train step (kernels: each kernel is
  timed as the model's forward + backward against the path it replaces) gets a *carried*
  bar: the numbers of the bar that stands for the recipe so far, named as carried;
- a rung with neither (parity: correctness only) gets no bar;
- the last bar, `final recipe`, repeats the numbers of the latest one-process bar whose run
  was the final recipe (its `measurements.flags`, `--key=value` strings, hold in the recipe,
  and every recipe edit recorded after the run started is one of its flags). When no run
  was (a kernel was kept after the last train step was timed), it carries the bar of the
  recipe so far and says the final recipe was not timed as a whole.

A bar is like-for-like with the baseline when it timed a whole train step in one process on
the baseline's batch (`comparable` and `same_batch`); others (simple_fsdp on 2 processes
sharing the machine's cores; a larger batch, whose tokens/s still compare) are marked
in the table and listed in the summary. No number is derived: every number is one recorded
measurement, and `source` names the rung it was recorded by.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titan_core.config.loader import MISSING, ConfigError, apply_overrides, from_dict, get_key, to_dict

from onboard.ladder.decision import KEPT, decision_records
from onboard.ladder.gates import measured_decision
from onboard.workspace.ledger import Status, parse_iso
from titan_core.measure.metrics import read_metrics

TIMED = (Status.PASSED, Status.STALE)
"""States whose entries stand for what the ladder holds; stale ones are marked on their bar."""
BASELINE = "eager"
TRAIN_STEP = "train step"
OWN_RUN_RUNGS = ("simple_fsdp", "compile", "graph_trainer")
"""Rungs whose bar in the table of timed runs says what their own run was, whatever they decided."""


def decision_name(d: dict) -> str:
    """A Decision in a few words: the lever and the change, e.g. "training.batch_size 4 -> 8"."""
    return f"{d['lever']} {d['holder']} -> {d['candidate']}"


@dataclass(frozen=True)
class Record:
    """One rung's latest ledger entry, with the state `ladder_states` gave it."""

    rung: str
    status: str
    entry: dict

    @property
    def m(self) -> dict:
        return self.entry.get("measurements") or {}

    @property
    def details(self) -> dict:
        return self.entry.get("details") or {}

    @property
    def decisions(self) -> list[dict]:
        """The rung's Decision records (onboard.ladder.decision, `details.decisions`); [] for a rung
        that recorded none, or an older ledger's other shape under that key. An interval that measured
        nothing is dropped with its speed-up (gates.measured_decision): the report says not measured."""
        return [measured_decision(d) for d in decision_records(self.details)]

    @property
    def field_choices(self) -> dict:
        """The kernels rung's per-field choices (an older ledger kept them under `decisions`)."""
        old = self.details.get("decisions")
        return self.details.get("field_choices") or (old if isinstance(old, dict) else {})


def records(states) -> list[Record]:
    """The latest entry of every rung that has one, in ladder order."""
    return [Record(s.rung, s.status, s.latest) for s in states if s.latest is not None]


@dataclass(frozen=True)
class Bar:
    label: str
    """Under the bar: the rung, or `final recipe`."""
    rung: str
    change: str
    """What the rung ran or kept, one line."""
    kept: bool | None
    """Whether the ladder kept this rung's change; None: the baseline, or not decided yet."""
    step_time_s: float | None
    tokens_per_s: float | None
    source: str
    """The rung whose recorded measurements these numbers are."""
    measured: bool
    """True: `source` timed this bar's own configuration; False: carried from the recipe so far."""
    setting: str
    """How it was timed: processes, batch, what step."""
    comparable: bool
    """Timed like the baseline: a whole train step in one process (its tokens/s compare)."""
    same_batch: bool
    """Also on the baseline's batch (its step time compares too)."""
    status: str
    mfu: float | None = None
    peak_mem_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _flags(m: dict) -> list[str]:
    flags = m.get("flags") or []
    return flags.split() if isinstance(flags, str) else list(flags)


def _batch(rec: Record) -> tuple[int, int | None] | None:
    """(rows, tokens per row) of the whole step, where the entry recorded them."""
    m, d = rec.m, rec.details
    rows = m.get("global_batch_size", m.get("batch_size", d.get("batch_size")))
    if not isinstance(rows, int):
        return None
    seq = m.get("seq_len", d.get("seq_len"))
    return rows, seq if isinstance(seq, int) else None


def _setting(rec: Record, baseline: Record) -> tuple[str, bool, bool]:
    """(how the rung timed its bar, one process like the baseline, the baseline's batch)."""
    world = rec.m.get("world_size", rec.details.get("world_size", 1))
    batch, base = _batch(rec), _batch(baseline)
    if batch is None:
        # compile and graph_trainer time the recipe's batch, which no rung before them changes
        text, same_batch = "the recipe's batch", True
    else:
        text = f"batch {batch[0]}" + (f" x {batch[1]}" if batch[1] else "")
        if world != 1 and isinstance(rec.m.get("batch_size_per_rank"), int):
            text += f" ({rec.m['batch_size_per_rank']} per process)"
        same_batch = base is None or (batch[0] == base[0] and batch[1] in (None, base[1]))
    return f"{world} process{'es' if world != 1 else ''}, {text}, {TRAIN_STEP}", world == 1, same_batch


def recipe_mode(recs: list[Record]) -> str | None:
    """The execution mode the recipe trains in, as the last rung that recorded it says."""
    modes = [r.m["execution_mode"] for r in recs if r.m.get("execution_mode")]
    return modes[-1] if modes else None


def _kernels_change(rec: Record) -> tuple[str, bool]:
    decisions = rec.field_choices
    kept = [f"kernels.{f}={d['value']}" for f, d in decisions.items() if d.get("edit")]
    if kept:
        return "kept " + ", ".join(kept), True
    tried = [
        k.removesuffix("_timing").replace("_", "=", 1) + f" {v}"
        for k, v in rec.m.items()
        if k.endswith("_timing") and not rec.m.get(k.removesuffix("_timing") + "_kept")
    ]
    held = [f"{f}={d['value']}" for f, d in decisions.items() if "contests" in d]
    text = "no new kernel kept" + (f" (recipe holds {', '.join(held)})" if held else "")
    return text + (f"; not kept: {', '.join(tried)}" if tried else ""), False


def _change(rec: Record, mode: str | None) -> tuple[str, bool | None]:
    """(what the rung ran or kept, whether the ladder kept it) from its own record."""
    m = rec.m
    if rec.rung == BASELINE:
        return f"baseline: eager, {rec.details.get('dtype', 'the recipe dtype')}", None
    if rec.rung == "simple_fsdp":
        return (
            f"SimpleFSDP fp32 on {m.get('world_size')} processes; kept {m.get('data_parallel_choice')}, "
            f"params {m.get('mixed_precision_choice')}"
        ), True
    if rec.rung in ("compile", "graph_trainer"):
        what = (
            "per-block torch.compile"
            if rec.rung == "compile"
            else f"whole step as one graph (compile {m.get('graph_compile')}, memory policy {m.get('memory_policy')})"
        )
        if mode is None:
            return f"{what}; execution mode not chosen yet", None
        return f"{what}; interleaved timing chose {mode} for the recipe", mode == rec.rung
    if rec.decisions and rec.rung not in OWN_RUN_RUNGS:
        kept = [decision_name(d) for d in rec.decisions if d["verdict"] == KEPT]
        return ("kept " + ", ".join(kept), True) if kept else (f"no change kept ({len(rec.decisions)} decided)", False)
    if rec.rung == "kernels":
        return _kernels_change(rec)
    edits = (rec.entry.get("recipe_edit") or {}).get("edits") or []
    if edits:
        return "kept " + ", ".join(f"{e['key']}={e['value']}" for e in edits), True
    return str(m.get("change") or "no recipe change kept"), False


def _resolved(recipe: dict):
    """The final recipe with every default filled in (the one config reader), or None."""
    try:
        return from_dict(recipe)
    except (ConfigError, TypeError, ValueError):
        return None


def _is_final(rec: Record, attempts: list[dict], final) -> bool:
    """Whether the rung's timed run was the final recipe: its flags hold there, and every
    recipe edit recorded after the run started was one of its flags, with that value."""
    if final is None:
        return False
    flags = _flags(rec.m)
    try:
        with_flags = to_dict(apply_overrides(copy.deepcopy(final), flags))
    except (ConfigError, TypeError, ValueError):
        return False
    if with_flags != to_dict(final):
        return False
    flagged = {f.removeprefix("--").split("=", 1)[0] for f in flags}
    started = parse_iso(rec.entry["started"])
    for e in attempts:
        if not e.get("ended") or parse_iso(e["ended"]) < started:
            continue  # an edit made before this run: the run had it
        for edit in (e.get("recipe_edit") or {}).get("edits") or []:
            if edit["key"] not in flagged or get_key(with_flags, edit["key"], MISSING) != edit["value"]:
                return False
    return True


def _float(value) -> float:
    """A curve point; the ledger stores a non-finite float as its repr ("nan"), anything else is nan."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def waterfall_bars(recs: list[Record], attempts: list[dict], recipe: dict) -> list[Bar]:
    """The waterfall's bars (module docstring); [] when there is no timed eager baseline.

    `attempts`: every ledger entry (for the recipe edits and their times); `recipe`: the
    final recipe.toml as a dict."""
    timed = [r for r in recs if r.status in TIMED]
    baseline = next((r for r in timed if r.rung == BASELINE and _num(r.m.get("step_time_median_s"))), None)
    if baseline is None:
        return []
    mode, final = recipe_mode(recs), _resolved(recipe)
    bars: list[Bar] = []
    current = final_bar = None  # like-for-like bars: the recipe so far; the final recipe's run
    for rec in timed:
        change, kept = _change(rec, mode)
        label = rec.rung + (" (stale)" if rec.status == Status.STALE else "")
        step = _num(rec.m.get("step_time_median_s"))
        if step is not None:
            setting, comparable, same_batch = _setting(rec, baseline)
            bar = Bar(label, rec.rung, change, kept, step, _num(rec.m.get("tokens_per_s")), rec.rung, True,
                      setting, comparable, same_batch, rec.status, _num(rec.m.get("mfu")),
                      rec.m.get("peak_mem_bytes"))  # fmt: skip
            if comparable and (kept or rec is baseline):
                current = bar
            if comparable and _is_final(rec, attempts, final):
                final_bar = bar
        elif current is not None and (rec.entry.get("recipe_edit") or rec.details.get("decisions")):
            carried = f"not a train step: carries {current.source}'s"
            bar = dataclasses.replace(current, label=label, rung=rec.rung, change=change, kept=kept, measured=False,
                                      status=rec.status, setting=carried)  # fmt: skip
        else:
            continue  # correctness only (parity): nothing timed, nothing kept for speed
        bars.append(bar)
    if final_bar is not None:
        bars.append(dataclasses.replace(final_bar, label="final recipe", rung="final", kept=None,
                                        change=f"the recipe as the {final_bar.source} rung timed it"))  # fmt: skip
    elif current is not None:
        bars.append(dataclasses.replace(current, label="final recipe", rung="final", kept=None, measured=False,
                                        change=f"not timed as a whole; carries {current.source}'s"))  # fmt: skip
    return bars


def speedup(bars: list[Bar]) -> dict[str, Any] | None:
    """Baseline -> final numbers for the summary, all of them recorded; None without a waterfall."""
    if not bars:
        return None
    base, final = bars[0], bars[-1]
    out = {"baseline": base.as_dict(), "final": final.as_dict()}
    if base.step_time_s and final.step_time_s:
        out["speedup"] = base.step_time_s / final.step_time_s
    if base.tokens_per_s and final.tokens_per_s:
        out["tokens_per_s_ratio"] = final.tokens_per_s / base.tokens_per_s
    out["not_like_for_like"] = [b.as_dict() for b in bars if b.measured and not (b.comparable and b.same_batch)]
    return out


# ---- loss curves ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Series:
    rung: str
    key: str
    """The details key the values are: `loss_curve`, `bf16_loss_curve`, ..."""
    label: str
    values: list[float]
    baseline: bool = False


def loss_series(recs: list[Record]) -> list[Series]:
    """Every recorded loss curve (any `*loss_curve` in a rung's details), the eager one first."""
    out = []
    for rec in recs:
        for key, values in rec.details.items():
            if not key.endswith("loss_curve") or not isinstance(values, list) or not values:
                continue
            variant = key.removesuffix("loss_curve").rstrip("_").replace("_", " ")
            status = "" if rec.status == Status.PASSED else f", {rec.status}"
            label = f"{rec.rung}{' ' + variant if variant else ''} ({len(values)} steps{status})"
            base = rec.rung == BASELINE and key == "loss_curve"
            out.append(Series(rec.rung, key, label, [_float(v) for v in values], base))
    return sorted(out, key=lambda s: not s.baseline)


@dataclass(frozen=True)
class ValSeries:
    """The held-out loss of one run, at the steps it was measured (titan_core/training/validate.py)."""

    rung: str
    run: str
    """Which of the rung's runs: "" for its own (`details.metrics_file`), else the name its details give it."""
    label: str
    steps: list[int]
    values: list[float]
    """`val_loss` of each step in `steps` (nan where it was not finite)."""
    file: str
    """The metrics file it was read from, as the ledger names it (relative: to the workspace)."""

    @property
    def gid(self) -> str:
        """The drawn line's id in the loss picture: `val_loss:<rung>` (`val_loss:<rung>:<run>` for another run)."""
        return f"val_loss:{self.rung}" + (f":{self.run}" if self.run else "")


def metrics_files(rec: Record) -> list[tuple[str, str]]:
    """(run, file) of every metrics file the rung's details name: `metrics_file` (its own run, ""),
    `runs.<name>.metrics_file` (simple_fsdp) and `metrics_files.<name>` (graph_trainer)."""
    d = rec.details
    out = [("", d["metrics_file"])] if isinstance(d.get("metrics_file"), str) else []
    runs = d.get("runs") if isinstance(d.get("runs"), dict) else {}
    for name, run in runs.items():
        if isinstance(run, dict) and isinstance(run.get("metrics_file"), str):
            out.append((name, run["metrics_file"]))
    named = d.get("metrics_files") if isinstance(d.get("metrics_files"), dict) else {}
    out += [(name, f) for name, f in named.items() if isinstance(f, str)]
    return out


def val_loss_series(recs: list[Record], root: Path) -> list[ValSeries]:
    """The validation loss of every run whose metrics file has validation rows (`val_loss`), in
    ladder order; `root`: the workspace, which relative file names are under.

    The metrics files are read by titan_core's one reader (read_metrics: one current row per step,
    non-finite floats restored). A file that is gone (a run folder deleted) or unreadable gives no
    series: the training curve beside it comes from the ledger and is drawn all the same."""
    out = []
    for rec in recs:
        for run, file in metrics_files(rec):
            path = Path(file) if Path(file).is_absolute() else Path(root) / file
            try:
                rows = [r for r in read_metrics(path) if "val_loss" in r]
            except (OSError, ValueError):
                continue
            if not rows:
                continue
            status = "" if rec.status == Status.PASSED else f", {rec.status}"
            label = f"{rec.rung}{' ' + run if run else ''} validation ({len(rows)} evals{status})"
            values = [_float(r["val_loss"]) for r in rows]
            out.append(ValSeries(rec.rung, run, label, [r["step"] for r in rows], values, file))
    return out


# ---- parity ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParityPoints:
    modules: list[str]
    rel_l2: list[float | None]
    """Per module in native execution order; None where it could not be compared (a note says why)."""
    tolerance: float
    first: str | None
    """The module localisation blamed, if any."""
    status: str
    pass_name: str | None = None
    """Which comparison the table is of (`seeded` weights, the `features` pass)."""


def parity_points(results: dict, status: str) -> ParityPoints | None:
    """The per-module error along the model from a parity results.json; None without a table."""
    loc = results.get("localisation") or {}
    table = loc.get("table") or []
    if not table or loc.get("tolerance_rel_l2") is None:
        return None
    # None: not compared (the row's note says why); results.json keeps inf and nan as numbers
    rel = [float(r["rel_l2"]) if isinstance(r.get("rel_l2"), (int, float)) else None for r in table]
    first = (loc.get("first") or {}).get("native")
    modules = [r["native"] for r in table]
    return ParityPoints(modules, rel, float(loc["tolerance_rel_l2"]), first, status, loc.get("pass"))
