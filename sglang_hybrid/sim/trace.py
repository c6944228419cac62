"""Model-drafter behaviour for the simulator: from the declared acceptance model, or replayed from a trace.

Trace format (JSONL, one object per request per decode step, written by the worker on a real run)::

    {"id": "code-edit/flask-2.3.3..3.0.0/src/flask/app.py",   # the workload record id (or the request rid)
     "pos": 37,                 # output tokens the request had produced when this step drafted
     "conf": [0.93, 0.9, ...],  # the model chain's per-position conditional confidences c_1..c_gamma
     "verified": 5,             # model-chain draft tokens the target verified this step (0: it verified
                                #   the n-gram chain instead, or nothing)
     "accepted": 3}             # of those, how many the target accepted (accepted <= verified)

Replay, for a request at output position ``pos``: the record with that id and ``pos`` gives the confidences;
if it saw a rejection (``accepted < verified``) the model chain's acceptance length is ``accepted``, otherwise
the first ``verified`` tokens are known accepted and the rest are drawn from ``conf`` with the simulator's
seeded uniforms. With no record at that position the latest earlier record of the request lends its
confidences (acceptance drawn); with no record for the request the declared model is used. ``coverage``
counts the three cases. For exact replay the workload's output should be what the traced target produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..jsonl_io import json_lines

import numpy as np

from .acceptance import AcceptanceModel, accepted_prefix


class TraceFormatError(ValueError):
    """A malformed trace line; the message names file, line and field."""


@dataclass(frozen=True)
class TraceStep:
    pos: int
    conf: tuple[float, ...]
    verified: int
    accepted: int


def _parse(obj: object, where: str, gamma: int | None) -> tuple[str, TraceStep]:
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{where}: expected a JSON object")
    for k, typ in (("id", str), ("pos", int), ("conf", list), ("verified", int), ("accepted", int)):
        if k not in obj:
            raise TraceFormatError(f"{where}: missing field '{k}'")
        if not isinstance(obj[k], typ) or isinstance(obj[k], bool):
            raise TraceFormatError(f"{where}: field '{k}' must be {typ.__name__}")
    conf = obj["conf"]
    if not conf or not all(isinstance(c, (int, float)) and 0.0 <= c <= 1.0 for c in conf):
        raise TraceFormatError(f"{where}: field 'conf' must be a non-empty list of numbers in [0, 1]")
    if gamma is not None and len(conf) != gamma:
        raise TraceFormatError(f"{where}: field 'conf' has {len(conf)} entries, the simulation's gamma is {gamma}")
    if obj["pos"] < 0 or not (0 <= obj["accepted"] <= obj["verified"] <= len(conf)):
        raise TraceFormatError(f"{where}: need pos >= 0 and 0 <= accepted <= verified <= len(conf)")
    return obj["id"], TraceStep(obj["pos"], tuple(float(c) for c in conf), obj["verified"], obj["accepted"])


def load_trace(path: str | Path, gamma: int | None = None) -> dict[str, list[TraceStep]]:
    """Read a trace file into ``{id: steps sorted by pos}`` (a later line for the same (id, pos) wins)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    by_id: dict[str, dict[int, TraceStep]] = {}
    for where, obj in json_lines(path, TraceFormatError):
        rid, step = _parse(obj, where, gamma)
        by_id.setdefault(rid, {})[step.pos] = step
    return {rid: [d[p] for p in sorted(d)] for rid, d in by_id.items()}


class ModelDraws:
    """Per-request confidences and model-chain acceptance lengths, indexed by output position."""

    def __init__(self, model: AcceptanceModel, seed: int, trace: dict[str, list[TraceStep]] | None = None) -> None:
        self.model = model
        self.seed = int(seed)
        self.trace = trace
        self.coverage = {"exact": 0, "earlier": 0, "declared": 0}

    def for_request(self, index: int, rid: str, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """``conf [n, gamma]`` float32 and ``accept_len [n]`` int64 for output positions ``0..n-1``."""
        c, u = self.model.draw(self.seed, index, num_positions)
        steps = None if self.trace is None else self.trace.get(rid)
        if not steps:
            if self.trace is not None:
                self.coverage["declared"] += num_positions
            return c, accepted_prefix(c, u)
        known_cap = np.full(num_positions, -1, dtype=np.int64)  # known exact acceptance (rejection seen)
        known_min = np.zeros(num_positions, dtype=np.int64)  # tokens known accepted (censored)
        k = 0
        for p in range(num_positions):
            while k + 1 < len(steps) and steps[k + 1].pos <= p:
                k += 1
            s = steps[k]
            if s.pos > p:  # before the first record: declared model
                self.coverage["declared"] += 1
                continue
            c[p] = np.asarray(s.conf, dtype=np.float32)
            if s.pos == p:
                self.coverage["exact"] += 1
                if s.accepted < s.verified:
                    known_cap[p] = s.accepted
                else:
                    known_min[p] = s.accepted
            else:
                self.coverage["earlier"] += 1
        g = c.shape[1]
        col = np.arange(g).reshape(1, g)
        u = np.where(col < known_min.reshape(-1, 1), 0.0, u).astype(np.float32)  # known accepted
        acc = accepted_prefix(np.maximum(c, 1e-12), u)
        acc = np.where(known_cap >= 0, known_cap, acc)
        return c, acc
