"""Triton kernels of the cross-request n-gram corpus; same signatures and semantics as ``corpus_reference.py``.

Insert is three launches (claim, resolve, count), each order-independent (atomic min / add only, and single
writers in the resolve phase), so the table after a call is deterministic on a GPU; the claim launch hashes and
leaves each update's key in a scratch buffer, so the other two start from one load. Lookup is one program per
request walking up to ``max_draft`` positions with its context in registers. Launchers allocate nothing and
never read device data on the host. All hash arithmetic is int64 with every product below ``2**62`` (exact, as in the reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .corpus_reference import CAP, INT32_MAX, P

__all__ = ["corpus_insert_triton", "corpus_lookup_triton", "scratch_size"]


def _pow2(x: int) -> int:
    return max(2, triton.next_power_of_2(max(int(x), 1)))


@triton.jit
def _coefs(coef_ptr, L, kk, lanes):
    """The hash coefficients of the order lanes ``kk`` (lane ``kk`` = distance / order ``kk + 1``)."""
    R1 = tl.load(coef_ptr + 0 * L + 1 + kk, mask=lanes, other=0)
    R2 = tl.load(coef_ptr + 1 * L + 1 + kk, mask=lanes, other=0)
    Q1 = tl.load(coef_ptr + 2 * L + 1 + kk, mask=lanes, other=0)
    Q2 = tl.load(coef_ptr + 3 * L + 1 + kk, mask=lanes, other=0)
    return R1, R2, Q1, Q2


@triton.jit
def _hash(ctx, kv, g, coef_ptr, L, R1, R2, Q1, Q2):
    """``(H1, H2)`` per order lane of the context ``ctx`` (lanes ``kv`` valid, a prefix)."""
    PP: tl.constexpr = 2147483647
    S1 = tl.load(coef_ptr + 4 * L + 0)
    S2 = tl.load(coef_ptr + 4 * L + 1)
    M1 = tl.load(coef_ptr + 4 * L + 2)
    M2 = tl.load(coef_ptr + 4 * L + 3)
    c1 = tl.cumsum(tl.where(kv, ((ctx + 1) * R1) % PP, 0), axis=0)
    c2 = tl.cumsum(tl.where(kv, ((ctx + 1) * R2) % PP, 0), axis=0)
    h1 = ((S1 * g) % PP + Q1 + c1) % PP
    h2 = ((S2 * g) % PP + Q2 + c2) % PP
    return (h1 * M1) % PP, (h2 * M2) % PP


@triton.jit
def _hashes(ctx, kk, kv, g, coef_ptr, L, N_P: tl.constexpr):
    """``(H1, H2)`` per order lane (lane ``kk`` = order ``kk + 1``) of the context ``ctx`` (distance ``kk + 1``)."""
    R1, R2, Q1, Q2 = _coefs(coef_ptr, L, kk, kv)
    return _hash(ctx, kv, g, coef_ptr, L, R1, R2, Q1, Q2)


@triton.jit
def _insert_kernel(
    tag_ptr, tok_ptr, cnt_ptr, claim_ptr, coef_ptr, hist_ptr, lens_ptr, slots_ptr, tenant_ptr, start_ptr,
    counts_ptr, scratch_ptr, num_slots, width, NB, L, max_pos, n_max,
    PHASE: tl.constexpr, FROM_END: tl.constexpr, C: tl.constexpr, N_P: tl.constexpr,
):
    """One history position ``i`` of batch row ``b``, all its context orders (lanes ``kk``). The claim phase
    reads the history and hashes; it leaves each update's entry and tag (``tag << 32 | entry``, -1 = no update)
    and the position's token in ``scratch``, row ``b * max_pos + i`` of ``n_max + 1`` int64, so the resolve and
    count phases start from one load instead of the slot -> length -> history chain."""
    PP: tl.constexpr = 2147483647
    b = tl.program_id(0)
    i = tl.program_id(1)
    kk = tl.arange(0, N_P)
    lanes = kk < n_max
    row_u = b.to(tl.int64) * max_pos + i
    u = row_u * n_max + kk
    srow = scratch_ptr + row_u * (n_max + 1)
    if PHASE == 0:
        s = tl.load(slots_ptr + b).to(tl.int64)
        ok = (s >= 0) & (s < num_slots)
        s = tl.where(ok, s, 0)
        T = tl.where(ok, tl.load(lens_ptr + s).to(tl.int64), 0)
        lo = tl.maximum(T - width, 0)
        c = tl.minimum(tl.maximum(tl.load(counts_ptr + b).to(tl.int64), 0), max_pos)
        if FROM_END:
            p0 = T - c
        else:
            p0 = tl.load(start_ptr + b).to(tl.int64)
        p = p0 + i
        pv = ok & (i < c) & (p >= lo) & (p < T)
        row = hist_ptr + s * width
        pc = tl.where(pv, p, 0)
        t = tl.load(row + pc % width).to(tl.int64)
        q = pc - 1 - kk
        kv = pv & lanes & (q >= lo)
        ctx = tl.load(row + tl.where(kv, q, 0) % width, mask=kv, other=0).to(tl.int64)
        g = (tl.load(tenant_ptr + b).to(tl.int64) & 0x7FFFFFFF) + 1
        H1, H2 = _hashes(ctx, kk, kv, g, coef_ptr, L, N_P)
        RS = tl.load(coef_ptr + 4 * L + 4)
        e = (H1 & (NB - 1)) * C + ((((t + 1) * RS) % PP) & (C - 1))
        gt = H2 + 1
        tl.store(srow + kk, tl.where(kv, (gt << 32) | e, -1), mask=lanes)
        tl.store(srow + n_max, t)
        ctag = tl.load(tag_ptr + e, mask=kv, other=0).to(tl.int64)
        ctok = tl.load(tok_ptr + e, mask=kv, other=0).to(tl.int64)
        ccnt = tl.load(cnt_ptr + e, mask=kv, other=0)
        match = (ctag == gt) & (ctok == t)
        contest = kv & ((match == 0) | (ccnt >= 1073741824))
        tl.atomic_min(claim_ptr + e, u.to(tl.int32), mask=contest)
    else:
        key = tl.load(srow + kk, mask=lanes, other=-1)
        t = tl.load(srow + n_max)
        kv = key >= 0
        e = tl.where(kv, key & 0xFFFFFFFF, 0)
        gt = key >> 32
        ctag = tl.load(tag_ptr + e, mask=kv, other=0).to(tl.int64)
        ctok = tl.load(tok_ptr + e, mask=kv, other=0).to(tl.int64)
        if PHASE == 1:
            # The entry's fields are loaded with the claim, not after it: only the winner of ``e`` writes ``e``
            # in this phase, and a lane uses what it read only where it is that winner.
            cl = tl.load(claim_ptr + e, mask=kv, other=2147483647).to(tl.int64)
            ccnt = tl.load(cnt_ptr + e, mask=kv, other=0)
            win = kv & (cl == u)
            match = (ctag == gt) & (ctok == t)
            half = ccnt >> 1
            take = win & (match == 0) & (half == 0)
            tl.store(tag_ptr + e, gt.to(tl.int32), mask=take)
            tl.store(tok_ptr + e, tl.zeros_like(ccnt) + t.to(tl.int32), mask=take)
            tl.store(cnt_ptr + e, tl.where(take, 0, half), mask=win)
            tl.store(claim_ptr + e, tl.zeros_like(ccnt) + 2147483647, mask=win)  # only this winner reads it
        else:
            hit = kv & (ctag == gt) & (ctok == t)
            tl.atomic_add(cnt_ptr + e, tl.full([N_P], 1, tl.int32), mask=hit)


def scratch_size(bs: int, max_pos: int, n_max: int) -> int:
    """int64 elements the insert's ``scratch`` needs for ``bs`` rows of ``max_pos`` positions."""
    return bs * max_pos * (n_max + 1)


