"""Triton kernel of the price-based chain selection: one program holds the whole batch.

Same signature and bit-identical results as :func:`select_chains_ref` (the rule is in the package
docstring). The batch is a pair of ``[next_pow2(bs), next_pow2(Lm)]`` register tiles (model and n-gram
chain). Every candidate of both chains becomes a unique int64 key
``(float32 bits of the survival) << 32 | (IDX_MAX - ((position * bs + request) * 2 + chain))`` (survivals
are non-negative, so their bit patterns order like their values; the low half orders ties by position,
then request), -1 for a non-candidate; the union is sorted once, descending, with ``tl.sort`` (bitonic).
An allocation for a choice vector then needs no sort: it gathers each sorted key's request choice
(``tl.gather``), keeps the keys of the chosen chains, and scans them (``tl.cumsum``) for K (budget, or the
first maximum of Theta over the prefix sums) and the K-th key; a row's verify length is the number of its
chosen keys >= that key. A price is a 24-step bisection of row reductions over the tiles. The search
(3 starts, price iterations) keeps the best allocation in registers. Fixed shapes per batch size, no host
synchronisation, no allocation, no scratch memory: CUDA-graph capturable.

Limits: ``next_pow2(bs) * next_pow2(Lm) <= MAX_FLAT_ELEMENTS`` (16384, e.g. bs = 512 x Lm = 32: a sort of
32768 keys in one program, num_warps 32). Not yet compiled or timed on a GPU at the time of writing.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .buffers import MAX_FLAT_ELEMENTS, QSCALE_LOG2, SelectionOutput, flat_size, next_pow2
from .reference import eps_f32
from .validate import SelectionArgumentError, validate_selection_args

__all__ = ["select_chains_triton"]


@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b)


@triton.jit
def _sanitize(a):
    """[0, 1] clamp (NaN, -0.0 -> +0.0) and a running min along the row, as ``sanitize_survival``."""
    a = tl.where(a > 0, a, 0.0)
    a = tl.minimum(a, 1.0)
    return tl.associative_scan(a, 1, _min_combine)


@triton.jit
def _allocate(choice, skey, s_ok, s_req, s_chain, s_q, m_key, m_ok, n_key, n_ok, budget_ptr, sps_ptr, bs,
              USE_BUDGET: tl.constexpr, N2: tl.constexpr, QS: tl.constexpr):
    """Top-K on the chains ``choice`` picks, from the sorted union: (objective f64, K, counts per row)."""
    i = tl.arange(0, N2)
    chosen = s_ok & (s_chain == tl.gather(choice, s_req, 0))
    cnt = tl.cumsum(chosen.to(tl.int32), 0)
    base = bs.to(tl.int64) * QS
    if USE_BUDGET:
        k = tl.minimum(tl.maximum(tl.load(budget_ptr), 0), tl.sum(chosen.to(tl.int32), 0))
    else:
        cs = tl.cumsum(tl.where(chosen, s_q, 0).to(tl.int64), 0)
        sps_i = tl.load(sps_ptr + bs + cnt, mask=chosen, other=0.0)
        theta = tl.where(chosen, (base + cs).to(tl.float64) * sps_i.to(tl.float64), float("-inf"))
        theta0 = base.to(tl.float64) * tl.load(sps_ptr + bs).to(tl.float64)
        tmax = tl.max(theta, 0)
        first = tl.min(tl.where(theta == tmax, i, N2), 0)
        k = tl.where(theta0 >= tmax, 0, tl.sum(tl.where(i == first, cnt, 0), 0))
    admitted = chosen & (cnt <= k)
    obj = (base + tl.sum(tl.where(admitted, s_q, 0).to(tl.int64), 0)).to(tl.float64)
    if not USE_BUDGET:
        obj = obj * tl.load(sps_ptr + bs + k).to(tl.float64)
    # The K-th admitted key; every chosen candidate with a key >= it is admitted (keys are unique).
    thr = tl.max(tl.where(chosen & (cnt == k), skey, -1), 0)
    c = choice[:, None] != 0
    m_adm = m_ok & (~c) & (m_key >= thr) & (k > 0)
    n_adm = n_ok & c & (n_key >= thr) & (k > 0)
    counts = tl.sum(m_adm.to(tl.int32), 1) + tl.sum(n_adm.to(tl.int32), 1)
    return obj, k, counts


@triton.jit
def _choose(m_q, m_ok, n_q, n_ok, lam_q):
    """Per request: 1 (n-gram) iff its surplus at price lam_q is strictly larger than the model's."""
    sur_m = tl.sum(tl.where(m_ok, tl.maximum(m_q - lam_q, 0), 0), 1)
    sur_n = tl.sum(tl.where(n_ok, tl.maximum(n_q - lam_q, 0), 0), 1)
    return (sur_n > sur_m).to(tl.int32)


