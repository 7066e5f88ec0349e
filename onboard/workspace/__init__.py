"""One model's workspace on disk: its layout and the one model it builds (layout), the scaffold that writes
it from templates (scaffold, arch_diff for ports), the lock that allows one run at a time, crash-safe file
helpers (fsutil) and where the shipped templates/checklists/skills live (resources)."""
