"""Apply a passed rung's recipe edits to recipe.toml, keeping the person's comments and layout.

The recipe is a file a person reads and edits, so it is never re-serialised: each edit
touches one line. For `section.field = value` with its reason `why`:

- the field's line inside `[section]` is replaced by `field = <value>  # <why>`;
- a section without the field gets that line after its last non-blank line;
- a missing section is appended at the end of the file.

The new text is parsed again before anything is written: every edited key must read back as
the value asked for, and every other value must be unchanged, else `RecipeEditError` and the
file is untouched. The write itself is atomic (temp file + rename).
"""

from __future__ import annotations

import copy
import math
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from onboard.workspace.fsutil import atomic_write_text, sha256_file
from onboard.ladder.contract import RecipeEdit
from titan_core.config.loader import MISSING, get_key, set_key

# A table header line: `[a.b]` (an array of tables `[[a]]` also ends the previous section).
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]#]+?)\s*\]\]?\s*(#.*)?$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class RecipeEditError(ValueError):
    """An edit that cannot be applied cleanly; nothing was written."""


def toml_value(value: Any) -> str:
    """`value` as a TOML literal (str, bool, int, float, or a list of those)."""
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            raise RecipeEditError("NaN is not a recipe value")
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # shortest text that reads back as the same float
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        escaped = "".join(ch if ch >= " " and ch != "\x7f" else f"\\u{ord(ch):04x}" for ch in escaped)
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise RecipeEditError(f"cannot write {type(value).__name__} {value!r} as a recipe value")


def _split_key(key: str) -> tuple[list[str], str]:
    parts = key.split(".")
    if len(parts) < 2 or not all(_BARE_KEY.match(p) for p in parts):
        raise RecipeEditError(f"recipe edit key '{key}' is not 'section.field' (letters, digits, '_' or '-')")
    return parts[:-1], parts[-1]


def _comment(why: str) -> str:
    """The reason on one line: a newline inside a comment would end it and break the TOML."""
    return " ".join(str(why).split())


def _section_span(lines: list[str], section: list[str]) -> tuple[int, int] | None:
    """(index of the `[section]` header line, index one past the section's last line), or None."""
    start = None
    for i, line in enumerate(lines):
        m = _HEADER.match(line)
        if not m:
            continue
        if start is not None:
            return start, i
        if m.group(1) == "[" and [p.strip().strip('"') for p in m.group(2).split(".")] == section:
            start = i
    return (start, len(lines)) if start is not None else None


def _edit_lines(lines: list[str], edit: RecipeEdit) -> list[str]:
    section, name = _split_key(edit.key)
    new_line = f"{name} = {toml_value(edit.value)}  # {_comment(edit.why)}"
    span = _section_span(lines, section)
    if span is None:
        tail = [] if not lines or not lines[-1].strip() else [""]
        return lines + tail + [f"[{'.'.join(section)}]", new_line]
    start, end = span
    field = re.compile(rf"^(\s*)(?:{re.escape(name)}|\"{re.escape(name)}\")\s*=")
    for i in range(start + 1, end):
        m = field.match(lines[i])
        if m:
            return lines[:i] + [m.group(1) + new_line] + lines[i + 1 :]
    last = max((i for i in range(start, end) if lines[i].strip()), default=start)
    return lines[: last + 1] + [new_line] + lines[last + 1 :]


def _plain(value: Any) -> Any:
    """Tuples as lists, as TOML reads arrays back."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same type: 1, 1.0 and true are different recipe values."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def edit_text(text: str, edits: Iterable[RecipeEdit]) -> str:
    """The recipe text with `edits` applied; RecipeEditError if the result does not read back exactly."""
    edits = list(edits)
    try:
        before = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RecipeEditError(f"the recipe is not valid TOML before the edit: {e}") from None
    newline = "\r\n" if "\r\n" in text else "\n"  # keep the file's own line endings
    lines = text.splitlines()
    for edit in edits:
        lines = _edit_lines(lines, edit)
    new_text = newline.join(lines) + newline
    keys = ", ".join(edit.key for edit in edits)
    try:
        after = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError as e:
        raise RecipeEditError(f"editing {keys} would leave the recipe invalid TOML: {e}") from None
    expected = copy.deepcopy(before)
    for edit in edits:
        value = get_key(after, edit.key, MISSING)
        if value is MISSING or not _same(value, edit.value):
            got = "nothing" if value is MISSING else repr(value)
            raise RecipeEditError(f"recipe edit {edit.key} = {edit.value!r} would read back as {got}")
        set_key(expected, edit.key, _plain(edit.value))  # the sections exist: the edit read back from them
    if after != expected:
        # the line edit touched something else (e.g. a multi-line value that continued below it)
        raise RecipeEditError(f"recipe edits {keys} would change other values too")
    return new_text


def apply_edits(path: Path, edits: Iterable[RecipeEdit]) -> dict[str, Any]:
    """Edit the recipe at `path` in place (atomically); returns {sha256_before, sha256_after, edits}.

    Raises RecipeEditError (the file untouched) when the edits cannot be applied cleanly.
    """
    path = Path(path)
    edits = list(edits)
    text = path.read_text(encoding="utf-8")
    before = sha256_file(path)
    new_text = edit_text(text, edits)
    atomic_write_text(path, new_text)
    return {
        "sha256_before": before,
        "sha256_after": sha256_file(path),
        "edits": [e.to_dict() for e in edits],
    }
