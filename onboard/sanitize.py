"""Strings from a config or a checkpoint, made safe to show: the one sanitiser every printing path uses.

A config.json (model_type, architectures, an unknown key and its value) or a checkpoint (its tensor
names) is someone else's text. Printed as it is, it can drive the terminal: an escape sequence
clears the screen, retitles the window or writes the clipboard (OSC 52), a carriage return
overwrites the line before it, a bidi override reorders what a reader sees; and rich reads
`[bold red]...[/]` or `[link=...]` in a printed string as markup. So:

- `visible(text)`: every control character (C0, DEL, C1, the bidi and line-separator format
  characters) becomes a visible escape, `\\x1b`, `\\u202e`; the rest is left as it is.
- `markup_safe(text)`: `visible`, then rich's own `escape`, for a string that goes into markup.
- `html_safe(text)`: `visible`, then `html.escape`, for a string that goes into REPORT.md, whose
  HTML blocks report.html renders as HTML.

JSON output keeps the original string: json.dumps escapes control characters itself.
"""

from __future__ import annotations

import html
from typing import Any

from rich.markup import escape

# what a terminal acts on rather than shows: C0 (newline and tab among them), DEL, C1; bidi
# embeddings, overrides and isolates; the Unicode line and paragraph separators
_CONTROL = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
            *range(0x2066, 0x206A), 0x2028, 0x2029]  # fmt: skip
_ESCAPES = {c: (f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}") for c in _CONTROL}
_ESCAPES_KEEP_LINES = {c: e for c, e in _ESCAPES.items() if c not in (0x09, 0x0A)}  # a tab only moves the cursor on


def visible(value: Any, *, keep_newlines: bool = False) -> str:
    """`str(value)` with every control character written as a visible escape (`\\x1b`);
    `keep_newlines`: a text of several lines keeps its line breaks and tabs (each line is still safe)."""
    return str(value).translate(_ESCAPES_KEEP_LINES if keep_newlines else _ESCAPES)


def markup_safe(value: Any, *, keep_newlines: bool = False) -> str:
    """`visible(value)` with rich markup escaped: for a string placed inside markup."""
    return escape(visible(value, keep_newlines=keep_newlines))


def html_safe(value: Any, *, keep_newlines: bool = False) -> str:
    """`visible(value)` HTML-escaped (`<`, `>`, `&`, quotes): for REPORT.md, which report.html renders
    with its HTML (the evidence's <details> blocks) let through."""
    return html.escape(visible(value, keep_newlines=keep_newlines))
