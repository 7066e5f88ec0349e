"""Where the shipped data lives: templates/, checklists/ and skills/.

In the source tree they sit at the repository root (DESIGN section 2). `onboard/_data/`
holds symlinks to them (`_data/templates -> ../../templates`, ...); setuptools follows the
links when it builds a wheel, so a non-editable install carries real copies under
`onboard/_data/` (pyproject: `package-data onboard = ["_data/**/*"]`). Either way the path
`onboard/_data/<kind>` works; the repository root is the fallback for a checkout whose
symlinks were lost (e.g. a zip download on a filesystem without them).
"""

from __future__ import annotations

from pathlib import Path

from onboard.errors import BadInput

KINDS = ("templates", "checklists", "skills")
_PACKAGE = Path(__file__).resolve().parents[1]  # onboard/


def data_dir(kind: str) -> Path:
    """The folder holding `kind` (one of KINDS) for this installation."""
    if kind not in KINDS:
        raise ValueError(f"unknown data kind '{kind}' (one of {', '.join(KINDS)})")
    for candidate in (_PACKAGE / "_data" / kind, _PACKAGE.parent / kind):
        if candidate.is_dir():
            return candidate
    raise BadInput(
        f"the onboard installation has no {kind}/ folder (looked in {_PACKAGE / '_data'} and {_PACKAGE.parent}); "
        "reinstall titan-onboard"
    )


def data_file(kind: str, name: str) -> Path:
    """A file inside data_dir(kind); it may not exist (callers decide whether that is an error)."""
    return data_dir(kind) / name