@triton.jit
def _dual_price(m_q, m_ok, n_q, n_ok, k, QS: tl.constexpr, QS_LOG2: tl.constexpr):
    """Smallest fixed-point price in [0, 2**24] whose demand fits in k (bisection, as the reference).

    Demand at price lam: per request, the number of candidates above lam on the chain ``_choose`` picks
    at lam. (Written out rather than calling helpers: each helper call costs ~1 ms in the interpreter.)
    """
    zero = tl.zeros([], dtype=tl.int64)
    lo = zero
    hi = zero + QS
    for step in range(QS_LOG2 + 1):  # steps 0..QS_LOG2-1 bisect; the last one evaluates price 0
        lam = tl.where(step < QS_LOG2, (lo + hi) >> 1, zero)
        # n-gram iff sum(n-gram surplus terms) - sum(model surplus terms) > 0; two reductions per step
        d = tl.where(n_ok, tl.maximum(n_q - lam, 0), 0) - tl.where(m_ok, tl.maximum(m_q - lam, 0), 0)
        c = tl.sum(d, 1)[:, None] > 0
        above = tl.where(c, n_ok & (n_q > lam), m_ok & (m_q > lam))
        fits = tl.sum(tl.sum(above.to(tl.int32), 1), 0) <= k
        last = step == QS_LOG2
        hi = tl.where(last, tl.where(fits, zero, hi), tl.where(fits, lam, hi))
        lo = tl.where(fits | last, lo, lam)
    return hi


@triton.jit
def _keep(obj, k, counts, choice, b_obj, b_k, b_counts, b_choice):
    better = obj > b_obj
    return (tl.where(better, obj, b_obj), tl.where(better, k, b_k), tl.where(better, counts, b_counts),
            tl.where(better, choice, b_choice))


@triton.jit
def _try_price(lam, m_q, m_ok, n_q, n_ok, skey, s_ok, s_req, s_chain, s_q, m_key, n_key, budget_ptr, sps_ptr, bs,
               b_obj, b_k, b_counts, b_choice, USE_BUDGET: tl.constexpr, N2: tl.constexpr, QS: tl.constexpr):
    """The choices at price ``lam`` and one grid step below, each allocated and kept if better than the best so
    far; also returns the K of the better of the two (the next price iteration's budget)."""
    c1 = _choose(m_q, m_ok, n_q, n_ok, lam)
    o1, k1, n1 = _allocate(c1, skey, s_ok, s_req, s_chain, s_q, m_key, m_ok, n_key, n_ok,
                           budget_ptr, sps_ptr, bs, USE_BUDGET, N2, QS)
    b_obj, b_k, b_counts, b_choice = _keep(o1, k1, n1, c1, b_obj, b_k, b_counts, b_choice)
    c2 = _choose(m_q, m_ok, n_q, n_ok, tl.maximum(lam - 1, 0))
    o2, k2, n2 = _allocate(c2, skey, s_ok, s_req, s_chain, s_q, m_key, m_ok, n_key, n_ok,
                           budget_ptr, sps_ptr, bs, USE_BUDGET, N2, QS)
    b_obj, b_k, b_counts, b_choice = _keep(o2, k2, n2, c2, b_obj, b_k, b_counts, b_choice)
    return b_obj, b_k, b_counts, b_choice, tl.where(o2 > o1, k2, k1)


