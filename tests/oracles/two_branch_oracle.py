"""Exhaustive optimum of the two-branch selection on small batches (plain Python loops).

Per request the options are: the model chain's prefix of length ``lm`` alone (``0..G``), the n-gram chain's
prefix of length ``ln`` alone (``1..len``), or both (``lm >= 1`` and ``ln >= 1``, only when the chains' first
tokens differ), valued as ``sglang_hybrid/selection/two_branch.py`` defines: one chain, the sum of its
(sanitised) survivals; both, the sum of both, scaled by ``1 / (a^M_1 + a^N_1)`` when that exceeds 1. The
objective is ``(bs + sum of values) * sps[bs + total verified]``; the oracle enumerates every combination.
"""

from __future__ import annotations

import itertools


def _sanitize(row):
    out, m = [], 1.0
    for a in row:
        a = min(max(float(a), 0.0), 1.0)
        m = min(m, a)
        out.append(m)
    return out


def options(sm, sn, nlen, eligible, mvl, eps=1e-6):
    """Every (lm, ln, value) of one request."""
    G = len(sm)
    sm = _sanitize(sm)
    sn = _sanitize([a if j < nlen else 0.0 for j, a in enumerate(sn)])
    max_m = max([j + 1 for j in range(min(G, mvl)) if sm[j] >= eps] + [0])
    max_n = max([j + 1 for j in range(min(nlen, mvl)) if sn[j] >= eps] + [0])
    first = sm[0] + (sn[0] if nlen > 0 else 0.0)
    scale = 1.0 / first if first > 1.0 else 1.0
    opts = [(lm, 0, sum(sm[:lm])) for lm in range(max_m + 1)]
    opts += [(0, ln, sum(sn[:ln])) for ln in range(1, max_n + 1)]
    if eligible:
        opts += [(lm, ln, (sum(sm[:lm]) + sum(sn[:ln])) * scale)
                 for lm in range(1, max_m + 1) for ln in range(1, max_n + 1)]
    return opts


def optimum(model_surv, ngram_surv, ngram_len, eligible, sps, mvl):
    """Best objective over all per-request options (float)."""
    bs = len(model_surv)
    per = [options(model_surv[r], ngram_surv[r], ngram_len[r], eligible[r], mvl) for r in range(bs)]
    best = -1.0
    for combo in itertools.product(*per):
        k = sum(o[0] + o[1] for o in combo)
        best = max(best, (bs + sum(o[2] for o in combo)) * float(sps[bs + k]))
    return best
