"""The n-gram calibration table: ``q = P(draft token j accepted | tokens 1..j-1 accepted)`` by feature bucket.

File format (JSON, ``schema_version`` 1)::

    {
      "format": "sglang-hybrid/ngram-calibration",
      "schema_version": 1,
      "features": [                                   # in this order; "agree" may be absent
        {"name": "match_len",   "edges": [2, 3, 4, 5, 6, 7, 8, 9]},
        {"name": "position",    "edges": [1, 2, 3, 4, 5, 7, 9, 13, 17]},
        {"name": "match_count", "edges": [1, 2, 3, 5, 9, null]},
        {"name": "in_prompt",   "edges": [0, 1, 2]},
        {"name": "agree",       "edges": [0, 1, 2]}   # optional
      ],
      "q":       nested lists, one axis per feature, one entry per bucket, each in [0, 1],
      "trials":  same shape, ints (optional): fitting samples per cell (token j reached with 1..j-1 accepted),
      "accepts": same shape, ints (optional): of those, how many were accepted,
      "fit":     {...} free-form provenance: source, corpus and its digest, tokenizer, target, n-gram config...,
      "heldout": {...} held-out metrics of this table (ECE, AUC, ...)
    }

Bucket ``k`` of a feature holds the integer values ``edges[k] <= v < edges[k + 1]``; a final ``null`` edge means
"and everything above". Features:

* ``match_len``: the matched suffix length ``n`` (``NgramDraft.match_len``);
* ``position``: the 1-based position ``j`` of the token in the draft chain;
* ``match_count``: how often the matched suffix occurred (``NgramDraft.match_count``);
* ``in_prompt``: 1 if the continuation was copied from the prompt (``NgramDraft.in_prompt``);
* ``agree``: 1 if the first n-gram token equals the model chain's first token (only in tables fit with a model
  drafter).

A feature that a fit does not use is a single bucket (for example ``"edges": [1, null]``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

import numpy as np

__all__ = [
    "SCHEMA_VERSION",
    "FORMAT_NAME",
    "FEATURE_NAMES",
    "REQUIRED_FEATURES",
    "DEFAULT_TABLE_PATH",
    "CalibrationError",
    "Feature",
    "CalibrationTable",
    "default_edges",
]

SCHEMA_VERSION = 1
FORMAT_NAME = "sglang-hybrid/ngram-calibration"
FEATURE_NAMES = ("match_len", "position", "match_count", "in_prompt", "agree")
REQUIRED_FEATURES = FEATURE_NAMES[:4]
DEFAULT_TABLE_PATH = Path(__file__).resolve().parent.parent / "data" / "calibration" / "default.json"


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file and the fault."""


class NgramConfigLike(Protocol):
    """What ``check_covers`` reads from an ``NgramConfig``."""

    n_min: int
    n_max: int
    max_draft: int
    window: int


@dataclass(frozen=True)
class Feature:
    """One feature axis: ``edges`` are the bucket boundaries (ints, increasing); a last edge ``None`` is open."""

    name: str
    edges: tuple[Optional[int], ...]

    @property
    def num_buckets(self) -> int:
        return len(self.edges) - 1

    @property
    def lo(self) -> int:
        """Smallest value covered."""
        return int(self.edges[0])  # type: ignore[arg-type]

    @property
    def hi(self) -> Optional[int]:
        """Largest value covered, ``None`` if unbounded."""
        return None if self.edges[-1] is None else int(self.edges[-1]) - 1

    @property
    def finite_edges(self) -> np.ndarray:
        """The closed edges (all but an open top) as int64."""
        return np.asarray([e for e in self.edges if e is not None], dtype=np.int64)

    def bucket(self, values: np.ndarray) -> np.ndarray:
        """Bucket index of each value (values outside the covered range are clamped to the end buckets)."""
        inner = self.finite_edges[1:]
        if self.edges[-1] is not None:
            inner = inner[:-1]
        idx = np.searchsorted(inner, np.asarray(values, dtype=np.int64), side="right")
        return np.clip(idx, 0, self.num_buckets - 1)

    def label(self, k: int) -> str:
        a = self.edges[k]
        b = self.edges[k + 1]
        if b is None:
            return f"{a}+"
        return f"{a}" if b == a + 1 else f"{a}-{b - 1}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "edges": list(self.edges)}


