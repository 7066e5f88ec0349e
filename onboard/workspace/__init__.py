"""One model's workspace on disk: its layout and the one model it builds (layout), its ledger ladder.json
(ledger: entries, Status), the scaffold that writes it from templates (scaffold, render; templates.py the
template environment alone; arch_diff and arch_semantics for ports), the lock that allows one run at a
time, crash-safe file helpers (fsutil) and where the shipped templates/checklists/skills live (resources)."""
