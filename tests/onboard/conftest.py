"""tests/onboard mirrors onboard's layers, one folder each (docs/LAYOUT.md, "Tests"); a test imports helpers
from beside it and from other folders (a finished demo ladder, the plan's models, the structure checks)
by bare name, so every folder of tests/onboard and tests/core is on the path whichever file pytest
collects first."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in sorted([HERE, *(p for p in HERE.iterdir() if p.is_dir() and p.name != "__pycache__"), HERE.parent / "core"]):
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
