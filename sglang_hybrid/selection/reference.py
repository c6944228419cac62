"""Plain-torch reference of the price-based chain selection (the rule is in the package docstring).

Vectorised over the batch, no host synchronisation (the budget K, the price and the admitted set stay
device tensors), so it also serves CPU users and ``backend="torch"`` on a GPU. It defines the semantics
the Triton kernel in ``triton_kernel.py`` reproduces bit for bit.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .buffers import QSCALE, QSCALE_LOG2, SelectionOutput
from .validate import validate_selection_args

__all__ = ["select_chains_ref", "sanitize_survival", "eps_f32"]


def eps_f32(survival_eps: float) -> float:
    """``survival_eps`` rounded to float32: both backends compare float32 survivals against this value."""
    return float(np.float32(survival_eps))  # rounded to float32 on the host: no tensor, no device read


def sanitize_survival(a: torch.Tensor) -> torch.Tensor:
    """Clamp survivals to [0, 1] (NaN and -0.0 become +0.0), then a running min along each row."""
    a = torch.where(a > 0, a, torch.zeros_like(a))
    a = torch.minimum(a, torch.ones_like(a))
    return torch.cummin(a, dim=1).values


def _chains(model_tokens, model_surv, ngram_tokens, ngram_surv, ngram_len, width, mvl, eps):
    """Both chains padded to ``width`` columns: tokens, survivals, candidate masks, fixed-point values."""
    bs, G = model_surv.shape
    L = ngram_surv.shape[1]
    dev = model_surv.device
    j = torch.arange(width, device=dev).view(1, width)
    pad_m, pad_n = width - G, width - L
    m_tok = torch.nn.functional.pad(model_tokens, (0, pad_m))
    m_a = torch.nn.functional.pad(sanitize_survival(model_surv), (0, pad_m))
    m_in = (j < G).expand(bs, width)
    nlen = ngram_len.to(torch.int64).clamp(0, L).view(bs, 1)
    n_in = j < nlen
    n_tok = torch.nn.functional.pad(ngram_tokens, (0, pad_n)) * n_in
    n_raw = torch.nn.functional.pad(ngram_surv, (0, pad_n))
    n_a = sanitize_survival(torch.where(n_in, n_raw, torch.zeros_like(n_raw)))
    m_ok = m_in & (j < mvl) & (m_a >= eps)
    n_ok = n_in & (j < mvl) & (n_a >= eps)
    m_q = (m_a * QSCALE).to(torch.int64)
    n_q = (n_a * QSCALE).to(torch.int64)
    return (m_tok, m_a, m_ok, m_q), (n_tok, n_a, n_ok, n_q)


class _Union:
    """Both chains' candidates of the whole batch, sorted once in the admission order."""

    def __init__(self, m_a, m_ok, n_a, n_ok):
        bs, width = m_a.shape
        # Flat index (position * bs + request) * 2 + chain: a stable descending sort orders ties by
        # position, then request (the chain bit never decides: a request uses one chain at a time).
        a = torch.stack([m_a, n_a], dim=2).transpose(0, 1).reshape(-1)
        ok = torch.stack([m_ok, n_ok], dim=2).transpose(0, 1).reshape(-1)
        vals = torch.where(ok, a, torch.full_like(a, float("-inf")))
        sorted_vals, order = torch.sort(vals, descending=True, stable=True)
        self.bs = bs
        self.ok = ok[order]
        self.req = (order // 2) % bs
        self.chain = (order % 2).to(torch.bool)
        self.q = torch.where(self.ok, (sorted_vals.clamp(min=0) * QSCALE).to(torch.int64), 0)

    def allocate(self, choice: torch.Tensor, budget: Optional[torch.Tensor], sps: Optional[torch.Tensor]):
        """Top-K on the chains ``choice`` picks: (objective float64 [1], K int64 [1], counts int32 [bs])."""
        bs = self.bs
        base = bs * (1 << QSCALE_LOG2)
        chosen = self.ok & (self.chain == choice[self.req])
        cnt = torch.cumsum(chosen.to(torch.int64), 0)
        if budget is not None:
            k = torch.minimum(budget.to(torch.int64).clamp(min=0), cnt[-1:])
        else:
            cs = torch.cumsum(torch.where(chosen, self.q, 0), 0)
            theta = (cs + base).to(torch.float64) * sps[bs + cnt].to(torch.float64)
            theta = torch.where(chosen, theta, torch.full_like(theta, float("-inf")))
            theta0 = float(base) * sps[bs : bs + 1].to(torch.float64)
            first = torch.argmax(theta).view(1)  # first maximum; chosen entries have increasing cnt
            # gather, not theta[first]: indexing by a 0-d tensor may read it on the host
            k = torch.where(theta0 >= theta.gather(0, first), 0, cnt.gather(0, first))
        admitted = chosen & (cnt <= k)
        s_k = torch.where(admitted, self.q, 0).sum().view(1)
        obj = (s_k + base).to(torch.float64)
        if sps is not None:
            obj = obj * sps[bs + k].to(torch.float64)
        counts = torch.zeros(bs, dtype=torch.int64, device=choice.device).scatter_add_(
            0, self.req, admitted.to(torch.int64))
        return obj, k, counts.to(torch.int32)


def _choose(m_q, m_ok, n_q, n_ok, lam_q):
    """Per request: n-gram iff its surplus at price lam_q is strictly larger (ties to the model)."""
    sur_m = torch.where(m_ok, (m_q - lam_q.view(-1, 1)).clamp(min=0), 0).sum(1)
    sur_n = torch.where(n_ok, (n_q - lam_q.view(-1, 1)).clamp(min=0), 0).sum(1)
    return sur_n > sur_m


def _dual_price_bisect(m_q, m_ok, n_q, n_ok, k):
    """Smallest fixed-point price lam in [0, 2**24] whose demand fits in k (24-step bisection, as the Triton
    kernel and the oracle run it). Kept as the definition :func:`_dual_price` is tested against."""

    def fits(lam_q):
        c = _choose(m_q, m_ok, n_q, n_ok, lam_q)
        cnt_m = (m_ok & (m_q > lam_q.view(-1, 1))).sum(1)
        cnt_n = (n_ok & (n_q > lam_q.view(-1, 1))).sum(1)
        return torch.where(c, cnt_n, cnt_m).sum().view(1) <= k

    zero = torch.zeros(1, dtype=torch.int64, device=m_q.device)
    lo, hi = zero, zero + (1 << QSCALE_LOG2)
    for _ in range(QSCALE_LOG2):
        mid = (lo + hi) >> 1
        f = fits(mid)
        hi = torch.where(f, mid, hi)
        lo = torch.where(f, lo, mid)
    return torch.where(fits(zero), zero, hi)


# The price search tests 2**b grid prices at once per level (24 / b levels): the widest b in _RADIX_CHOICES
# whose [2**b, bs, Lm] temporaries stay within _RADIX_ELEMS elements (few large ops beat many small ones).
_RADIX_CHOICES = (12, 8, 6, 4)
_RADIX_ELEMS = 1 << 16


def _radix_log2(numel: int) -> int:
    for b in _RADIX_CHOICES:
        if (numel << b) <= _RADIX_ELEMS:
            return b
    return _RADIX_CHOICES[-1]


def _dual_price(m_q, m_ok, n_q, n_ok, k):
    """The same price as :func:`_dual_price_bisect`, found 2**b prices at a time (24 / b levels, not 25 steps).

    Both return the smallest grid price whose demand fits in k, because the demand is non-increasing in the
    price: a request's count on its chain only falls as the price rises, and when its choice flips between two
    consecutive grid prices, the surplus difference moved towards the new chain, which needs the new chain to
    have fewer tokens above the price than the old one had (the slope of a surplus is minus its count). So a
    bisection and this 2**b-way search find the same crossing. ``tests/test_selection_reference_price.py``
    compares them on random instances.
    """
    dev = m_q.device
    b = _radix_log2(m_q.numel())
    radix = 1 << b
    t = torch.arange(radix, dtype=torch.int64, device=dev)
    mq = torch.where(m_ok, m_q, -1).unsqueeze(0)  # non-candidates never earn surplus nor count
    nq = torch.where(n_ok, n_q, -1).unsqueeze(0)

    def fits(lam):  # lam [radix] -> [radix] bool
        lm = lam.view(-1, 1, 1)
        sur_m = (mq - lm).clamp_(min=0).sum(2)
        sur_n = (nq - lm).clamp_(min=0).sum(2)
        demand = torch.where(sur_n > sur_m, (nq > lm).sum(2), (mq > lm).sum(2)).sum(1)
        return demand <= k

    lo = torch.zeros(1, dtype=torch.int64, device=dev)
    fits0 = None
    for level in range(QSCALE_LOG2 // b):
        step = 1 << (QSCALE_LOG2 - b * (level + 1))
        f = fits(lo + t * step)
        if fits0 is None:
            fits0 = f[:1].clone()
        f[0] = False  # lo itself: not fitting (or 0, decided by fits0)
        # first fitting point (radix if none: lo + radix * step, the previous level's fitting point)
        first = torch.where(f.any(), torch.argmax(f.to(torch.uint8)), radix).view(1)
        lo = lo + (first - 1) * step
    hi = lo + 1
    return torch.where(fits0, torch.zeros_like(hi), hi)


def select_chains_ref(
    model_tokens: torch.Tensor,
    model_surv: torch.Tensor,
    ngram_tokens: torch.Tensor,
    ngram_surv: torch.Tensor,
    ngram_len: torch.Tensor,
    budget: Optional[torch.Tensor],
    sps: Optional[torch.Tensor],
    out: SelectionOutput,
    *,
    num_iters: int = 2,
    survival_eps: float = 1e-6,
    max_verify_len: int = 0,
) -> None:
    """Price-based choice between each request's model and n-gram chain; writes ``out`` in place.

    Args:
        model_tokens: [bs, G] int32 model draft tokens. model_surv: [bs, G] float32 prefix survivals.
        ngram_tokens: [bs, L] int32 n-gram draft tokens. ngram_surv: [bs, L] float32 prefix survivals;
            columns ``j >= ngram_len[r]`` are ignored. ngram_len: [bs] int32 (clamped to [0, L]).
        budget: [1] int32 verify budget K in draft tokens over the batch (roots excluded), or None.
        sps: dense float32 steps/sec indexed by verify batch tokens B (``dense_sps``), or None.
            Exactly one of ``budget`` / ``sps`` is given.
        out: :class:`SelectionOutput` of width ``Lm = max(G, L)`` (see ``SelectionBuffers.view``).
        num_iters: SPS mode: price iterations per start (budget mode needs none; see the package doc).
        survival_eps: survivals below it are never admitted.
        max_verify_len: cap on each request's verify length (0 = Lm).
    """
    shp = validate_selection_args(
        model_tokens, model_surv, ngram_tokens, ngram_surv, ngram_len, budget, sps, out,
        num_iters=num_iters, survival_eps=survival_eps, max_verify_len=max_verify_len,
    )
    bs, width = shp.bs, shp.width
    dev = model_tokens.device
    (m_tok, m_a, m_ok, m_q), (n_tok, n_a, n_ok, n_q) = _chains(
        model_tokens, model_surv, ngram_tokens, ngram_surv, ngram_len, width, shp.max_verify_len,
        eps_f32(survival_eps),
    )
    union = _Union(m_a, m_ok, n_a, n_ok)
    zero = torch.zeros(1, dtype=torch.int64, device=dev)
    best = [torch.full((1,), float("-inf"), dtype=torch.float64, device=dev),
            torch.zeros(bs, dtype=torch.bool, device=dev), zero, torch.zeros(bs, dtype=torch.int32, device=dev)]

    def consider(choice):
        obj, k, counts = union.allocate(choice, budget, sps)
        better = obj > best[0]
        best[0] = torch.where(better, obj, best[0])
        best[1] = torch.where(better, choice, best[1])
        best[2] = torch.where(better, k, best[2])
        best[3] = torch.where(better, counts, best[3])
        return obj, k

    def choose(lam_q):
        return _choose(m_q, m_ok, n_q, n_ok, lam_q)

    starts = (torch.zeros(bs, dtype=torch.bool, device=dev), choose(zero), n_ok.any(1))
    if budget is not None:
        for c in starts:
            consider(c)
        lam = _dual_price(m_q, m_ok, n_q, n_ok, budget.to(torch.int64).clamp(min=0))
        consider(choose(lam))
        consider(choose((lam - 1).clamp(min=0)))
    else:
        for c in starts:
            _, k = consider(c)
            for _ in range(num_iters):
                lam = _dual_price(m_q, m_ok, n_q, n_ok, k)
                o1, k1 = consider(choose(lam))
                o2, k2 = consider(choose((lam - 1).clamp(min=0)))
                k = torch.where(o2 > o1, k2, k1)
    _, choice, k, counts = best
    price = _dual_price(m_q, m_ok, n_q, n_ok, k).to(torch.float32) * (1.0 / QSCALE)
    c = choice.view(bs, 1)
    out.choice.copy_(choice)
    out.verify_len.copy_(counts)
    out.tokens.copy_(torch.where(c, n_tok, m_tok))
    out.survival.copy_(torch.where(c, n_a, m_a))
    out.price.copy_(price)
    out.budget_used.copy_(k)
