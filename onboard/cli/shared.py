"""What every `onboard` command shares: the typer app, the --dir and --json options, the output
object (results on stdout, progress and errors on stderr) and the one error boundary `run_command`.
onboard/cli/app.py and onboard/cli/handover.py register their commands on this app."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path
from typing import Callable

import typer
from rich.console import Console

from onboard.errors import EXIT_BAD_INPUT, EXIT_FAILED, BadInput, EnvironmentFailed, describe_os_error
from onboard.workspace.layout import workspaces_dir
from titan_core.config.loader import ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Bring a model onto a sharded, compiled training setup one machine-checked rung at a time.",
)
skill_app = typer.Typer(no_args_is_help=True, help="The onboard-model agent skill.")
app.add_typer(skill_app, name="skill")

DIR_OPTION = typer.Option(Path("."), "--dir", help="Folder holding onboarding/ (default: the current folder).")
JSON_OPTION = typer.Option(False, "--json", help="Print one JSON document on stdout and nothing else.")


class Out:
    """stdout for results (rich, or one JSON document), stderr for progress and errors."""

    def __init__(self, json_mode: bool):
        self.json = json_mode
        self.console = Console(highlight=False, soft_wrap=False)
        self.err = Console(stderr=True, highlight=False)

    def log(self, line: str) -> None:
        if not self.json:
            self.err.print(line, markup=False, soft_wrap=True)

    def print(self, *objects, **kw) -> None:
        if not self.json:
            self.console.print(*objects, **kw)

    def emit(self, data: dict) -> None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        sys.stdout.flush()


def run_command(json_mode: bool, body: Callable[[Out], int]) -> None:
    """Run a command body; bad input and OS errors become one line on stderr and exit 2 or 1."""
    out = Out(json_mode)
    try:
        code = body(out)
    except (BadInput, ConfigError) as e:
        _fail(out, " ".join(str(e).split()), EXIT_BAD_INPUT)
    except EnvironmentFailed as e:
        _fail(out, " ".join(str(e).split()), EXIT_FAILED)
    except OSError as e:
        code, message = describe_os_error(e)
        _fail(out, message, code, errno=errno.errorcode.get(e.errno) if e.errno is not None else None)
    raise typer.Exit(code or 0)


def _fail(out: Out, message: str, code: int, **extra) -> None:
    print(f"error: {message}", file=sys.stderr)
    if out.json:
        out.emit({"error": message, "exit_code": code, **extra})
    raise typer.Exit(code) from None


def check_dir(dir: Path, *, workspaces: bool = True) -> Path:
    """Refuse a --dir that is a file (or whose onboarding/ is), before anything is created
    there; a folder that does not exist yet is fine (new-model makes it)."""
    for path, what in ((Path(dir), "--dir"), (workspaces_dir(dir), "onboarding/ under --dir")):
        if path.exists() and not path.is_dir():
            raise BadInput(f"{what} must be a folder, but {path} is not one")
        if not workspaces:
            break
    return Path(dir)
