"""ladder.json: the workspace's facts, every gate attempt, and every waiver.

Layout (DESIGN section 4):

    {"format": 1,
     "workspace": {name, family, flavor, path, model_type, source, hf_config, weights, device, created, unconsumed_keys},
     "attempts": [{rung, attempt, status, started, ended, duration_s, command, environment,
                   files_read: {path: sha256}, measurements, criteria: [...], details, error?}, ...],
     "waivers":  [{rung, criterion, why, time, by}, ...]}

Every save goes through `atomic_write_text`, so the file on disk is always a complete
JSON document, whatever happens to the process mid-write.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import math
from pathlib import Path
from typing import Any

from onboard.errors import BadInput
from onboard.fsutil import atomic_write_text

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
