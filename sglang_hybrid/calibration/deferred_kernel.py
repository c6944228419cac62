"""Triton kernel of deferred scoring (``deferred.py``): one launch in place of ``DeferredScoring``'s ~100 torch ops.

``deferred_score_triton`` has the signature of ``DeferredScoring._elems_torch`` (the plain-torch reference, the
code the CPU runs) and the same results bit for bit: every value it writes is the same float32 expression of the
same operands (products with 0/1 masks, ``1 - q``), and the reductions across drafts and requests (the sums over
the ring, the bins' ``index_add_``) stay outside, in the torch ops both paths share (``DeferredScoring._reduce``).

One program per request: its ring of ``D`` pending drafts plus this step's draft (entry ``D``) as a
``[D + 1, L]`` tile, compared with the slot's history ring; it writes each token's evidence and updates the
slot's ring (lengths, scored prefixes, this step's draft into entry ``ptr``, ``ptr`` advanced). Requests of one
batch hold distinct slots, so programs never share a ring row. No allocation, no host read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["deferred_score_triton"]


@triton.jit
def _deferred_score_kernel(
    r_tok, r_q, r_start, r_len, r_done, r_q1, r_ptr,
    slots_ptr, tok_ptr, len_ptr, q_ptr, start_ptr, q1_ptr, hist_ptr, hlen_ptr,
    fail_ptr, ok_ptr, bfail_ptr, bok_ptr, bidx_ptr,
    W, hist_stride, s_tok, c_tok, s_q, c_q, s_q1, c_q1, kf, kmax,
    D: tl.constexpr, L: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, BINS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    s = tl.load(slots_ptr + b).to(tl.int64)
    d = tl.arange(0, BLOCK_D)[:, None]  # entry: 0..D-1 the slot's ring, D this step's draft
    j = tl.arange(0, BLOCK_L)[None, :]
    zero_d = d * 0
    ring = d < D
    new_row = d == D
    cols = j < L
    cell = (d <= D) & cols
    ring_row = (s * D + d) * L + j  # [s, d, j] of a [num_slots, D, L] ring
    tok = tl.where(new_row, tl.load(tok_ptr + b * s_tok + j * c_tok + zero_d, mask=new_row & cols, other=0),
                   tl.load(r_tok + ring_row, mask=ring & cols, other=0))
    q = tl.where(new_row, tl.load(q_ptr + b * s_q + j * c_q + zero_d, mask=new_row & cols, other=0.0),
                 tl.load(r_q + ring_row, mask=ring & cols, other=0.0))
    st = tl.where(new_row, tl.load(start_ptr + b + zero_d, mask=new_row, other=0).to(tl.int64),
                  tl.load(r_start + s * D + d, mask=ring, other=0))
    ln = tl.where(new_row, tl.load(len_ptr + b + zero_d, mask=new_row, other=0).to(tl.int64),
                  tl.load(r_len + s * D + d, mask=ring, other=0))
    done = tl.load(r_done + s * D + d, mask=ring, other=0)  # this step's draft: nothing scored yet
    hlen = tl.load(hlen_ptr + s).to(tl.int64)
    # A token is compared iff j < min(length, known) and its position is still in the history ring.
    known = hlen - st
    lim = tl.minimum(ln, known)
    pos = st + j
    valid = (j < lim) & (pos >= hlen - W) & cell
    htok = tl.load(hist_ptr + s * hist_stride + pos % W, mask=valid, other=0)
    eq = (tok == htok) & valid
    miss = 1 - eq.to(tl.int32)
    run = tl.cumsum(miss, axis=1)  # misses among tokens 0..j
    ok = (run == 0) & cols  # tokens 0..j matched (which implies compared)
    tried = ((run - miss) == 0) & valid  # tokens 0..j-1 matched and j compared
    failed = tried & (run != 0)  # the first failed token
    det = (tl.sum(failed.to(tl.int32), axis=1)[:, None] > 0) | (known >= ln)
    fresh = (j >= done).to(tl.float32)  # compared for the first time
    failed_f, ok_f = failed.to(tl.float32), ok.to(tl.float32)
    out = (b * (D + 1) + d) * L + j
    tl.store(fail_ptr + out, failed_f * q * fresh, mask=cell)
    tl.store(ok_ptr + out, (1.0 - q) * ok_f * fresh, mask=cell)
    if BINS:
        q1 = tl.where(new_row, tl.load(q1_ptr + b * s_q1 + j * c_q1 + zero_d, mask=new_row & cols, other=0.0),
                      tl.load(r_q1 + ring_row, mask=ring & cols, other=0.0))
        k = tl.floor(q1 * kf).to(tl.int64)
        k = tl.minimum(tl.maximum(k, 0), kmax)
        tl.store(bidx_ptr + out, j.to(tl.int64) * (kmax + 1) + k, mask=cell)
        tl.store(bfail_ptr + out, failed_f * fresh * q1, mask=cell)
        tl.store(bok_ptr + out, (1.0 - q1) * (ok_f * fresh), mask=cell)
    # The ring: determined drafts dropped, the open ones' scored prefix noted; this step's draft takes entry ptr.
    new_len = tl.where(det, 0, ln)
    n_len = tl.sum(tl.where(new_row, new_len, 0), axis=0)[None, :]
    n_lim = tl.sum(tl.where(new_row, lim, 0), axis=0)[None, :]
    p = tl.load(r_ptr + s)
    at_p = d == p
    tl.debug_barrier()  # every program's loads of entry p come before its stores
    tl.store(r_len + s * D + d, tl.where(at_p, n_len, new_len), mask=ring)
    tl.store(r_done + s * D + d, tl.where(at_p, n_lim, lim), mask=ring)
    tl.store(r_start + s * D + d, tl.load(start_ptr + b + zero_d, mask=at_p, other=0).to(tl.int64),
             mask=at_p & ring)
    jj = tl.arange(0, BLOCK_L)
    lm = jj < L
    dst = (s * D + p) * L + jj
    tl.store(r_tok + dst, tl.load(tok_ptr + b * s_tok + jj * c_tok, mask=lm, other=0), mask=lm)
    tl.store(r_q + dst, tl.load(q_ptr + b * s_q + jj * c_q, mask=lm, other=0.0), mask=lm)
    if BINS:
        tl.store(r_q1 + dst, tl.load(q1_ptr + b * s_q1 + jj * c_q1, mask=lm, other=0.0), mask=lm)
    tl.store(r_ptr + s, (p + 1) % D)


def deferred_score_triton(rings: tuple, slots: torch.Tensor, tokens: torch.Tensor, length: torch.Tensor,
                          q: torch.Tensor, start: torch.Tensor, q1: torch.Tensor | None, hist_tokens: torch.Tensor,
                          hist_lens: torch.Tensor, fail: torch.Tensor, ok: torch.Tensor, bfail: torch.Tensor,
                          bok: torch.Tensor, bidx: torch.Tensor, bins: int) -> None:
    """Triton twin of ``DeferredScoring._elems_torch``: same arguments, same writes.

    ``rings``: ``(tok [N, D, L] int32, q [N, D, L] f32, start [N, D] i64, length [N, D] i64, done [N, D] i64,
    q1 [N, D, L] f32 (with bins), ptr [N] i64)``, updated in place. ``fail`` / ``ok [bs, D + 1, L]``: each draft
    token's ``q (1 - y)`` / ``(1 - q) y`` where compared for the first time (else 0); with ``bins``, ``bfail`` /
    ``bok`` the same with ``q1`` and ``bidx`` its cell ``j bins + bin(q1)``.
    """
    r_tok, r_q, r_start, r_len, r_done, r_q1, r_ptr = rings
    bs, L = tokens.shape
    D = r_tok.shape[1]
    if bs == 0:
        return
    K = max(int(bins), 1)
    _deferred_score_kernel[(bs,)](
        r_tok, r_q, r_start, r_len, r_done, r_q1, r_ptr,
        slots, tokens, length, q, start, q1 if bins else q, hist_tokens, hist_lens,
        fail, ok, bfail, bok, bidx,
        hist_tokens.shape[1], hist_tokens.stride(0), tokens.stride(0), tokens.stride(1), q.stride(0), q.stride(1),
        q1.stride(0) if bins else 0, q1.stride(1) if bins else 0, float(K), K - 1,
        D=D, L=L, BLOCK_D=triton.next_power_of_2(D + 1), BLOCK_L=max(2, triton.next_power_of_2(L)),
        BINS=bool(bins), enable_fp_fusion=False,  # as the torch path: every product rounded on its own
    )
