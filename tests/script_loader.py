"""Load a script that is not a package module (``scripts/*.py``, the peers' harnesses) for its tests."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str, path: Path | None = None) -> types.ModuleType:
    """Execute ``path`` (default ``scripts/<name>.py``) as module ``name`` and return it. The module is
    registered in ``sys.modules`` first (dataclasses in it look their module up there)."""
    path = ROOT / "scripts" / f"{name}.py" if path is None else path
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
