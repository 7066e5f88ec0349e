"""The ladder engine: rung order and the state machine (ladder), one attempt of a rung from its
placeholder to its judged entry (attempt), the evidence ledger and its `Status` (ledger), the
checklist criteria and their evaluation (gates), the re-check of accepted entries (evidence) and the
recipe edits a passed rung earns (recipe_edit)."""