@triton.jit(do_not_specialize=["bs", "G", "L", "W", "mvl", "eps", "num_iters"])
def _select_chains_kernel(
    mt_ptr, ms_ptr, nt_ptr, ns_ptr, nlen_ptr, budget_ptr, sps_ptr,
    choice_ptr, vlen_ptr, tok_ptr, surv_ptr, price_ptr, used_ptr,
    bs, G, L, W, mvl, eps, num_iters,
    s_mt_r, s_mt_c, s_ms_r, s_ms_c, s_nt_r, s_nt_c, s_ns_r, s_ns_c, s_nl,
    USE_BUDGET: tl.constexpr, BS_P2: tl.constexpr, W_P2: tl.constexpr, QS: tl.constexpr,
    QS_LOG2: tl.constexpr,
):
    N2: tl.constexpr = 2 * BS_P2 * W_P2
    IDX_MAX: tl.constexpr = N2 - 1
    r = tl.arange(0, BS_P2)[:, None]
    j = tl.arange(0, W_P2)[None, :]
    rows = r < bs
    r64 = r.to(tl.int64)
    flat2 = (j * bs + r).to(tl.int64) * 2  # (position * bs + request) * 2 + chain

    m_in = rows & (j < G)
    m_a = _sanitize(tl.load(ms_ptr + r64 * s_ms_r + j * s_ms_c, mask=m_in, other=0.0))
    nlen = tl.load(nlen_ptr + r64 * s_nl, mask=rows, other=0)
    nlen = tl.minimum(tl.maximum(nlen, 0), L)
    n_in = rows & (j < nlen)
    n_a = _sanitize(tl.load(ns_ptr + r64 * s_ns_r + j * s_ns_c, mask=n_in, other=0.0))
    m_ok = m_in & (j < mvl) & (m_a >= eps)
    n_ok = n_in & (j < mvl) & (n_a >= eps)
    m_q = (m_a * QS).to(tl.int64)
    n_q = (n_a * QS).to(tl.int64)

    # Sort both chains' candidates once: key = float bits << 32 | (IDX_MAX - flat index), -1 if not a candidate.
    m_key = tl.where(m_ok, (m_a.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (IDX_MAX - flat2), -1)
    n_key = tl.where(n_ok, (n_a.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (IDX_MAX - flat2 - 1), -1)
    skey = tl.sort(tl.reshape(tl.join(m_key, n_key), (N2,)), 0, descending=True)
    s_ok = skey >= 0
    idx = tl.where(s_ok, IDX_MAX - skey.to(tl.int32), 0)  # low 32 bits (< 2**16 for a candidate)
    s_chain = (idx & 1).to(tl.int32)
    s_req = ((idx >> 1) % bs).to(tl.int32)
    s_q = (tl.where(s_ok, skey, 0) >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    s_q = tl.where(s_ok, (s_q * QS).to(tl.int32), 0)  # <= 2**24: int32 (fewer registers)

    zero = tl.zeros([], dtype=tl.int64)
    b_obj = tl.full([], float("-inf"), dtype=tl.float64)
    b_k = tl.zeros([], dtype=tl.int32)
    b_counts = tl.zeros([BS_P2], dtype=tl.int32)
    b_choice = tl.zeros([BS_P2], dtype=tl.int32)
    c_sum = _choose(m_q, m_ok, n_q, n_ok, zero)
    c_ngram = (tl.sum(n_ok.to(tl.int32), 1) > 0).to(tl.int32)
    for s in range(3):  # starts: all model, larger total survival, n-gram wherever it has a candidate
        choice = tl.where(s == 0, 0, tl.where(s == 1, c_sum, c_ngram))
        obj, k, counts = _allocate(choice, skey, s_ok, s_req, s_chain, s_q, m_key, m_ok, n_key, n_ok,
                                   budget_ptr, sps_ptr, bs, USE_BUDGET, N2, QS)
        b_obj, b_k, b_counts, b_choice = _keep(obj, k, counts, choice, b_obj, b_k, b_counts, b_choice)
        if not USE_BUDGET:
            for _ in range(num_iters):
                lam = _dual_price(m_q, m_ok, n_q, n_ok, k, QS, QS_LOG2)
                b_obj, b_k, b_counts, b_choice, k = _try_price(
                    lam, m_q, m_ok, n_q, n_ok, skey, s_ok, s_req, s_chain, s_q, m_key, n_key, budget_ptr, sps_ptr,
                    bs, b_obj, b_k, b_counts, b_choice, USE_BUDGET, N2, QS)
    if USE_BUDGET:
        lam = _dual_price(m_q, m_ok, n_q, n_ok, tl.maximum(tl.load(budget_ptr), 0), QS, QS_LOG2)
        b_obj, b_k, b_counts, b_choice, _k = _try_price(
            lam, m_q, m_ok, n_q, n_ok, skey, s_ok, s_req, s_chain, s_q, m_key, n_key, budget_ptr, sps_ptr,
            bs, b_obj, b_k, b_counts, b_choice, USE_BUDGET, N2, QS)
    price = _dual_price(m_q, m_ok, n_q, n_ok, b_k, QS, QS_LOG2).to(tl.float32) * (1.0 / QS)

    c = b_choice[:, None] != 0
    rr = tl.arange(0, BS_P2)
    tl.store(choice_ptr + rr, b_choice, mask=rr < bs)
    tl.store(vlen_ptr + rr, b_counts, mask=rr < bs)
    m_tok = tl.load(mt_ptr + r64 * s_mt_r + j * s_mt_c, mask=m_in, other=0)
    n_tok = tl.load(nt_ptr + r64 * s_nt_r + j * s_nt_c, mask=n_in, other=0)
    out_mask = rows & (j < W)
    tl.store(tok_ptr + r64 * W + j, tl.where(c, n_tok, m_tok), mask=out_mask)
    tl.store(surv_ptr + r64 * W + j, tl.where(c, n_a, m_a), mask=out_mask)
    tl.store(price_ptr, price)
    tl.store(used_ptr, b_k)


def _num_warps(n2: int) -> int:
    """Warps for a union of n2 sorted keys (about 32 int64 keys per thread at the top size)."""
    return 4 if n2 <= 1024 else 8 if n2 <= 4096 else 16 if n2 <= 16384 else 32


def select_chains_triton(
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
    """Triton twin of :func:`select_chains_ref` (same arguments, same bits); writes ``out`` in place.

    Needs ``next_pow2(bs) * next_pow2(Lm) <= MAX_FLAT_ELEMENTS`` (16384: bs=512 x Lm=32). CPU tensors
    only work under ``TRITON_INTERPRET=1``.
    """
    shp = validate_selection_args(
        model_tokens, model_surv, ngram_tokens, ngram_surv, ngram_len, budget, sps, out,
        num_iters=num_iters, survival_eps=survival_eps, max_verify_len=max_verify_len,
    )
    n = flat_size(shp.bs, shp.width)
    if n > MAX_FLAT_ELEMENTS:
        raise SelectionArgumentError(
            f"select_chains: argument 'model_tokens' batch of bs={shp.bs} with Lm={shp.width} needs {n} "
            f"elements in the Triton kernel (next_pow2(bs) * next_pow2(Lm)); the maximum is {MAX_FLAT_ELEMENTS}"
        )
    use_budget = budget is not None
    dummy = out.price  # never dereferenced: the constexpr branch that would read it is compiled out
    _select_chains_kernel[(1,)](
        model_tokens, model_surv, ngram_tokens, ngram_surv, ngram_len,
        budget if use_budget else out.budget_used, sps if not use_budget else dummy,
        out.choice, out.verify_len, out.tokens, out.survival, out.price, out.budget_used,
        shp.bs, shp.gamma, shp.ngram_width, shp.width, shp.max_verify_len, eps_f32(survival_eps), num_iters,
        model_tokens.stride(0), model_tokens.stride(1), model_surv.stride(0), model_surv.stride(1),
        ngram_tokens.stride(0), ngram_tokens.stride(1), ngram_surv.stride(0), ngram_surv.stride(1),
        ngram_len.stride(0),
        USE_BUDGET=use_budget, BS_P2=next_pow2(shp.bs), W_P2=next_pow2(shp.width), QS=1 << QSCALE_LOG2,
        QS_LOG2=QSCALE_LOG2,
        num_warps=_num_warps(2 * n),
    )
