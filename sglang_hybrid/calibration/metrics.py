"""Held-out metrics of a calibration table: expected calibration error, AUC, Brier score, log loss.

Two views of the same samples:

* per-token conditional ``q``: one event per draft token ``j`` that was reached (tokens ``1..j-1`` accepted,
  ``j <= observed``); outcome = token ``j`` accepted;
* survival ``a_j = prod_{i<=j} q_i``: one event per draft token ``j <= observed``; outcome = tokens ``1..j``
  all accepted. This is what the selection consumes.

ECE uses ``ECE_BINS`` equal-width bins on [0, 1], weighted by events. AUC is the Mann-Whitney statistic with
ties counted half (exact, grouped by distinct predictions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .samples import Samples
from .table import CalibrationTable

__all__ = ["ECE_BINS", "Events", "events", "ece", "auc", "reliability", "evaluate"]

ECE_BINS = 20


@dataclass
class Events:
    """Flattened prediction/outcome pairs of one view (``q`` or ``survival``)."""

    pred: np.ndarray
    outcome: np.ndarray


def events(table: CalibrationTable, samples: Samples) -> tuple[Events, Events]:
    """``(q_events, survival_events)`` of ``table`` on ``samples``."""
    S = len(samples)
    if S == 0:
        z = np.zeros(0)
        return Events(z, z), Events(z, z)
    J = int(samples.observed.max()) if S else 0
    cols = np.arange(1, J + 1)
    q = table.lookup(samples.match_len[:, None], cols[None, :], samples.match_count[:, None],
                     samples.in_prompt[:, None], None if samples.agree is None else samples.agree[:, None])
    q = np.broadcast_to(q, (S, J)).astype(np.float64)
    surv = np.cumprod(q, axis=1)
    obs = cols[None, :] <= samples.observed[:, None]
    acc = samples.accepted[:, None]
    reached = obs & (acc >= cols[None, :] - 1)
    ok = acc >= cols[None, :]
    return Events(q[reached], ok[reached].astype(np.float64)), Events(surv[obs], ok[obs].astype(np.float64))


def ece(pred: np.ndarray, outcome: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error: sum over bins of |mean outcome - mean prediction| x bin share."""
    if pred.size == 0:
        return float("nan")
    b = np.clip((pred * bins).astype(np.int64), 0, bins - 1)
    n = np.bincount(b, minlength=bins).astype(np.float64)
    sp = np.bincount(b, weights=pred, minlength=bins)
    so = np.bincount(b, weights=outcome, minlength=bins)
    return float(np.sum(np.abs(so - sp)) / pred.size)


def auc(pred: np.ndarray, outcome: np.ndarray) -> float:
    """Area under the ROC curve (probability a random positive outranks a random negative; ties count 1/2)."""
    pos = outcome > 0.5
    npos, nneg = int(pos.sum()), int((~pos).sum())
    if npos == 0 or nneg == 0:
        return float("nan")
    vals, inv = np.unique(pred, return_inverse=True)
    p = np.bincount(inv, weights=pos.astype(np.float64), minlength=vals.size)
    n = np.bincount(inv, weights=(~pos).astype(np.float64), minlength=vals.size)
    neg_below = np.cumsum(n) - n
    return float(np.sum(p * (neg_below + 0.5 * n)) / (npos * nneg))


def reliability(pred: np.ndarray, outcome: np.ndarray, bins: int = ECE_BINS) -> dict[str, np.ndarray]:
    """Per-bin event count, mean prediction and observed frequency (NaN in empty bins)."""
    b = np.clip((pred * bins).astype(np.int64), 0, bins - 1)
    n = np.bincount(b, minlength=bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mp = np.bincount(b, weights=pred, minlength=bins) / n
        mo = np.bincount(b, weights=outcome, minlength=bins) / n
    return {"count": n, "mean_pred": mp, "observed": mo, "edges": np.linspace(0, 1, bins + 1)}


def _summary(ev: Events) -> dict[str, Any]:
    p = np.clip(ev.pred, 1e-6, 1 - 1e-6)
    y = ev.outcome
    if y.size == 0:
        return {"events": 0}
    a = auc(ev.pred, y)
    return {
        "events": int(y.size),
        "ece": round(ece(ev.pred, y), 6),
        "auc": None if np.isnan(a) else round(a, 6),  # undefined when every outcome is the same
        "brier": round(float(np.mean((ev.pred - y) ** 2)), 6),
        "log_loss": round(float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))), 6),
        "mean_pred": round(float(np.mean(ev.pred)), 6),
        "mean_observed": round(float(np.mean(y)), 6),
    }


def evaluate(table: CalibrationTable, samples: Samples) -> dict[str, Any]:
    """Held-out metrics of both views: ``{"drafts": S, "q": {...}, "survival": {...}}``."""
    eq, es = events(table, samples)
    return {"drafts": len(samples), "q": _summary(eq), "survival": _summary(es)}
