"""ladder.json: the workspace's facts, every gate attempt (an `Entry`) and every waiver (DESIGN section 4).

    {"format": 1, "workspace": {name, family, path, model_type, source, ...}, "attempts": [Entry, ...],
     "waivers": [{rung, criterion, why, time, by}, ...]}

Every save is atomic (`atomic_write_text`). An attempt writes it twice, each a whole entry (DESIGN section
4): its `interrupted` placeholder before the rung runs (`add_placeholder`), then the entry it built once
the rung returned, in the placeholder's place (`commit`), or, for bad input, no entry (`withdraw`). A
file anyone can edit is checked when it is read
(`shape_problem`): an entry whose shape the readers cannot trust makes the whole ledger bad input,
naming the entry and the field, so no reader guesses around it; whether a well-formed entry's
measurements hold up is onboard/ladder/evidence.py's question. An entry's `duration_s` is recomputed
from its times whenever it is read, and keys this version does not know survive a save (`Entry.extra`).
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from onboard.errors import BadInput
from onboard.workspace.fsutil import atomic_write_text

FORMAT = 1


class Status(StrEnum):
    """A rung's status. An attempt records one of the first four (RECORDED); `ladder_states`
    derives the others from the ledger and the files; COMPLETE is next-step's answer when no
    rung is left. A StrEnum: it is its string in JSON and compares equal to it."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_APPLICABLE = "not_applicable"
    INTERRUPTED = "interrupted"
    """Stopped before it finished (Ctrl-C, SIGTERM, a kill): also the placeholder while it runs."""
    PENDING = "pending"
    STALE = "stale"
    INVALID = "invalid"
    RUNNING = "running"
    NOT_BUILT = "not built yet"
    COMPLETE = "complete"


RECORDED = (Status.PASSED, Status.FAILED, Status.NOT_APPLICABLE, Status.INTERRUPTED)
"""The statuses an attempt in ladder.json may hold."""
ACCEPTED = (Status.PASSED, Status.NOT_APPLICABLE)
"""An attempt that lets the ladder go on (once its evidence re-checks)."""
STATUSES = tuple(str(s) for s in RECORDED)


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


def duration_of(started: Any, ended: Any) -> float | None:
    """Seconds from `started` to `ended` (ISO 8601), as `Entry.duration_s` holds it; None without both."""
    try:
        return round((parse_iso(ended) - parse_iso(started)).total_seconds(), 3)
    except (TypeError, ValueError):  # absent, or naive beside aware: shape_problem names those
        return None


# ---- one attempt -------------------------------------------------------------------------
_OPTIONAL = ("duration_s", "not_applicable_reason", "error", "recipe_edit")
"""Keys written only when set: an entry without them reads as it always has."""