def default_edges(n_min: int = 2, n_max: int = 8, max_draft: int = 16, *, agree: bool = False) -> list[Feature]:
    """The default buckets: every match length, positions 1,2,3,4,5-6,7-8,9-12,13-16,17-24,25-32,...,
    match counts 1, 2, 3-4, 5-8, 9+, in_prompt 0/1 (and agree 0/1)."""
    pos = [1, 2, 3, 4, 5]
    step = 2
    while pos[-1] <= max_draft:
        for _ in range(2):
            pos.append(pos[-1] + step)
        step *= 2
    pos = [p for p in pos if p <= max_draft] + [max_draft + 1]
    feats = [
        Feature("match_len", tuple(range(n_min, n_max + 2))),
        Feature("position", tuple(pos)),
        Feature("match_count", (1, 2, 3, 5, 9, None)),
        Feature("in_prompt", (0, 1, 2)),
    ]
    if agree:
        feats.append(Feature("agree", (0, 1, 2)))
    return feats


def _fail(source: str, msg: str) -> CalibrationError:
    return CalibrationError(f"calibration file {source}: {msg}")


def _parse_feature(source: str, i: int, obj: Any) -> Feature:
    if not isinstance(obj, dict) or "name" not in obj or "edges" not in obj:
        raise _fail(source, f"features[{i}] must be an object with 'name' and 'edges'")
    name, edges = obj["name"], obj["edges"]
    if not isinstance(edges, list) or len(edges) < 2:
        raise _fail(source, f"feature {name!r}: 'edges' must be a list of at least 2 bucket edges, got {edges!r}")
    for k, e in enumerate(edges):
        last = k == len(edges) - 1
        if e is None and last:
            continue
        if isinstance(e, bool) or not isinstance(e, int):
            raise _fail(source, f"feature {name!r}: edge {k} is {e!r}; edges must be integers "
                                "(only the last may be null)")
    finite = [e for e in edges if e is not None]
    if any(b <= a for a, b in zip(finite, finite[1:])):
        raise _fail(source, f"feature {name!r}: edges {edges} must be strictly increasing")
    return Feature(str(name), tuple(edges))


def _shape_of(obj: Any) -> tuple[int, ...]:
    shape = []
    while isinstance(obj, list):
        shape.append(len(obj))
        if not obj:
            break
        obj = obj[0]
    return tuple(shape)


