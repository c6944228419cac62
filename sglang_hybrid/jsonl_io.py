"""JSON and JSON Lines input shared by the workload, trace, table and calibration readers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator


def read_json(path: str | Path, what: str, error: type[Exception] = ValueError) -> object:
    """The JSON value of a UTF-8 file; a missing or unreadable file raises ``error`` as ``"WHAT PATH: why"``."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{what} {p}: file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{what} {p}: cannot read ({e})") from None


def json_lines(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[str, object]]:
    """Yield ``("FILE:LINE", object)`` for each non-blank line of a UTF-8 JSONL file.

    A line that is not JSON raises ``error`` naming the file and line; a missing file raises
    ``FileNotFoundError`` naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{n}: not valid JSON: {e}") from None
            yield f"{path}:{n}", obj
