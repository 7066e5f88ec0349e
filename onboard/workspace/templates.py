"""The environment every workspace template renders in, and one template rendered: jinja and the
template folder only, no model family, so the ladder can re-render test_parity.py to check it
(onboard/ladder/template_check.py) without torch; new-model's context for each file is render.py."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import jinja2
import tomli_w

from onboard.sanitize import visible
from onboard.workspace.resources import data_dir


def _comment(text: str, prefix: str = "") -> str:
    """`text` as wrapped `#` comment lines, continuation lines indented under the prefix."""
    lines = textwrap.wrap(prefix + text, width=96, break_on_hyphens=False)
    return "\n".join(("# " if i == 0 else "#   ") + line for i, line in enumerate(lines))


def _toml_value(value: Any) -> str:
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def template_env() -> jinja2.Environment:
    """The environment every workspace template renders in (the parity rung re-renders
    test_parity.py with it to tell an edited test: onboard/ladder/template_check.py)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,  # a template naming a missing variable is a bug, not blank text
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        # a config's strings land in comments and docstrings: a control character there would
        # break the TOML (or end a comment line early) and drive a terminal that shows the file
        finalize=lambda v: visible(v, keep_newlines=True) if isinstance(v, str) else v,
    )
    env.filters["toml"] = _toml_value
    env.filters["comment"] = _comment
    return env


def render_file(env: jinja2.Environment, name: str, context: dict[str, Any]) -> str:
    """templates/<name>.j2 rendered with `context`: the text of the workspace's file `name`."""
    text = env.get_template(f"{name}.j2").render(**context)
    # optional template sections leave runs of blank lines; PEP 8 allows two at most
    return re.sub(r"\n{4,}", "\n\n\n", text) if name.endswith(".py") else text
