"""`new-model`'s twin: decide it (onboard/sizing/fit.py's rule), derive it (onboard/sizing/twin/derive.py),
and put it into the planned workspace before anything is written.

With a twin the workspace holds twin.json next to config.json, recipe.toml's `[model]
hf_config` names twin.json (so the one function that builds the workspace's model, the
recipe's model section through the adapter, builds the twin for every rung, parity's
upstream class included), README.md carries the table of what shrank, and ladder.json's
workspace record keeps the table and the reason.
"""

from __future__ import annotations

from rich.table import Table

from onboard.sanitize import markup_safe
from onboard.sizing.fit import TwinChoice, choose_twin
from onboard.workspace.render import render
from titan_core.models import get_family

MODES = ("auto", "on", "off")


def apply_twin(plan, *, mode: str = "auto", layers: int | None = None, width: int | None = None) -> TwinChoice:
    """Decide the twin of `plan` (an onboard.workspace.scaffold.Plan), and when there is one, re-render
    the plan's files with it. BadInput (nothing written yet) for a knob out of range."""
    adapter = get_family(plan.family).adapter
    choice = choose_twin(
        plan.hf_config, adapter, recipe_text=plan.files["recipe.toml"], mode=mode, layers=layers, width=width
    )
    if choice.twin is None:
        return choice
    plan.twin = {
        "config": choice.twin.config,
        "rows": choice.twin.rows_json(),
        "summary": choice.twin.summary(),
        "reason": choice.reason,
    }
    plan.files = render(plan)
    return choice


def twin_table(twin):
    """The twin's table for the terminal: field, full, twin, why (rich)."""
    table = Table(title=markup_safe(twin.summary()))
    for col in ("field", "full", "twin", "why"):
        table.add_column(col)
    for row in twin.rows:  # cells quote the config (a layer pattern's names): shown, never read as markup
        table.add_row(*(markup_safe(v) for v in (row.field, row.full, row.twin, row.why)))
    return table
