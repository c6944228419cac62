"""Brute-force oracles for the chain selection (plain Python loops over small batches).

* :func:`rule_oracle` re-implements the selection rule (``sglang_hybrid/selection/__init__.py``) with
  sorted tuples and Python integers; the torch reference must match it exactly (choice, verify lengths,
  K, price).
* :func:`optimum` is the true optimum over all 2**bs chain choices. For a fixed choice, the best
  allocation of k verified draft tokens is the top-k candidate survivals (every row is non-increasing,
  so the top-k are prefixes), so scanning k (SPS mode) or taking k = min(budget, #candidates) (budget
  mode) makes the oracle exact (float64 sums).
* :func:`theta_of` evaluates an allocation's objective in float64: tau = bs + admitted survivals, times
  sps[bs + K] in SPS mode (budget mode: tau alone, the step cost being fixed by the budget).
* :func:`literal_rule_oracle` is the first-draft rule (price = the K-th admitted survival), kept only to
  print how much worse it is.
* :func:`random_instance` / :func:`random_sps_curve` generate the random test inputs.
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence

import numpy as np
import torch

QS = 1 << 24

__all__ = [
    "best_for_choice",
    "chains",
    "dual_price",
    "literal_rule_oracle",
    "optimum",
    "random_instance",
    "random_sps_curve",
    "rule_oracle",
    "theta_of",
]


def _f32(x: float) -> float:
    return float(np.float32(x))


def _sanitize(row: Sequence[float]) -> list[float]:
    out, run = [], 1.0
    for a in row:
        a = float(a)
        a = a if a > 0 else 0.0  # NaN, negatives, -0.0 -> +0.0
        a = min(a, 1.0)
        run = min(run, a)
        out.append(run)
    return out


def chains(model_surv: torch.Tensor, ngram_surv: torch.Tensor, ngram_len: torch.Tensor,
           max_verify_len: int = 0, survival_eps: float = 1e-6):
    """Per request and chain (0 = model, 1 = n-gram): (survivals padded to Lm, candidate flags)."""
    bs, G = model_surv.shape
    L = ngram_surv.shape[1]
    W = max(G, L)
    mvl = max_verify_len or W
    eps = _f32(survival_eps)
    out = []
    for r in range(bs):
        n = min(max(int(ngram_len[r]), 0), L)
        m = _sanitize(model_surv[r].tolist()) + [0.0] * (W - G)
        g = _sanitize(ngram_surv[r, :n].tolist()) + [0.0] * (W - n)
        m_ok = [j < G and j < mvl and m[j] >= eps for j in range(W)]
        g_ok = [j < n and j < mvl and g[j] >= eps for j in range(W)]
        out.append(((m, m_ok), (g, g_ok)))
    return out


def _q(a: float) -> int:
    return int(np.float32(a) * np.float32(QS))


def _allocate(rows, bs: int, budget: Optional[int], sps: Optional[Sequence[float]]):
    """Allocation on fixed merged rows: (objective as the backends compute it, K, survival of the best
    candidate left out (0.0 if none), verify lens)."""
    cands = [(-a, j, r) for r, (a_row, ok_row) in enumerate(rows) for j, (a, ok) in enumerate(zip(a_row, ok_row)) if ok]
    cands.sort()
    n = len(cands)
    if budget is not None:
        k = min(max(budget, 0), n)
        obj = float(bs * QS + sum(_q(-c[0]) for c in cands[:k]))
    else:
        obj, k, s = None, 0, 0
        for kk in range(n + 1):
            if kk > 0:
                s += _q(-cands[kk - 1][0])
            theta = float(bs * QS + s) * float(sps[bs + kk])
            if obj is None or theta > obj:
                obj, k = theta, kk
    lens = [0] * bs
    for _, _, r in cands[:k]:
        lens[r] += 1
    lam = -cands[k][0] if k < n else 0.0
    return obj, k, lam, lens


def _surplus(a_row, ok_row, lam_q: int) -> int:
    return sum(max(0, _q(a) - lam_q) for a, ok in zip(a_row, ok_row) if ok)


def _choose(ch, lam_q: int) -> list[int]:
    return [1 if _surplus(*g, lam_q) > _surplus(*m, lam_q) else 0 for m, g in ch]


def _demand(ch, lam_q: int) -> int:
    c = _choose(ch, lam_q)
    return sum(1 for r in range(len(ch)) for a, ok in zip(*ch[r][c[r]]) if ok and _q(a) > lam_q)


def dual_price(ch, k: int) -> int:
    """Smallest fixed-point price whose demand fits in k (bisection exactly as the backends run it)."""
    if _demand(ch, 0) <= k:
        return 0
    lo, hi = 0, QS
    for _ in range(24):
        mid = (lo + hi) >> 1
        if _demand(ch, mid) <= k:
            hi = mid
        else:
            lo = mid
    return hi


def rule_oracle(model_surv, ngram_surv, ngram_len, budget: Optional[int], sps: Optional[Sequence[float]], *,
                num_iters: int = 2, survival_eps: float = 1e-6, max_verify_len: int = 0):
    """The selection rule in plain Python: returns (choice, verify_len, K, price) of the kept allocation."""
    ch = chains(model_surv, ngram_surv, ngram_len, max_verify_len, survival_eps)
    bs = len(ch)
    best = None

    def consider(choice):
        nonlocal best
        obj, k, _, lens = _allocate([ch[r][choice[r]] for r in range(bs)], bs, budget, sps)
        if best is None or obj > best[0]:
            best = (obj, list(choice), lens, k)
        return obj, k

    starts = ([0] * bs, _choose(ch, 0), [1 if any(g[1]) else 0 for m, g in ch])
    if budget is not None:
        for c in starts:
            consider(c)
        lam = dual_price(ch, max(budget, 0))
        consider(_choose(ch, lam))
        consider(_choose(ch, max(lam - 1, 0)))
    else:
        for c in starts:
            _, k = consider(c)
            for _ in range(num_iters):
                lam = dual_price(ch, k)
                o1, k1 = consider(_choose(ch, lam))
                o2, k2 = consider(_choose(ch, max(lam - 1, 0)))
                k = k2 if o2 > o1 else k1
    _, choice, lens, k = best
    return choice, lens, k, dual_price(ch, k) / QS


def best_for_choice(rows, bs: int, budget: Optional[int], sps: Optional[Sequence[float]]) -> float:
    """Exact best objective for fixed merged rows (float64 sums)."""
    vals = sorted((a for a_row, ok_row in rows for a, ok in zip(a_row, ok_row) if ok), reverse=True)
    if budget is not None:
        return bs + sum(vals[: min(max(budget, 0), len(vals))])
    best, s = -1.0, 0.0
    for k in range(len(vals) + 1):
        if k > 0:
            s += vals[k - 1]
        best = max(best, (bs + s) * float(sps[bs + k]))
    return best


def optimum(model_surv, ngram_surv, ngram_len, budget: Optional[int], sps: Optional[Sequence[float]], *,
            survival_eps: float = 1e-6, max_verify_len: int = 0) -> tuple[float, tuple[int, ...]]:
    """Best objective over all 2**bs chain choices, and a choice attaining it."""
    ch = chains(model_surv, ngram_surv, ngram_len, max_verify_len, survival_eps)
    bs = len(ch)
    best, arg = -1.0, None
    for choice in itertools.product((0, 1), repeat=bs):
        v = best_for_choice([ch[r][choice[r]] for r in range(bs)], bs, budget, sps)
        if v > best:
            best, arg = v, choice
    return best, arg


def theta_of(survival: torch.Tensor, verify_len: torch.Tensor, budget_used: int,
             sps: Optional[Sequence[float]]) -> float:
    """Objective of an allocation: tau = bs + sum of admitted survivals (float64), times sps[bs + K]."""
    bs = survival.shape[0]
    tau = bs + sum(float(survival[r, j]) for r in range(bs) for j in range(int(verify_len[r])))
    return tau if sps is None else tau * float(sps[bs + budget_used])


def literal_rule_oracle(model_surv, ngram_surv, ngram_len, budget: Optional[int], sps: Optional[Sequence[float]], *,
                        num_iters: int = 2, survival_eps: float = 1e-6, max_verify_len: int = 0):
    """The first-draft rule, kept for comparison only: lambda = the K-th admitted survival (1.0 if K = 0),
    all-model start, num_iters surplus iterations, the last allocation returned. Returns (choice, lens, K)."""
    ch = chains(model_surv, ngram_surv, ngram_len, max_verify_len, survival_eps)
    bs = len(ch)
    choice = [0] * bs

    def alloc(choice):
        rows = [ch[r][choice[r]] for r in range(bs)]
        cands = sorted((-a, j, r) for r, (ar, okr) in enumerate(rows) for j, (a, ok) in enumerate(zip(ar, okr)) if ok)
        _, k, _, lens = _allocate(rows, bs, budget, sps)
        return k, (-cands[k - 1][0] if k > 0 else 1.0), lens

    k, lam, lens = alloc(choice)
    for _ in range(num_iters):
        choice = _choose(ch, _q(lam))
        k, lam, lens = alloc(choice)
    return choice, lens, k


# ---- random instances -------------------------------------------------------------------------------


def random_instance(rng: np.random.Generator, bs: Optional[int] = None, gamma: Optional[int] = None,
                    ngram_width: Optional[int] = None, max_bs: int = 6):
    """A random selection input: model chains are cumprods of Beta acceptances; each request's n-gram chain
    is strong (0.8-1 per token), weak (0-0.9) or absent; one in five instances is rounded to quarters
    (many exact ties). Returns (model_tokens, model_surv, ngram_tokens, ngram_surv, ngram_len)."""
    bs = bs or int(rng.integers(1, max_bs + 1))
    G = gamma or int(rng.integers(1, 6))
    L = ngram_width or int(rng.integers(1, 7))
    acc = rng.beta(rng.uniform(0.5, 5), rng.uniform(0.5, 3), size=(bs, G))
    ms = np.cumprod(acc, 1)
    kind = rng.integers(0, 3, size=bs)
    q = np.where(kind[:, None] == 0, rng.uniform(0.8, 1.0, (bs, L)), rng.uniform(0.0, 0.9, (bs, L)))
    ns = np.cumprod(q, 1)
    nl = np.where(kind == 2, 0, rng.integers(0, L + 1, size=bs))
    if rng.random() < 0.2:
        ms, ns = np.round(ms * 4) / 4, np.round(ns * 4) / 4
    mt = torch.tensor(rng.integers(1, 50, (bs, G)), dtype=torch.int32)
    nt = torch.tensor(rng.integers(1, 50, (bs, L)), dtype=torch.int32)
    return (mt, torch.tensor(ms, dtype=torch.float32), nt, torch.tensor(ns, dtype=torch.float32),
            torch.tensor(nl, dtype=torch.int32))


def random_sps_curve(rng: np.random.Generator, n: int) -> torch.Tensor:
    """A random, roughly decreasing steps/sec curve of n entries: flat-then-linear (roofline-like), a power
    law, or the floor-probe steps of a coarse table; each with +-2% noise (so not exactly monotone)."""
    b = np.arange(n, dtype=np.float64)
    kind = rng.integers(0, 3)
    if kind == 0:
        t = 1 + rng.uniform(0.01, 0.3) * np.maximum(0, b - rng.uniform(0, 20))
    elif kind == 1:
        t = 1 + rng.uniform(0.01, 0.2) * b ** rng.uniform(0.5, 1.5)
    else:
        probes = np.sort(rng.choice(np.arange(1, n), size=min(n - 1, 5), replace=False))
        probes[0] = 1
        vals = 1 + rng.uniform(0.02, 0.3) * probes
        t = vals[np.clip(np.searchsorted(probes, b, side="right") - 1, 0, len(probes) - 1)]
    t = t * (1 + rng.uniform(-0.02, 0.02, size=n))
    return torch.tensor(1.0 / t, dtype=torch.float32)