@dataclass
class Entry(Mapping[str, Any]):
    """One attempt of one rung, as ladder.json records it.

    It also reads like the JSON object it is stored as (`entry["measurements"]`,
    `entry.get("error")`), for the readers written against ladder.json's dicts.
    """

    rung: str
    attempt: int
    """1, 2, ... per rung."""
    status: Status
    started: str | None = None
    """ISO 8601 with UTC offset (`now_iso`)."""
    ended: str | None = None
    """ISO 8601; None while the rung runs, and for good after a hard kill (the placeholder)."""
    pid: int | None = None
    """The process that ran it (a live pid with no `ended`: running)."""
    command: str = ""
    """The command that reproduces the attempt."""
    attempt_dir: str | None = None
    """Workspace key of runs/<rung>/attempt-<N>/."""
    environment: dict[str, Any] = field(default_factory=dict)
    """Device and library versions (`ladder.environment`)."""
    model: str | None = None
    """Which model it ran: the twin or the full model (`Workspace.model_label`)."""
    rerun_reason: str | None = None
    """Why it ran again (the rung was stale or invalid); None for a first or retried attempt."""
    files_read: dict[str, str | None] = field(default_factory=dict)
    """{workspace key: sha256} of the files whose change makes it stale."""
    measurements: dict[str, Any] = field(default_factory=dict)
    """The rung's `Measurements.as_metrics()`: the flat {metric: value} the checklist judged."""
    criteria: list[dict] = field(default_factory=list)
    """`gates.evaluate`'s result per criterion, as judged when the attempt ended."""
    details: dict[str, Any] = field(default_factory=dict)
    """The rung's extra facts for the report."""
    duration_s: float | None = None
    """Seconds from started to ended, recomputed from those two when the entry is read (`duration_of`)."""
    not_applicable_reason: str | None = None
    error: str | None = None
    """The error that ended the attempt (with where its traceback is), one line."""
    recipe_edit: dict | None = None
    """The recipe edits a passed gate wrote: {file, sha256_before, sha256_after, edits}."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not know (a newer onboard's, a hand edit's): kept, and saved back."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Entry":
        """An entry from its JSON object (`shape_problem` vouches for the shape of a loaded one)."""
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {k: v for k, v in data.items() if k in known}
        values["status"] = Status(values["status"])
        for key in ("environment", "files_read", "measurements", "criteria", "details"):
            if values.get(key) is None:  # a hand-written null reads as empty
                values.pop(key, None)
        values["duration_s"] = duration_of(values.get("started"), values.get("ended"))  # never the file's word
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ladder.json holds (the optional keys only where set)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        for key in _OPTIONAL:
            if out[key] is None:
                del out[key]
        return {**out, **self.extra}

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


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
    """In-memory view of one ladder.json (its attempts as `Entry`s); `save()` writes it back atomically."""

    def __init__(self, path: Path, data: dict):
        self.path = Path(path)
        self.data = data
        data["attempts"] = [_entry(e) for e in data.get("attempts", [])]

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
        data = {**self.data, "attempts": [_entry(e).to_dict() for e in self.attempts]}
        text = json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n"
        atomic_write_text(self.path, text)

    # ---- attempts ----------------------------------------------------------------------
    @property
    def meta(self) -> dict:
        return self.data["workspace"]

    @property
    def attempts(self) -> list[Entry]:
        return self.data["attempts"]

    def entries(self, rung: str) -> list[Entry]:
        return [e for e in self.attempts if e.rung == rung]

    def next_attempt(self, rung: str) -> int:
        return 1 + max((e.attempt for e in self.entries(rung)), default=0)

    def append(self, entry: Entry | Mapping[str, Any]) -> None:
        """Add an attempt (an Entry, or its JSON object)."""
        self.attempts.append(_entry(entry))

    def _index(self, rung: str, attempt: int) -> int:
        for i, e in enumerate(self.attempts):
            if e.rung == rung and e.attempt == attempt:
                return i
        raise KeyError(f"no attempt {attempt} of {rung} in {self.path}")

    # ---- an attempt's two writes (module docstring) -------------------------------------------
    def add_placeholder(self, entry: Entry) -> None:
        """Save `entry`, an attempt's `interrupted` placeholder, before its rung runs, so a kill leaves a
        ledger that says so. Where the disk refuses, the ledger in memory is left as it was and the
        OSError raised: nothing was recorded, so nothing may run."""
        self.attempts.append(entry)
        try:
            self.save()
        except OSError:
            del self.attempts[self._index(entry.rung, entry.attempt)]
            raise

    def commit(self, entry: Entry) -> None:
        """Save the attempt's whole entry, built once its rung returned, in its placeholder's place. An
        OSError leaves the file with the placeholder (which reads interrupted)."""
        self.attempts[self._index(entry.rung, entry.attempt)] = entry
        self.save()

    def withdraw(self, rung: str, attempt: int) -> None:
        """Remove an attempt's placeholder and save: bad input stopped it, and nothing of it is recorded.
        The ledger in memory drops it even where the save raises (the file still holds the placeholder)."""
        del self.attempts[self._index(rung, attempt)]
        self.save()

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


# ---- the attempt folder's own record ----------------------------------------------------------
RUN_RECORD = "measurements.json"
"""Written by the engine into runs/<rung>/attempt-<N>/ when the rung returns: a passed entry of
ladder.json stands only where this file, in its own attempt folder, says the same (evidence.py)."""


def run_record(entry: Entry) -> dict[str, Any]:
    """What RUN_RECORD holds for `entry`, in the JSON form a reader gets back (`json_safe`, keys sorted)."""
    record = {k: getattr(entry, k) for k in ("rung", "attempt", "started", "ended", "measurements")}
    return json.loads(json.dumps(json_safe(record), allow_nan=False, sort_keys=True))


def run_record_text(entry: Entry) -> str:
    return json.dumps(run_record(entry), indent=2, sort_keys=True) + "\n"


def _entry(e: Entry | Mapping[str, Any]) -> Entry:
    return e if isinstance(e, Entry) else Entry.from_dict(e)