def corpus_insert_triton(
    tag: torch.Tensor,
    tok: torch.Tensor,
    cnt: torch.Tensor,
    claim: torch.Tensor,
    coef: torch.Tensor,
    hist_tokens: torch.Tensor,
    hist_lens: torch.Tensor,
    slots: torch.Tensor,
    tenant: torch.Tensor,
    start: torch.Tensor,
    counts: torch.Tensor,
    max_pos: int,
    n_max: int,
    from_end: bool,
    scratch: torch.Tensor | None = None,
) -> None:
    """Triton twin of :func:`corpus_reference.corpus_insert_ref` (claim, resolve, count launches).

    ``scratch``: int64, at least :func:`scratch_size` elements (the update keys passed between the launches;
    ``NgramCorpus`` keeps one). Required here; the reference takes and ignores it."""
    NB, C = tag.shape
    num_slots, width = hist_tokens.shape
    bs = slots.shape[0]
    if bs == 0 or max_pos <= 0:
        return
    need = scratch_size(bs, max_pos, n_max)
    if scratch is None or scratch.dtype != torch.int64 or scratch.numel() < need or scratch.device != tag.device:
        got = "None" if scratch is None else f"{scratch.dtype} x {scratch.numel()} on {scratch.device}"
        raise ValueError(f"corpus_insert_triton: argument 'scratch' must be int64 with >= {need} elements on "
                         f"{tag.device}, got {got}")
    for phase in range(3):
        _insert_kernel[(bs, max_pos)](
            tag, tok, cnt, claim, coef, hist_tokens, hist_lens, slots, tenant, start, counts, scratch,
            num_slots, width, NB, coef.shape[1], max_pos, n_max,
            PHASE=phase, FROM_END=bool(from_end), C=C, N_P=_pow2(n_max), num_warps=1,
        )


