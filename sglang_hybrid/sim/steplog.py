"""A log of the hybrid's model-free candidates at every request-step, beside their true outcomes: the tool for
asking whether a feature would predict the n-gram chains better than the calibrated estimate does.

``StepLogPolicy`` is ``HybridPolicy`` unchanged (same options, same choices, same figures: a test holds it to
that) that also reads the reference output (``clairvoyant``) to write down, for each running request at each
step, the model chain's first confidence and accepted length, and for each model-free candidate (the request's
own-history n-gram, the corpus) its lookup features, its final estimate (after the online calibration and the
agreement with the model chain) and how far the reference accepts it. A yardstick's instrument: no server
sees the reference.

``feature_gains`` then asks, feature by feature, how much a logistic model of "the candidate's first token is
accepted" improves on the calibrated estimate alone (``logit(q0)``): the mean log-loss drop on the logged rows.
A feature that carries nothing the estimate lacks gains about 0. ``calibration_rows`` gives the estimate
against the observed rate by bucket. ``scripts/step_features.py`` runs both on a workload.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from .policies import HybridPolicy, StepInput, StepOutput
from .simulator import accepted_len

__all__ = ["SOURCES", "StepLogPolicy", "calibration_rows", "feature_gains", "fit_logistic"]

SOURCES = ("own", "corpus")
# Per source: draft length, lookup features, final estimate of token 0, expected accepted length (sum of the
# survivals), tokens the reference accepts, token 0 equal to the model chain's.
_CAND = ("len", "match_len", "count", "q0", "expected", "accepted", "agree_model")


class StepLogPolicy(HybridPolicy):
    """``HybridPolicy`` that logs every request-step (see the module docstring); ``table()`` returns the log."""

    clairvoyant = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._rows: list[dict[str, np.ndarray]] = []
        self._cand: dict[int, dict[str, np.ndarray]] = {}
        self._prev: dict[int, int] = {}  # request -> its last own draft's accepted tokens, as verify saw them

    def _reprice(self, inp: StepInput, draft, q: torch.Tensor, surv: torch.Tensor, source: int) -> None:
        super()._reprice(inp, draft, q, surv, source)
        tok = draft.tokens.numpy().astype(np.int64)
        n = draft.length.numpy().astype(np.int64)
        L = tok.shape[1]
        live = np.arange(L)[None, :] < n[:, None]
        # Copies: the draft's tensors are views of lookup buffers that the next lookup overwrites.
        c = {"len": n, "match_len": draft.match_len.numpy().copy(), "count": draft.match_count.numpy().copy(),
             "q0": np.where(n > 0, q[:, 0].numpy(), 0.0), "expected": (surv.numpy() * live).sum(1),
             "accepted": accepted_len(tok, inp.reference, n),
             "agree_model": (n > 0) & (tok[:, 0] == inp.model_tokens[:, 0].numpy()),
             "tokens0": np.where(n > 0, tok[:, 0], -1)}
        if source == 0:
            c["in_prompt"] = draft.in_prompt.numpy().copy()
            c["tokens"] = tok
        self._cand[source] = c

    def step(self, inp: StepInput, history) -> StepOutput:
        if inp.reference is None:
            raise ValueError("StepLogPolicy needs StepInput.reference (run_policy passes it to clairvoyant policies)")
        self._cand = {}
        hist_len = history.lens[inp.slots].numpy().copy()
        out = super().step(inp, history)
        bs = inp.slots.shape[0]
        req = np.asarray(inp.requests, dtype=np.int64)
        mt = inp.model_tokens.numpy().astype(np.int64)
        row = {"request": req, "hist_len": hist_len, "model_conf0": inp.conf[:, 0].numpy(),
               "model_accepted": accepted_len(mt, inp.reference, np.full(bs, mt.shape[1])),
               "prev_own": np.array([self._prev.get(int(r), -1) for r in req], dtype=np.int64)}
        zero = np.zeros(bs)
        for s, name in enumerate(SOURCES):
            c = self._cand.get(s, {})
            for k in _CAND:
                row[f"{name}_{k}"] = np.asarray(c.get(k, zero), dtype=np.float64)
        row["own_in_prompt"] = self._cand[0]["in_prompt"].astype(np.float64)
        t0 = [self._cand.get(s, {}).get("tokens0", np.full(bs, -1)) for s in (0, 1)]
        row["pair_agree"] = ((t0[0] >= 0) & (t0[0] == t0[1])).astype(np.float64)
        pick = self.corpus_cand.pick[:bs].numpy() if self.corpus is not None else np.zeros(bs, dtype=bool)
        row["chosen"] = np.where(out.ngram_chosen.numpy(), np.where(pick, 2, 1), 0).astype(np.float64)
        row["verify_len"] = out.verify_len.numpy().astype(np.float64)
        self._rows.append({k: np.asarray(v, dtype=np.float64) for k, v in row.items()})
        self._req = req
        return out

    def record(self, inp: StepInput, out: StepOutput, committed: torch.Tensor, counts: torch.Tensor) -> None:
        super().record(inp, out, committed, counts)
        # What a server knows of the own draft after verify: its tokens matched against the committed ones
        # (accepted drafts and the bonus), censored at the committed count.
        own = self._cand[0]
        tok, cmt = own["tokens"], committed.numpy().astype(np.int64)
        w = min(tok.shape[1], cmt.shape[1])
        got = accepted_len(tok[:, :w], cmt[:, :w], np.minimum(own["len"], counts.numpy()))
        for r, g, n in zip(self._req, got, own["len"]):
            self._prev[int(r)] = int(g) if n > 0 else -1

    def table(self) -> dict[str, np.ndarray]:
        """The log: one float64 column per field, one row per request-step (empty columns before any step)."""
        if not self._rows:
            return {}
        return {k: np.concatenate([r[k] for r in self._rows]) for k in self._rows[0]}


def fit_logistic(x: np.ndarray, y: np.ndarray, iters: int = 50, ridge: float = 1e-6) -> tuple[np.ndarray, float]:
    """Logistic regression of ``y [n]`` (0/1) on ``x [n, k]`` plus an intercept, by Newton's method: ``(weights
    [k + 1] (intercept first), mean log-loss)``."""
    X = np.column_stack([np.ones(len(y)), x]).astype(np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.zeros(X.shape[1])
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(X @ w, -30, 30)))
        h = X.T @ (X * (p * (1 - p))[:, None]) + ridge * np.eye(X.shape[1])
        step = np.linalg.solve(h, X.T @ (y - p))
        w += step
        if np.abs(step).max() < 1e-10:
            break
    p = np.clip(1.0 / (1.0 + np.exp(-np.clip(X @ w, -30, 30))), 1e-12, 1 - 1e-12)
    return w, float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def default_features(log: dict[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
    """The features ``scripts/step_features.py`` tries for ``source``'s first token."""
    other = SOURCES[1 - SOURCES.index(source)]
    f = {"match_len": log[f"{source}_match_len"], "log_count": np.log1p(log[f"{source}_count"]),
         "length": log[f"{source}_len"], "agree_model": log[f"{source}_agree_model"],
         "model_conf0": log["model_conf0"], "pair_agree": log["pair_agree"],
         f"{other}_absent": (log[f"{other}_len"] == 0).astype(np.float64),
         "prev_own_rejected": (log["prev_own"] == 0).astype(np.float64),
         "prev_own_accepted": (log["prev_own"] > 0).astype(np.float64),
         "log_hist_len": np.log1p(log["hist_len"])}
    if source == "own":
        f["in_prompt"] = log["own_in_prompt"]
    return f


