"""ladder.json: the workspace's facts, every gate attempt, and every waiver.

Layout (DESIGN section 4):

    {"format": 1,
     "workspace": {name, family, flavor, path, model_type, source, hf_config, weights, device, created, unconsumed_keys},
     "attempts": [{rung, attempt, status, started, ended, duration_s, command, environment,
                   files_read: {path: sha256}, measurements, criteria: [...], details, error?}, ...],
     "waivers":  [{rung, criterion, why, time, by}, ...]}

Every save goes through `atomic_write_text`, so the file on disk is always a complete
JSON document, whatever happens to the process mid-write. A file anyone can edit is checked
when it is read (`shape_problem`): an entry whose shape the readers cannot trust (no status,
a timestamp that does not parse, not an object) makes the whole ledger bad input, naming the
entry and the field, so no reader ever guesses around it and no gate counts it as evidence.
Whether a well-formed entry's measurements hold up is evidence.py's question, not this one.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import math
from pathlib import Path
from typing import Any

from onboard.errors import BadInput
from onboard.workspace.fsutil import atomic_write_text

FORMAT = 1
STATUSES = ("passed", "failed", "not_applicable", "interrupted")


def now_iso() -> str:
    """Local time with offset and microseconds, so entries order correctly when compared."""
    return _dt.datetime.now().astimezone().isoformat(timespec="microseconds")


def parse_iso(text: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(text)


def json_safe(value: Any) -> Any:
    """Replace non-finite floats by their repr ("nan", "inf") so the ledger stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


# ---- the shape a reader may rely on ----------------------------------------------------------
def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _timestamp_problem(value: Any) -> str | None:
    # naive and offset-aware times cannot be compared: one of each would crash every comparison
    if not isinstance(value, str):
        return f"is {_json_type(value)}, not an ISO 8601 timestamp"
    try:
        parsed = parse_iso(value)
    except ValueError:
        return f"is {value!r}, not an ISO 8601 timestamp"
    return None if parsed.tzinfo is not None else f"is {value!r}, a timestamp with no UTC offset"


def _shown(value: Any) -> str:
    """A wrong value as the message shows it: short scalars as they are, the rest by their type."""
    text = repr(value)
    return text if isinstance(value, (str, int, float, type(None))) and len(text) <= 40 else _json_type(value)


def _missing_or(e: dict, key: str, what: str) -> str:
    return f"field '{key}' is missing" if key not in e else f"field '{key}' is {_shown(e[key])}, {what}"


def _attempt_problem(e: dict) -> str | None:
    """What is wrong with one attempt's shape, as "field 'x' ...", or None."""
    if not isinstance(e.get("rung"), str) or not e["rung"]:
        return _missing_or(e, "rung", "not a rung name")
    if type(e.get("attempt")) is not int or e["attempt"] < 1:
        return _missing_or(e, "attempt", "not a whole number >= 1")
    if e.get("status") not in STATUSES:
        return _missing_or(e, "status", f"not one of {', '.join(STATUSES)}")
    for key in ("started", "ended"):
        if e.get(key) is not None and (why := _timestamp_problem(e[key])):
            return f"field '{key}' {why}"
    for key in ("measurements", "details", "environment", "files_read", "recipe_edit"):
        if e.get(key) is not None and not isinstance(e[key], dict):
            return _missing_or(e, key, "not an object")
    for key, digest in (e.get("files_read") or {}).items():
        if digest is not None and not isinstance(digest, str):
            return f"field 'files_read' holds {_json_type(digest)} for {key!r}, not a sha256"
    criteria = e.get("criteria")
    if criteria is not None and not isinstance(criteria, list):
        return _missing_or(e, "criteria", "not a list")
    for j, c in enumerate(criteria or []):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not isinstance(c.get("ok"), bool):
            return f"field 'criteria[{j}]' is not an object with a 'name' and a true/false 'ok'"
    edits = (e.get("recipe_edit") or {}).get("edits", [])
    if not isinstance(edits, list) or not all(isinstance(x, dict) and isinstance(x.get("key"), str) for x in edits):
        return "field 'recipe_edit.edits' is not a list of objects with a 'key'"
    return None


def _waiver_problem(w: dict) -> str | None:
    for key in ("rung", "criterion", "why"):
        if not isinstance(w.get(key), str):
            return _missing_or(w, key, "not text")
    if "time" not in w:
        return "field 'time' is missing"
    why = _timestamp_problem(w["time"])
    return f"field 'time' {why}" if why else None