@triton.jit
def _lookup_kernel(
    tag_ptr, tok_ptr, cnt_ptr, coef_ptr, hist_ptr, lens_ptr, slots_ptr, tenant_ptr,
    out_tokens_ptr, out_len_ptr, out_mlen_ptr, out_mcnt_ptr, out_score_ptr, out_q_ptr,
    num_slots, width, NB, L, stride_tb, stride_td, stride_qb, stride_qd, n_max, alpha, tau,
    D: tl.constexpr, D_P: tl.constexpr, C: tl.constexpr, N_P: tl.constexpr,
):
    """One request's draft walk. The context (lane ``kk`` = distance ``kk + 1``) stays in registers and shifts
    by one drafted token per position, so each position costs one round of table loads (tag, count and token
    of every probed entry together), with no store-and-reload of the drafted tokens; the walk stops at the
    first position it does not draft (most walks end after a few positions) and zero-fills the rest."""
    b = tl.program_id(0)
    s = tl.load(slots_ptr + b).to(tl.int64)
    ok = (s >= 0) & (s < num_slots)
    s = tl.where(ok, s, 0)
    T = tl.where(ok, tl.load(lens_ptr + s).to(tl.int64), 0)
    lo = tl.maximum(T - width, 0)
    g = (tl.load(tenant_ptr + b).to(tl.int64) & 0x7FFFFFFF) + 1
    kk = tl.arange(0, N_P)
    ent = tl.arange(0, C)
    hp = T - 1 - kk
    hv = ok & (kk < n_max) & (hp >= lo)
    ctx = tl.load(hist_ptr + s * width + tl.where(hv, hp, 0) % width, mask=hv, other=0).to(tl.int64)
    shift = kk[:, None] == (kk[None, :] + 1)  # new lane kk takes old lane kk - 1
    avail = T - lo  # kept history tokens; each drafted token adds one
    R1, R2, Q1, Q2 = _coefs(coef_ptr, L, kk, kk < n_max)  # loop-invariant
    alive = ok
    surv = tl.full([], 65536, tl.int64)
    score = tl.zeros([], tl.int64)
    length = tl.zeros([], tl.int32)
    m_len = tl.zeros([], tl.int64)
    m_cnt = tl.zeros([], tl.int64)
    tb = out_tokens_ptr + b.to(tl.int64) * stride_tb
    qb = out_q_ptr + b.to(tl.int64) * stride_qb
    j = tl.zeros([], tl.int32)
    while (j < D) & alive:  # stops at the first position not drafted
        kv = (kk < n_max) & (kk < avail + j)
        H1, H2 = _hash(ctx, kv, g, coef_ptr, L, R1, R2, Q1, Q2)
        e = (H1 & (NB - 1))[:, None] * C + ent[None, :]
        etag = tl.load(tag_ptr + e, mask=kv[:, None], other=0).to(tl.int64)
        ecnt = tl.load(cnt_ptr + e, mask=kv[:, None], other=0).to(tl.int64)
        etok = tl.load(tok_ptr + e, mask=kv[:, None], other=0).to(tl.int64)
        m = (etag == (H2 + 1)[:, None]) & kv[:, None] & (ecnt > 0)
        tot = tl.sum(tl.where(m, ecnt, 0), axis=1)
        key = tl.max(tl.where(m, ecnt * C + (C - 1 - ent[None, :]), -1), axis=1)
        has_n = tot > 0
        nsel = tl.max(tl.where(has_n, kk + 1, 0), axis=0)
        pick = ((kk + 1) == nsel) & has_n
        tsel = tl.sum(tl.where(pick, tot, 0), axis=0)
        ksel = tl.sum(tl.where(pick, key, 0), axis=0)
        best = ksel // C
        eidx = C - 1 - (ksel % C)
        tnext = tl.sum(tl.sum(tl.where(pick[:, None] & (ent[None, :] == eidx), etok, 0), axis=1), axis=0)
        q = (best << 16) // (tsel + alpha)
        ns = (surv * q) >> 16
        take = (nsel > 0) & (ns >= tau)
        surv = tl.where(take, ns, surv)
        score += tl.where(take, ns, 0)
        tl.store(tb + j * stride_td, tl.where(take, tnext, 0).to(tl.int32))
        tl.store(qb + j * stride_qd, tl.where(take, q, 0).to(tl.int32))
        first = take & (j == 0)
        m_len = tl.where(first, nsel, m_len).to(tl.int64)
        m_cnt = tl.where(first, tsel, m_cnt)
        length += take.to(tl.int32)
        alive = take
        ctx = tl.where(kk == 0, tnext, tl.sum(tl.where(shift, ctx[None, :], 0), axis=1))
        j += 1
    dd = tl.arange(0, D_P)  # the positions the walk never reached (disjoint from the ones it wrote)
    rest = (dd >= j) & (dd < D)
    tl.store(tb + dd * stride_td, tl.zeros([D_P], tl.int32), mask=rest)
    tl.store(qb + dd * stride_qd, tl.zeros([D_P], tl.int32), mask=rest)
    tl.store(out_len_ptr + b, length)
    tl.store(out_mlen_ptr + b, m_len.to(tl.int32))
    tl.store(out_mcnt_ptr + b, m_cnt.to(tl.int32))
    tl.store(out_score_ptr + b, score.to(tl.int32))


