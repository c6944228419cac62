"""The workload format: one JSON object a line, ``{"id": str, "kind": "code-edit"|"chat", "prompt": str,
"output": str}``. ``output`` is the reference answer, which the simulator takes as what the target produces."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..jsonl_io import json_lines
from typing import Iterable

KINDS = ("code-edit", "chat")
FIELDS = ("id", "kind", "prompt", "output")


class WorkloadFormatError(ValueError):
    """A workload file or record that does not follow the format (the message names file, line and field)."""


@dataclass(frozen=True)
class Record:
    """One request of a workload."""

    id: str
    kind: str
    prompt: str
    output: str

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "kind": self.kind, "prompt": self.prompt, "output": self.output},
                          ensure_ascii=False, sort_keys=False)


def check_record(obj: object, where: str) -> Record:
    """Validate a decoded JSON object as a workload record; ``where`` names it in errors."""
    if not isinstance(obj, dict):
        raise WorkloadFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in FIELDS if k not in obj]
    if missing:
        raise WorkloadFormatError(f"{where}: missing field(s) {missing}")
    extra = sorted(set(obj) - set(FIELDS))
    if extra:
        raise WorkloadFormatError(f"{where}: unknown field(s) {extra}; allowed: {list(FIELDS)}")
    for k in FIELDS:
        if not isinstance(obj[k], str):
            raise WorkloadFormatError(f"{where}: field '{k}' must be a string, got {type(obj[k]).__name__}")
    if obj["kind"] not in KINDS:
        raise WorkloadFormatError(f"{where}: field 'kind' must be one of {KINDS}, got {obj['kind']!r}")
    if not obj["id"]:
        raise WorkloadFormatError(f"{where}: field 'id' must not be empty")
    return Record(obj["id"], obj["kind"], obj["prompt"], obj["output"])


def read_workload(path: str | Path) -> list[Record]:
    """Read and validate a workload JSONL file (blank lines are skipped; ids must be unique)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"workload file not found: {path}")
    out: list[Record] = []
    seen: set[str] = set()
    for where, obj in json_lines(path, WorkloadFormatError):
        rec = check_record(obj, where)
        if rec.id in seen:
            raise WorkloadFormatError(f"{where}: duplicate id {rec.id!r}")
        seen.add(rec.id)
        out.append(rec)
    return out


def write_workload(path: str | Path, records: Iterable[Record]) -> int:
    """Write records as JSONL (UTF-8, ``\\n`` line ends); returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(rec.to_json())
            f.write("\n")
            n += 1
    return n
