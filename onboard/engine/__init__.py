"""The ladder engine: `next-step` (next_step), which runs the current rung under the workspace lock,
and one attempt of a rung from its placeholder to its judged entry (attempt). What it judges with
(the rung table, states, gates, evidence, recipe edits) is the ladder's light half, onboard/ladder/."""
