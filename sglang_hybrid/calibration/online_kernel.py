"""Triton kernel of the online recalibration's ``apply`` (``online.py``): one launch in place of ~35-49 torch ops.

``online_apply_triton`` and ``online_apply_ref`` (plain torch) have the same signature and give the same results
bit for bit: both evaluate the module docstring's ratios in the same float32 operations and the same order,
with every sum and the running product taken left to right over the positions. (The vectorised torch path in
``OnlineCalibration.apply``, which the CPU runs, sums in torch's own order, so it can differ from these two in
the last bits.) The kernel divides with ``div_rn`` and is launched with ``enable_fp_fusion=False``: a fused
multiply-add would round once where the reference rounds twice.

One program per ``BLOCK_B`` requests, walking the ``L`` positions three times: the traffic's sums, the request's
sums, then the ratios, the second stage by bin and the survivals. It also keeps what ``update`` needs (the
slots, tokens, lengths, the table's ``q`` and, with bins, the first stage's ``q'`` and its bin). No allocation,
no host read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["online_apply_ref", "online_apply_triton", "online_update_triton"]

BLOCK_B = 32


@triton.jit
def _online_apply_kernel(
    e_ptr, o_ptr, ge_ptr, go_ptr, be_ptr, bo_ptr, s,
    slots_ptr, tok_ptr, len_ptr, q_ptr, surv_ptr,
    k_slots, k_tok, k_len, k_q, k_q1, k_bidx,
    bs, L, s_tok, c_tok, s_q, c_q, s_sv, c_sv, rec_stride, kout_stride, kf, kmax,
    BINS: tl.constexpr, BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < bs
    r64 = rows.to(tl.int64)
    slot = tl.load(slots_ptr + r64, mask=live, other=0).to(tl.int64)
    tl.store(k_slots + r64, slot, mask=live)
    tl.store(k_len + r64, tl.load(len_ptr + r64, mask=live, other=0).to(tl.int64), mask=live)
    # The traffic: G = (sum GO + s) / (sum GE + s), times s.
    sum_go = tl.zeros([], dtype=tl.float32)
    sum_ge = tl.zeros([], dtype=tl.float32)
    for j in range(0, L):
        sum_go = sum_go + tl.load(go_ptr + j)
        sum_ge = sum_ge + tl.load(ge_ptr + j)
    sg = tl.math.div_rn(sum_go + s, sum_ge + s) * s
    # The request: R = (sum O + s) / (sum E g + s), times s.
    acc_o = tl.zeros([BLOCK], dtype=tl.float32)
    acc_e = tl.zeros([BLOCK], dtype=tl.float32)
    rec = slot * rec_stride
    for j in range(0, L):
        g = tl.math.div_rn(tl.load(go_ptr + j) + sg, tl.load(ge_ptr + j) + s)
        acc_o = acc_o + tl.load(o_ptr + rec + j, mask=live, other=0.0)
        acc_e = acc_e + tl.load(e_ptr + rec + j, mask=live, other=0.0) * g
    sr = tl.math.div_rn(acc_o + s, acc_e + s) * s
    run = tl.full([BLOCK], 1.0, tl.float32)
    for j in range(0, L):
        g = tl.math.div_rn(tl.load(go_ptr + j) + sg, tl.load(ge_ptr + j) + s)
        o = tl.load(o_ptr + rec + j, mask=live, other=0.0)
        e = tl.load(e_ptr + rec + j, mask=live, other=0.0)
        q = tl.load(q_ptr + r64 * s_q + j * c_q, mask=live, other=0.0)
        tl.store(k_q + r64 * kout_stride + j, q, mask=live)
        tl.store(k_tok + r64 * kout_stride + j, tl.load(tok_ptr + r64 * s_tok + j * c_tok, mask=live, other=0),
                 mask=live)
        r = tl.math.div_rn(sr * g + o, e + s)  # r_j = (O_j + s R g_j) / (E_j + s)
        f = tl.math.div_rn(r, (r - 1.0) * q + 1.0)  # q' = q r / (1 + q (r - 1))
        q = q * f
        if BINS:  # the second stage: q'' = odds(q') times its bin's (BO + s) / (BE + s)
            tl.store(k_q1 + r64 * kout_stride + j, q, mask=live)
            k = tl.floor(q * kf).to(tl.int64)
            cell = j * (kmax + 1) + tl.minimum(tl.maximum(k, 0), kmax)
            tl.store(k_bidx + r64 * kout_stride + j, cell, mask=live)
            rb = tl.math.div_rn(tl.load(bo_ptr + cell, mask=live, other=0.0) + s,
                                tl.load(be_ptr + cell, mask=live, other=0.0) + s)
            rb = tl.math.div_rn(rb, (rb - 1.0) * q + 1.0)
            q = q * rb
            f = f * rb
        run = run * f
        tl.store(q_ptr + r64 * s_q + j * c_q, q, mask=live)
        sv = tl.load(surv_ptr + r64 * s_sv + j * c_sv, mask=live, other=0.0)
        tl.store(surv_ptr + r64 * s_sv + j * c_sv, sv * run, mask=live)


def online_apply_triton(expected: torch.Tensor, observed: torch.Tensor, g_exp: torch.Tensor, g_obs: torch.Tensor,
                        b_exp: torch.Tensor, b_obs: torch.Tensor, strength: float, slots: torch.Tensor,
                        tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor, survival: torch.Tensor,
                        keep_slots: torch.Tensor, keep_tok: torch.Tensor, keep_len: torch.Tensor,
                        keep_q: torch.Tensor, keep_q1: torch.Tensor, keep_bidx: torch.Tensor, bins: int) -> None:
    """Triton twin of :func:`online_apply_ref` (same arguments, same writes, bit for bit)."""
    bs, L = q.shape
    if bs == 0:
        return
    if not (keep_tok.stride(0) == keep_q.stride(0) == keep_q1.stride(0) == keep_bidx.stride(0) and
            keep_q.stride(1) == 1 and expected.stride(1) == 1):
        raise ValueError("online_apply_triton: the keep buffers need one row stride and contiguous rows")
    K = max(int(bins), 1)
    _online_apply_kernel[(triton.cdiv(bs, BLOCK_B),)](
        expected, observed, g_exp, g_obs, b_exp, b_obs, float(strength),
        slots, tokens, length, q, survival,
        keep_slots, keep_tok, keep_len, keep_q, keep_q1, keep_bidx,
        bs, L, tokens.stride(0), tokens.stride(1), q.stride(0), q.stride(1), survival.stride(0), survival.stride(1),
        expected.stride(0), keep_q.stride(0), float(K), K - 1,
        BINS=bool(bins), BLOCK=BLOCK_B, enable_fp_fusion=False,
    )


def online_apply_ref(expected: torch.Tensor, observed: torch.Tensor, g_exp: torch.Tensor, g_obs: torch.Tensor,
                     b_exp: torch.Tensor, b_obs: torch.Tensor, strength: float, slots: torch.Tensor,
                     tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor, survival: torch.Tensor,
                     keep_slots: torch.Tensor, keep_tok: torch.Tensor, keep_len: torch.Tensor,
                     keep_q: torch.Tensor, keep_q1: torch.Tensor, keep_bidx: torch.Tensor, bins: int) -> None:
    """Recalibrate ``q`` / ``survival [bs, L]`` in place from the records (``online.py``'s module docstring).

    ``expected`` / ``observed [N, L]``: the slots' records; ``g_exp`` / ``g_obs [L]``: the traffic's; ``b_exp`` /
    ``b_obs [bins * L]``: the second stage's (read only with ``bins`` > 0). ``keep_*`` (``[bs]`` / ``[bs, L]``,
    rows contiguous): the slots, tokens, lengths, the table's ``q`` and, with bins, the first stage's ``q'`` and
    its cell ``j bins + bin(q')`` (int64), for ``update``. Every sum and the running product go left to right over
    the positions.
    """
    bs, L = q.shape
    f32 = dict(dtype=torch.float32, device=q.device)
    s = torch.tensor(strength, **f32)
    one = torch.ones((), **f32)
    keep_slots.copy_(slots)
    keep_tok.copy_(tokens)
    keep_len.copy_(length)
    keep_q.copy_(q)
    sum_go, sum_ge = torch.zeros((), **f32), torch.zeros((), **f32)
    for j in range(L):
        sum_go, sum_ge = sum_go + g_obs[j], sum_ge + g_exp[j]
    sg = (sum_go + s) / (sum_ge + s) * s
    g = [(g_obs[j] + sg) / (g_exp[j] + s) for j in range(L)]
    idx = keep_slots.to(torch.int64)
    e, o = expected.index_select(0, idx), observed.index_select(0, idx)
    acc_o, acc_e = torch.zeros(bs, **f32), torch.zeros(bs, **f32)
    for j in range(L):
        acc_o = acc_o + o[:, j]
        acc_e = acc_e + e[:, j] * g[j]
    sr = (acc_o + s) / (acc_e + s) * s
    run = torch.ones(bs, **f32)
    K = max(int(bins), 1)
    for j in range(L):
        r = (sr * g[j] + o[:, j]) / (e[:, j] + s)
        f = r / ((r - one) * q[:, j] + one)
        qj = q[:, j] * f
        if bins:
            keep_q1[:, j] = qj
            k = torch.floor(qj * float(K)).to(torch.int64).clamp(0, K - 1) + j * K
            keep_bidx[:, j] = k
            rb = (b_obs[k] + s) / (b_exp[k] + s)
            rb = rb / ((rb - one) * qj + one)
            qj = qj * rb
            f = f * rb
        run = run * f
        q[:, j] = qj
        survival[:, j] = survival[:, j] * run


@triton.jit
def _online_update_kernel(
    slots_ptr, tok_ptr, len_ptr, q_ptr, q1_ptr, cmt_ptr, clen_ptr,
    k_slots, tried_ptr, ok_ptr, bfail_ptr, bok_ptr,
    bs, L, K, s_tok, s_q, s_cmt, c_cmt, s_out,
    BINS: tl.constexpr, BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < bs
    r64 = rows.to(tl.int64)
    tl.store(k_slots + r64, tl.load(slots_ptr + r64, mask=live, other=0).to(tl.int64), mask=live)
    lim = tl.minimum(tl.load(len_ptr + r64, mask=live, other=0).to(tl.int64),
                     tl.load(clen_ptr + r64, mask=live, other=0).to(tl.int64))
    alive = live  # tokens 0..j-1 all matched the commit
    for j in range(0, L):
        inside = live & (j < lim) & (j < K)
        t = tl.load(tok_ptr + r64 * s_tok + j, mask=live, other=0).to(tl.int64)
        c = tl.load(cmt_ptr + r64 * s_cmt + j * c_cmt, mask=live & (j < K), other=0).to(tl.int64)
        m = (t == c) & (j < K)
        ok = alive & m & inside
        failed = (alive & inside & ~ok).to(tl.float32)
        ok_f = ok.to(tl.float32)
        q = tl.load(q_ptr + r64 * s_q + j, mask=live, other=0.0)
        tl.store(tried_ptr + r64 * s_out + j, failed * q, mask=live)
        tl.store(ok_ptr + r64 * s_out + j, ok_f * (1.0 - q), mask=live)
        if BINS:
            q1 = tl.load(q1_ptr + r64 * s_q + j, mask=live, other=0.0)
            tl.store(bfail_ptr + r64 * s_out + j, failed * q1, mask=live)
            tl.store(bok_ptr + r64 * s_out + j, (1.0 - q1) * ok_f, mask=live)
        alive = alive & m


def online_update_triton(slots: torch.Tensor, tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor,
                         q1: torch.Tensor, committed: torch.Tensor, commit_len: torch.Tensor,
                         keep_slots: torch.Tensor, tried: torch.Tensor, ok: torch.Tensor, bfail: torch.Tensor,
                         bok: torch.Tensor, bins: int) -> None:
    """Triton twin of ``OnlineCalibration._update_elems_torch`` (same arguments, same writes, bit for bit):
    each kept draft token's evidence against ``committed[b, :commit_len[b]]``: ``tried [bs, L]`` ``q`` on the
    failed token, ``ok`` ``1 - q`` on the accepted ones, else 0; with ``bins`` the same with ``q1``
    (``bfail`` / ``bok``). ``tokens`` / ``q`` / ``q1`` / the outputs: this record's kept rows (one row stride,
    contiguous rows)."""
    bs, L = tokens.shape
    if bs == 0:
        return
    if not (tokens.stride(0) == q.stride(0) == q1.stride(0) and tried.stride(0) == ok.stride(0) ==
            bfail.stride(0) == bok.stride(0) and tokens.stride(1) == q.stride(1) == tried.stride(1) == 1):
        raise ValueError("online_update_triton: the record's rows need one row stride and contiguous rows")
    _online_update_kernel[(triton.cdiv(bs, BLOCK_B),)](
        slots, tokens, length, q, q1, committed, commit_len,
        keep_slots, tried, ok, bfail, bok,
        bs, L, min(L, committed.shape[1]), tokens.stride(0), q.stride(0), committed.stride(0), committed.stride(1),
        tried.stride(0), BINS=bool(bins), BLOCK=BLOCK_B, enable_fp_fusion=False,
    )