def corpus_lookup_triton(
    tag: torch.Tensor,
    tok: torch.Tensor,
    cnt: torch.Tensor,
    coef: torch.Tensor,
    hist_tokens: torch.Tensor,
    hist_lens: torch.Tensor,
    slots: torch.Tensor,
    tenant: torch.Tensor,
    out_tokens: torch.Tensor,
    out_len: torch.Tensor,
    out_match_len: torch.Tensor,
    out_match_count: torch.Tensor,
    out_score: torch.Tensor,
    out_q: torch.Tensor,
    n_max: int,
    alpha: int,
    tau: int,
) -> None:
    """Triton twin of :func:`corpus_reference.corpus_lookup_ref`: one program per request."""
    NB, C = tag.shape
    num_slots, width = hist_tokens.shape
    bs, D = out_tokens.shape
    if bs == 0:
        return
    _lookup_kernel[(bs,)](
        tag, tok, cnt, coef, hist_tokens, hist_lens, slots, tenant,
        out_tokens, out_len, out_match_len, out_match_count, out_score, out_q,
        num_slots, width, NB, coef.shape[1], out_tokens.stride(0), out_tokens.stride(1),
        out_q.stride(0), out_q.stride(1), n_max, alpha, tau,
        D=D, D_P=_pow2(D), C=C, N_P=_pow2(n_max), num_warps=1,
    )


assert P == 2147483647 and INT32_MAX == 2147483647 and CAP == 1073741824  # the literals in the kernels
