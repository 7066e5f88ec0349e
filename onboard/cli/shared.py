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

from onboard.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    BadInput,
    EnvironmentFailed,
    Interrupted,
    describe_os_error,
    interrupt_signal,
    interrupted_exit_code,
    signal_name,
    signals_raise,
)
from onboard.environment import command_scope
from onboard.sanitize import visible
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
    """stdout for results (rich, or one JSON document), stderr for progress and errors.

    A line or string printed here has its control characters made visible (onboard/sanitize.py):
    progress lines and messages quote config and checkpoint strings. A string that goes into
    markup, a Table cell or a Text is the caller's to pass through `markup_safe` / `visible`."""

    def __init__(self, json_mode: bool):
        self.json = json_mode
        self.console = Console(highlight=False, soft_wrap=False)
        self.err = Console(stderr=True, highlight=False)

    def log(self, line: str) -> None:
        if not self.json:
            self.err.print(visible(line, keep_newlines=True), markup=False, soft_wrap=True)

    def print(self, *objects, **kw) -> None:
        if not self.json:
            self.console.print(*(visible(o, keep_newlines=True) if isinstance(o, str) else o for o in objects), **kw)

    def emit(self, data: dict) -> None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        sys.stdout.flush()


def run_command(json_mode: bool, body: Callable[[Out], int]) -> None:
    """Run a command body; bad input and OS errors become one line on stderr and exit 2 or 1.

    SIGTERM raises Interrupted inside it as Ctrl-C raises KeyboardInterrupt, so the body's
    `finally`s run (temp folders removed, child processes stopped) whichever signal came; one
    that reaches here exits 128 + the signal (130, 143). A body that took the interrupt itself
    and returned EXIT_INTERRUPTED exits with the code of the signal it was."""
    out = Out(json_mode)
    try:
        with signals_raise() as received, command_scope():  # ONBOARD_* read once, as the command starts
            code = body(out)
        if code == EXIT_INTERRUPTED and received:
            code = interrupted_exit_code(received[0])
    except (KeyboardInterrupt, Interrupted) as e:
        _interrupted(out, interrupt_signal(e))
    except (BadInput, ConfigError) as e:
        _fail(out, " ".join(str(e).split()), EXIT_BAD_INPUT)
    except EnvironmentFailed as e:
        _fail(out, " ".join(str(e).split()), EXIT_FAILED)
    except OSError as e:
        code, message = describe_os_error(e)
        _fail(out, message, code, errno=errno.errorcode.get(e.errno) if e.errno is not None else None)
    raise typer.Exit(code or 0)


def _interrupted(out: Out, signum: int) -> None:
    """An interrupt is no error of anyone's: said as what it was, exit 128 + the signal."""
    code, name = interrupted_exit_code(signum), signal_name(signum)
    print(f"interrupted by {name}", file=sys.stderr)
    if out.json:
        out.emit({"error": f"interrupted by {name}", "exit_code": code, "signal": name})
    raise typer.Exit(code) from None


def _fail(out: Out, message: str, code: int, **extra) -> None:
    print(f"error: {visible(message)}", file=sys.stderr)  # the JSON keeps the message as it is
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
