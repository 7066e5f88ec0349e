"""report.html: REPORT.md rendered to one self-contained page, its pictures embedded; and the
Markdown tables REPORT.md is made of (`table`).

The page is REPORT.md itself (tables, the `<details>` blocks of each rung's evidence),
rendered with markdown-it (CommonMark + tables, the parser rich already brings), with every
picture REPORT.md names replaced by a `data:image/png;base64` URI: the file can be mailed
or opened anywhere, nothing is fetched.

REPORT.md quotes config and checkpoint strings (model_type, unconsumed keys, errors, reasons), so
HTML in it is never passed through: it renders as text, and only the two tags the report's own
layout writes (DETAILS_OPEN, DETAILS_CLOSE) are put back as tags.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from markdown_it import MarkdownIt

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
code { background: #f5f5f5; padding: 0 0.2em; }
pre { background: #f5f5f5; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
"""


def cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


DETAILS_OPEN = "<details><summary>details</summary>"
"""The line REPORT.md opens a folded block of a rung's details with (onboard/report/write.py)."""
DETAILS_CLOSE = "</details>"


def render(markdown: str, pictures: dict[str, Path], *, title: str) -> str:
    """The page for `markdown`; `pictures`: file name as REPORT.md links it -> the PNG to embed."""
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    for tag in (DETAILS_OPEN, DETAILS_CLOSE):  # the layout's own lines, each a paragraph of its own
        body = body.replace(f"<p>{html.escape(tag, quote=False)}</p>", tag)
    for name, path in pictures.items():
        png = base64.b64encode(path.read_bytes()).decode("ascii")
        body = body.replace(f'src="{html.escape(name)}"', f'src="data:image/png;base64,{png}"')
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n"
    )
