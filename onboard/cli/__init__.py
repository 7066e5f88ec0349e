"""The `onboard` command line: the typer app and its shared options (shared), the commands around the
ladder's result (handover), the recipe view, the demo, the skill installer and the tables people see (views)."""