def feature_gains(log: dict[str, np.ndarray], source: str, where: Optional[np.ndarray] = None,
                  features: Optional[dict[str, np.ndarray]] = None) -> list[tuple[str, float, float, float]]:
    """For ``source``'s drafts (``where``: a further row mask), the log-loss of "token 0 accepted" under a
    logistic model on ``logit(q0)`` alone, then with each feature added: ``[(name, log-loss, gain over the
    estimate, the feature's weight)]``, the estimate's own row first (named ``"estimate"``), then every
    feature together (``"all"``). Rows with no draft are left out."""
    m = log[f"{source}_len"] > 0
    if where is not None:
        m = m & where
    y = (log[f"{source}_accepted"][m] >= 1).astype(np.float64)
    base_x = _logit(log[f"{source}_q0"][m])[:, None]
    w, base = fit_logistic(base_x, y)
    out = [("estimate", base, 0.0, float(w[-1]))]
    feats = default_features(log, source) if features is None else features
    cols = []
    for name, f in feats.items():
        col = np.asarray(f, dtype=np.float64)[m]
        cols.append(col)
        w, ll = fit_logistic(np.column_stack([base_x, col]), y)
        out.append((name, ll, base - ll, float(w[-1])))
    if cols:
        w, ll = fit_logistic(np.column_stack([base_x] + cols), y)
        out.append(("all", ll, base - ll, float("nan")))
    return out


def calibration_rows(log: dict[str, np.ndarray], source: str, edges: Sequence[float] = (0, .1, .3, .6, 1.0001),
                     where: Optional[np.ndarray] = None) -> list[tuple[float, float, int, float, float]]:
    """``source``'s first-token estimate against the observed rate, by bucket of the estimate: ``[(lo, hi,
    drafts, mean q0, observed P(token 0 accepted))]`` (empty buckets left out)."""
    m = log[f"{source}_len"] > 0
    if where is not None:
        m = m & where
    q0, ok = log[f"{source}_q0"], log[f"{source}_accepted"] >= 1
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        b = m & (q0 >= lo) & (q0 < hi)
        if b.any():
            rows.append((float(lo), float(hi), int(b.sum()), float(q0[b].mean()), float(ok[b].mean())))
    return rows