@dataclass
class CalibrationTable:
    """A calibration table in memory: ``features`` (axes, in ``FEATURE_NAMES`` order) and ``q`` (float64 array,
    one axis per feature). ``trials``/``accepts`` are the fit's per-cell counts (may be ``None``); ``fit`` and
    ``heldout`` the provenance and held-out metrics; ``source`` the file it was read from (for messages)."""

    features: list[Feature]
    q: np.ndarray
    trials: Optional[np.ndarray] = None
    accepts: Optional[np.ndarray] = None
    fit: dict[str, Any] = field(default_factory=dict)
    heldout: dict[str, Any] = field(default_factory=dict)
    source: str = "<memory>"

    def __post_init__(self) -> None:
        self.q = np.asarray(self.q, dtype=np.float64)
        self.validate()

    # ------------------------------------------------------------------ validation

    def validate(self) -> None:
        """Raise ``CalibrationError`` naming ``source`` for any structural fault."""
        src = self.source
        names = [f.name for f in self.features]
        if tuple(names[:4]) != REQUIRED_FEATURES or len(names) > 5 or (len(names) == 5 and names[4] != "agree"):
            raise _fail(src, f"features must be {list(REQUIRED_FEATURES)} optionally followed by 'agree', got {names}")
        shape = tuple(f.num_buckets for f in self.features)
        if self.q.shape != shape:
            raise _fail(src, f"'q' has shape {list(self.q.shape)} but the feature edges give {list(shape)} buckets")
        if not np.all(np.isfinite(self.q)):
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(self.q))[0])
            raise _fail(src, f"'q' holds a NaN or infinite value at {self._cell_name(bad)}")
        if np.any(self.q < 0.0) or np.any(self.q > 1.0):
            bad = tuple(int(i) for i in np.argwhere((self.q < 0.0) | (self.q > 1.0))[0])
            raise _fail(src, f"'q' holds {float(self.q[bad])!r} at {self._cell_name(bad)}, outside [0, 1]")
        for name in ("trials", "accepts"):
            arr = getattr(self, name)
            if arr is None:
                continue
            arr = np.asarray(arr)
            if arr.shape != shape:
                raise _fail(src, f"'{name}' has shape {list(arr.shape)} but the feature edges give "
                                 f"{list(shape)} buckets")
            if arr.size and (not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0):
                raise _fail(src, f"'{name}' must hold non-negative integers")
            setattr(self, name, arr.astype(np.int64))
        if self.trials is not None and self.accepts is not None and np.any(self.accepts > self.trials):
            raise _fail(src, "'accepts' exceeds 'trials' in some cell")

    def _cell_name(self, idx: Sequence[int]) -> str:
        return "[" + ", ".join(f"{f.name}={f.label(k)}" for f, k in zip(self.features, idx)) + "]"

    @property
    def has_agree(self) -> bool:
        """Whether the table conditions on the model chain's first token."""
        return len(self.features) == 5

    def feature(self, name: str) -> Feature:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(name)

    def check_covers(self, cfg: NgramConfigLike) -> None:
        """Raise ``CalibrationError`` unless every feature value ``cfg`` can produce falls in a bucket.

        ``cfg`` produces match lengths ``[n_min, n_max]``, positions ``[1, max_draft]``, match counts from 1 up to
        ``window`` (unbounded when ``window == 0``) and in_prompt/agree in {0, 1}.
        """
        need: dict[str, tuple[int, Optional[int]]] = {
            "match_len": (int(cfg.n_min), int(cfg.n_max)),
            "position": (1, int(cfg.max_draft)),
            "match_count": (1, int(cfg.window) if int(cfg.window) > 0 else None),
            "in_prompt": (0, 1),
            "agree": (0, 1),
        }
        for f in self.features:
            lo, hi = need[f.name]
            upper_ok = f.hi is None or (hi is not None and hi <= f.hi)
            if f.lo > lo or not upper_ok:
                want = f"[{lo}, {'inf' if hi is None else hi}]"
                have = f"[{f.lo}, {'inf' if f.hi is None else f.hi}]"
                raise _fail(
                    self.source,
                    f"feature {f.name!r} covers {have} but the n-gram config "
                    f"(n_min={cfg.n_min}, n_max={cfg.n_max}, max_draft={cfg.max_draft}, window={cfg.window}) "
                    f"can produce {want}",
                )

    # ------------------------------------------------------------------ host evaluation

    def cell_index(self, match_len: np.ndarray, position: np.ndarray, match_count: np.ndarray,
                   in_prompt: np.ndarray, agree: Optional[np.ndarray] = None) -> tuple[np.ndarray, ...]:
        """Per-axis bucket indices of feature values (numpy, broadcasting)."""
        vals = [match_len, position, match_count, in_prompt]
        if self.has_agree:
            if agree is None:
                raise ValueError(f"table {self.source} has the 'agree' feature: pass agree")
            vals.append(agree)
        arrays = np.broadcast_arrays(*[np.asarray(v) for v in vals])
        return tuple(f.bucket(v) for f, v in zip(self.features, arrays))

    def lookup(self, match_len: np.ndarray, position: np.ndarray, match_count: np.ndarray,
               in_prompt: np.ndarray, agree: Optional[np.ndarray] = None) -> np.ndarray:
        """``q`` for feature values (numpy, broadcasting; host side, for fitting and evaluation)."""
        return self.q[self.cell_index(match_len, position, match_count, in_prompt, agree)]

    # ------------------------------------------------------------------ files

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT_NAME,
            "schema_version": SCHEMA_VERSION,
            "features": [f.to_json() for f in self.features],
            "q": np.round(self.q, 6).tolist(),
        }
        if self.trials is not None:
            out["trials"] = self.trials.tolist()
        if self.accepts is not None:
            out["accepts"] = self.accepts.tolist()
        out["fit"] = self.fit
        out["heldout"] = self.heldout
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write the table as JSON (deterministic bytes for a deterministic fit); returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_json(), indent=1, allow_nan=False)
        # One line per innermost list keeps the file readable and diffable.
        p.write_text(_compact_lists(text) + "\n", encoding="utf-8")
        return p

    @classmethod
    def from_json(cls, obj: Any, source: str = "<memory>") -> "CalibrationTable":
        """Validate a parsed JSON object (see the module docstring) and build a table."""
        if not isinstance(obj, dict):
            raise _fail(source, "top level must be a JSON object")
        if obj.get("format") != FORMAT_NAME:
            raise _fail(source, f"'format' is {obj.get('format')!r}, expected {FORMAT_NAME!r}")
        ver = obj.get("schema_version")
        if ver != SCHEMA_VERSION:
            raise _fail(source, f"schema_version is {ver!r}, this build reads schema_version {SCHEMA_VERSION}")
        for key in ("features", "q"):
            if key not in obj:
                raise _fail(source, f"missing key {key!r}")
        if not isinstance(obj["features"], list):
            raise _fail(source, "'features' must be a list")
        feats = [_parse_feature(source, i, f) for i, f in enumerate(obj["features"])]
        arrays: dict[str, Optional[np.ndarray]] = {}
        for key in ("q", "trials", "accepts"):
            raw = obj.get(key)
            if raw is None:
                if key == "q":
                    raise _fail(source, "'q' is null")
                arrays[key] = None
                continue
            try:
                arr = np.array(raw, dtype=np.float64)
            except (ValueError, TypeError):
                raise _fail(source, f"'{key}' is not a rectangular array of numbers "
                                    f"(outer shape {list(_shape_of(raw))})") from None
            if key != "q":
                if np.any(arr != np.round(arr)):
                    raise _fail(source, f"'{key}' must hold integers")
                arr = arr.astype(np.int64)
            arrays[key] = arr
        fit = obj.get("fit", {})
        heldout = obj.get("heldout", {})
        if not isinstance(fit, dict) or not isinstance(heldout, dict):
            raise _fail(source, "'fit' and 'heldout' must be objects")
        q = arrays["q"]
        assert q is not None
        return cls(feats, q, arrays["trials"], arrays["accepts"], fit, heldout, source)

    @classmethod
    def load(cls, path: str | os.PathLike, ngram_cfg: Optional[NgramConfigLike] = None) -> "CalibrationTable":
        """Read and validate a table; with ``ngram_cfg`` also ``check_covers`` it. Never falls back silently:
        every fault raises ``CalibrationError`` naming the file."""
        p = Path(path)
        source = str(p)
        if not p.is_file():
            raise _fail(source, "file not found")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise _fail(source, f"cannot be read ({e})") from None
        try:
            obj = json.loads(text)  # NaN / Infinity parse to floats and are rejected by validation, by cell
        except json.JSONDecodeError as e:
            raise _fail(source, f"malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        except ValueError as e:
            raise _fail(source, f"malformed JSON ({e})") from None
        table = cls.from_json(obj, source)
        if ngram_cfg is not None:
            table.check_covers(ngram_cfg)
        return table

    @classmethod
    def load_default(cls, ngram_cfg: Optional[NgramConfigLike] = None) -> "CalibrationTable":
        """The shipped table (fit on Python's stdlib text with the default tokenizer; see ``fit`` inside it)."""
        return cls.load(DEFAULT_TABLE_PATH, ngram_cfg)

    # ------------------------------------------------------------------ device

    def to_device(self, device: Any) -> "DeviceCalibration":
        """Dense lookup tensors on ``device`` for ``apply`` (built once; see ``apply.DeviceCalibration``)."""
        from .apply import DeviceCalibration

        return DeviceCalibration(self, device)


def _compact_lists(text: str) -> str:
    """Put every innermost list of numbers (and edge lists) on one line."""
    import re

    pattern = re.compile(r"\[\s*((?:-?[0-9.eE+-]+|null)(?:,\s*(?:-?[0-9.eE+-]+|null))*)\s*\]")
    return pattern.sub(lambda m: "[" + ", ".join(s.strip() for s in m.group(1).split(",")) + "]", text)