def _label(where: str, i: int, item: Any) -> str:
    """`attempts[3] (eager attempt 2)`: the entry's place, and what it says it is where it says so."""
    if where != "attempts" or not isinstance(item, dict) or not isinstance(item.get("rung"), str):
        return f"{where}[{i}]"
    attempt = f" attempt {item['attempt']}" if type(item.get("attempt")) is int else ""
    return f"{where}[{i}] ({item['rung']}{attempt})"


def shape_problem(data: dict) -> str | None:
    """The first attempt or waiver whose shape a reader cannot rely on, named by its place and
    field (`attempts[3] (eager attempt 2): field 'status' is missing`); None when all are sound."""
    if not isinstance(data.get("workspace", {}), dict):
        return f"'workspace' is {_json_type(data['workspace'])}, not an object"
    if not isinstance(data.get("waivers", []), list):
        return f"'waivers' is {_json_type(data['waivers'])}, not a list"
    for where, check in (("attempts", _attempt_problem), ("waivers", _waiver_problem)):
        for i, item in enumerate(data.get(where, [])):
            problem = check(item) if isinstance(item, dict) else f"the entry is {_json_type(item)}, not an object"
            if problem:
                return f"{_label(where, i, item)}: {problem}"
    return None


class Ledger:
    """In-memory view of one ladder.json; `save()` writes it back atomically."""

    def __init__(self, path: Path, data: dict):
        self.path = Path(path)
        self.data = data

    # ---- loading and saving ----------------------------------------------------------
    @classmethod
    def new(cls, path: Path, workspace_meta: dict) -> "Ledger":
        return cls(path, {"format": FORMAT, "workspace": workspace_meta, "attempts": [], "waivers": []})

    @classmethod
    def load(cls, path: Path) -> "Ledger":
        path = Path(path)
        if not path.is_file():
            raise BadInput(f"{path} is missing: is this a workspace made by `onboard new-model`?")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadInput(f"{path} is not valid JSON ({e}); restore it from version control") from None
        if not isinstance(data, dict) or not isinstance(data.get("attempts"), list):
            raise BadInput(f"{path} is not a ladder ledger (no 'attempts' list)")
        if data.get("format") != FORMAT:
            raise BadInput(f"{path} has format {data.get('format')!r}; this onboard reads format {FORMAT}")
        if problem := shape_problem(data):
            raise BadInput(
                f"{path}: {problem}; fix or remove that entry by hand (or restore the file from version control)"
            )
        data.setdefault("waivers", [])
        data.setdefault("workspace", {})
        return cls(path, data)

    def save(self) -> None:
        text = json.dumps(json_safe(self.data), indent=2, allow_nan=False) + "\n"
        atomic_write_text(self.path, text)

    # ---- attempts ----------------------------------------------------------------------
    @property
    def meta(self) -> dict:
        return self.data["workspace"]

    @property
    def attempts(self) -> list[dict]:
        return self.data["attempts"]

    def entries(self, rung: str) -> list[dict]:
        return [e for e in self.attempts if e.get("rung") == rung]

    def next_attempt(self, rung: str) -> int:
        return 1 + max((int(e.get("attempt", 0)) for e in self.entries(rung)), default=0)

    def append(self, entry: dict) -> None:
        self.attempts.append(entry)

    def _index(self, rung: str, attempt: int) -> int:
        for i, e in enumerate(self.attempts):
            if e.get("rung") == rung and e.get("attempt") == attempt:
                return i
        raise KeyError(f"no attempt {attempt} of {rung} in {self.path}")

    def replace(self, entry: dict) -> None:
        self.attempts[self._index(entry["rung"], entry["attempt"])] = entry

    def remove(self, rung: str, attempt: int) -> None:
        del self.attempts[self._index(rung, attempt)]

    # ---- waivers -----------------------------------------------------------------------
    def add_waiver(self, rung: str, criterion: str, why: str) -> dict:
        """Record a waiver; a later waiver of the same criterion supersedes the earlier one."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        waiver = {"rung": rung, "criterion": criterion, "why": why, "time": now_iso(), "by": user}
        self.data["waivers"].append(waiver)
        return waiver

    def waivers(self, rung: str | None = None) -> dict[tuple[str, str], dict]:
        """{(rung, criterion): latest waiver}, optionally for one rung."""
        out: dict[tuple[str, str], dict] = {}
        for w in self.data["waivers"]:
            if rung is None or w.get("rung") == rung:
                out[(w["rung"], w["criterion"])] = w
        return out
