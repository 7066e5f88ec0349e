"""onboard: the ladder engine and the `onboard` CLI.

It scaffolds a workspace for a model (`new-model`), runs one rung's gate at a time
(`next-step`) and keeps the evidence in the workspace's ladder.json. It drives
titan_core only through titan_core's public API.
"""
