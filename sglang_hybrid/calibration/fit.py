"""Fitting a calibration table from samples: binned frequencies, hierarchical shrinkage, monotone projection.

1. Counts. Every draft token ``j <= observed`` that was reached (tokens ``1..j-1`` accepted) is one trial of
   its cell; it is a success if accepted.
2. Shrinkage. Cells are estimated coarse to fine along ``HIERARCHY`` (position, then match length, then match
   count, then in_prompt, then agree). Each level's estimate is a Beta-prior posterior mean centred on its
   parent: ``q = (accepts + s * q_parent) / (trials + s)`` with prior strength ``s`` pseudo-trials; the root
   (position alone) shrinks toward the overall rate. An empty cell takes its parent's value.
3. Monotonicity. ``q`` is projected, for every (position, in_prompt, agree) slice, onto the tables that are
   monotone in match length and in match count in the directions given by ``monotone`` (weighted least
   squares, weights ``trials + s``), by Dykstra's alternating projections with weighted pool-adjacent-violators
   along each axis, then closed with running maxima (which keep both orders). A decreasing axis is flipped,
   projected and flipped back.

   Directions (``DEFAULT_MONOTONE``): a longer match is never predicted worse (``match_len`` increasing). For
   ``match_count`` the measured direction is *decreasing*: at equal match length, a suffix that occurred more
   often has a less predictable continuation (its occurrences are followed by different tokens, and the
   drafter copies only the most recent one). On the stdlib corpus a non-decreasing constraint pools the count
   axis flat and loses its held-out gain (``hybrid-spark calibrate --ablate`` prints the comparison).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .samples import Samples
from .table import CalibrationTable, Feature, default_edges

__all__ = ["HIERARCHY", "DEFAULT_MONOTONE", "MONOTONE_FEATURES", "count_cells", "fit_table", "pava", "isotonic_2d",
           "split_by_doc", "check_monotone"]

HIERARCHY = ("position", "match_len", "match_count", "in_prompt", "agree")
MONOTONE_FEATURES = ("match_len", "match_count")
# +1: non-decreasing in the feature, -1: non-increasing, 0: unconstrained.
DEFAULT_MONOTONE: dict[str, int] = {"match_len": 1, "match_count": -1}


def split_by_doc(samples: Samples, num_docs: int, heldout_frac: float, seed: int) -> tuple[Samples, Samples]:
    """Deterministic train / held-out split by document (no document on both sides)."""
    if not 0.0 <= heldout_frac < 1.0:
        raise ValueError(f"heldout_frac must be in [0, 1), got {heldout_frac}")
    rng = np.random.default_rng(seed)
    held = rng.random(num_docs) < heldout_frac
    mask = held[samples.doc]
    return samples.subset(~mask), samples.subset(mask)


def count_cells(features: Sequence[Feature], samples: Samples) -> tuple[np.ndarray, np.ndarray]:
    """``(trials, accepts)`` per cell, int64 arrays of the table's shape."""
    shape = tuple(f.num_buckets for f in features)
    names = [f.name for f in features]
    if "agree" in names and samples.agree is None:
        raise ValueError("features include 'agree' but the samples have no agree values")
    strides = np.array([int(np.prod(shape[k + 1:])) for k in range(len(shape))], dtype=np.int64)
    base = np.zeros(len(samples), dtype=np.int64)
    vals = {"match_len": samples.match_len, "match_count": samples.match_count,
            "in_prompt": samples.in_prompt, "agree": samples.agree}
    for k, f in enumerate(features):
        if f.name != "position":
            base += f.bucket(vals[f.name]) * strides[k]
    pk = names.index("position")
    pos_f = features[pk]
    size = int(np.prod(shape))
    trials = np.zeros(size, dtype=np.int64)
    accepts = np.zeros(size, dtype=np.int64)
    J = int(samples.observed.max()) if len(samples) else 0
    for j in range(1, J + 1):
        reached = (samples.observed >= j) & (samples.accepted >= j - 1)
        cell = base[reached] + int(pos_f.bucket(np.array([j]))[0]) * strides[pk]
        trials += np.bincount(cell, minlength=size)
        accepts += np.bincount(cell, weights=(samples.accepted[reached] >= j), minlength=size).astype(np.int64)
    return trials.reshape(shape), accepts.reshape(shape)


def _shrink(trials: np.ndarray, accepts: np.ndarray, axes_order: list[int], strength: float) -> np.ndarray:
    """Hierarchical Beta-prior shrinkage; ``axes_order`` lists the table's axes coarse to fine."""
    t = np.transpose(trials, axes_order).astype(np.float64)
    a = np.transpose(accepts, axes_order).astype(np.float64)
    total_t, total_a = t.sum(), a.sum()
    parent = np.asarray(total_a / total_t if total_t > 0 else 0.5)
    for level in range(1, t.ndim + 1):
        sum_axes = tuple(range(level, t.ndim))
        tl = t.sum(axis=sum_axes) if sum_axes else t
        al = a.sum(axis=sum_axes) if sum_axes else a
        parent_b = parent.reshape(parent.shape + (1,)) if level > 1 else parent
        parent = (al + strength * parent_b) / (tl + strength) if strength > 0 else \
            np.where(tl > 0, al / np.maximum(tl, 1), parent_b)
    return np.transpose(parent, np.argsort(axes_order))


