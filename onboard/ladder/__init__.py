"""The ladder, light half: what `status`, `list`, `recipe`, `report` of a finished ladder and `--help`
need, without torch and without importing any rung's module (docs/LAYOUT.md lists its modules)."""
