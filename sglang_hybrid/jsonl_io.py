"""JSON Lines input shared by the workload, trace and calibration readers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator


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
