"""The report of a workspace: the facts it states from the ledger (facts), each rung's interleaved
speed-up along the ladder (steps), the pictures (pictures), REPORT.md written from its parts (write,
speed_section, tables) and the single-file report.html (html)."""