def pava(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted isotonic (non-decreasing) least-squares fit of ``y`` (pool adjacent violators)."""
    vals: list[float] = []
    wts: list[float] = []
    cnt: list[int] = []
    for yi, wi in zip(y.tolist(), w.tolist()):
        vals.append(yi)
        wts.append(wi)
        cnt.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            wsum = wts[-2] + wts[-1]
            v = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / wsum
            c = cnt[-2] + cnt[-1]
            vals[-2:], wts[-2:], cnt[-2:] = [v], [wsum], [c]
    return np.repeat(np.asarray(vals, dtype=np.float64), cnt)


def _pava_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.stack([pava(x[i], w[i]) for i in range(x.shape[0])])


def isotonic_2d(y: np.ndarray, w: np.ndarray, iters: int = 500, tol: float = 1e-10) -> np.ndarray:
    """Weighted least-squares projection of a 2-D array onto arrays non-decreasing along both axes.

    Dykstra's algorithm alternating the two 1-D isotonic projections (same weighted norm), then running
    maxima along axis 0 and axis 1 to remove round-off violations (a running max along one axis keeps the
    other axis' order).
    """
    x = y.astype(np.float64).copy()
    p = np.zeros_like(x)
    q = np.zeros_like(x)
    for _ in range(iters):
        z = _pava_rows((x + p).T, w.T).T  # along axis 0
        p = x + p - z
        x_new = _pava_rows(z + q, w)  # along axis 1
        q = z + q - x_new
        done = np.max(np.abs(x_new - x)) < tol
        x = x_new
        if done:
            break
    x = np.maximum.accumulate(x, axis=0)
    return np.maximum.accumulate(x, axis=1)


def _monotone(q: np.ndarray, weights: np.ndarray, features: Sequence[Feature], directions: dict[str, int]
              ) -> np.ndarray:
    names = [f.name for f in features]
    an, ac = names.index("match_len"), names.index("match_count")
    dn, dc = directions.get("match_len", 0), directions.get("match_count", 0)
    if dn == 0 and dc == 0:
        return q
    rest = [k for k in range(q.ndim) if k not in (an, ac)]
    qt = np.transpose(q, [an, ac] + rest)
    wt = np.transpose(weights, [an, ac] + rest)
    flip = (slice(None, None, -1 if dn < 0 else 1), slice(None, None, -1 if dc < 0 else 1))
    out = np.empty_like(qt)
    for idx in np.ndindex(*qt.shape[2:]):
        sl = (slice(None), slice(None)) + idx
        y, w = qt[sl][flip], wt[sl][flip]
        if dn != 0 and dc != 0:
            z = isotonic_2d(y, w)
        elif dn != 0:
            z = _pava_rows(y.T, w.T).T
        else:
            z = _pava_rows(y, w)
        out[sl] = z[flip]
    return np.transpose(out, np.argsort([an, ac] + rest))


def check_monotone(table: CalibrationTable, directions: dict[str, int], tol: float = 0.0) -> list[str]:
    """Violations of the declared monotone directions in ``table`` (empty list = monotone)."""
    problems = []
    for name, d in directions.items():
        if d == 0:
            continue
        axis = [f.name for f in table.features].index(name)
        diff = np.diff(table.q, axis=axis) * d
        if np.any(diff < -tol):
            problems.append(f"{name}: {int(np.sum(diff < -tol))} adjacent pairs break the "
                            f"{'increasing' if d > 0 else 'decreasing'} order (worst {float(diff.min()):.3g})")
    return problems


def fit_table(
    samples: Samples,
    features: Optional[Sequence[Feature]] = None,
    *,
    prior_strength: float = 20.0,
    monotone: Optional[dict[str, int]] = None,
    fit_meta: Optional[dict[str, Any]] = None,
    n_min: int = 2,
    n_max: int = 8,
    max_draft: int = 16,
) -> CalibrationTable:
    """Fit a table (see the module docstring). ``features`` defaults to ``default_edges(n_min, n_max,
    max_draft, agree=samples.agree is not None)``; ``monotone`` maps ``match_len`` / ``match_count`` to +1
    (non-decreasing), -1 (non-increasing) or 0 (free), default ``DEFAULT_MONOTONE``; ``fit_meta`` becomes the
    table's ``fit`` record (``prior_strength``, ``monotone``, counts are added)."""
    if prior_strength < 0:
        raise ValueError(f"prior_strength must be >= 0, got {prior_strength}")
    feats = list(features) if features is not None else default_edges(n_min, n_max, max_draft,
                                                                        agree=samples.agree is not None)
    trials, accepts = count_cells(feats, samples)
    names = [f.name for f in feats]
    order = [names.index(h) for h in HIERARCHY if h in names]
    q = _shrink(trials, accepts, order, prior_strength)
    directions = dict(DEFAULT_MONOTONE if monotone is None else monotone)
    for k, v in directions.items():
        if k not in MONOTONE_FEATURES or v not in (-1, 0, 1):
            raise ValueError(f"monotone: {k!r}: {v!r}; keys must be in {MONOTONE_FEATURES}, values -1, 0 or 1")
    q = _monotone(q, trials + max(prior_strength, 1e-9), feats, directions)
    q = np.clip(q, 0.0, 1.0)
    meta = dict(fit_meta or {})
    meta.setdefault("prior_strength", prior_strength)
    meta.setdefault("monotone", {k: ("increasing" if v > 0 else "decreasing") for k, v in directions.items() if v})
    meta.setdefault("drafts", len(samples))
    meta.setdefault("trials", int(trials.sum()))
    return CalibrationTable(feats, q, trials, accepts, meta, {})
