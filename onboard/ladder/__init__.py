"""The ladder, light half: what `status`, `list`, `recipe`, `report` of a finished ladder and `--help`
need, without torch and without importing any rung's module.

    table.py          the rung table: RUNGS, each rung's declaration (measurements, recipe keys read and
                      earned, not-applicable rule, evidence check) and RungSpec (how the engine reaches it)
    contract.py       the engine/rung contract: RungContext, RungResult, RecipeEdit, Measurements
    measurements/     each rung's declared Measurements (one module per rung, and the training runs' shared ones)
    gated_runs.py     what every training rung records of its runs (runs_whole)
    states.py         each rung's state from the ledger (pending, passed, stale, invalid, ...)
    gates.py          checklist criteria and their evaluation
    evidence.py       the re-check of accepted entries (the ledger is evidence, not a claim)
    template_check.py whether test_parity.py is still the rendered template (parity's evidence check)
    recipe_edit.py    recipe edits a passed rung earns, written into recipe.toml
    decision.py       a keep/choose decision's record and its headline
"""
