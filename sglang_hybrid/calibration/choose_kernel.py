"""Triton kernel of the better of two chains per request (``choose.py``): one launch in place of the two sums,
the comparison and the three or four selections.

``choose_rows_triton`` has the signature of ``choose.choose_rows_ref`` and writes the same values bit for bit:
one program per ``BLOCK_B`` requests adds each row's first ``w`` survivals left to right, compares, and copies
the winner's columns (an output may be its ``a`` input: each element is read and written by one lane). Every
2-D tensor needs unit column stride (rows may be views of wider buffers). No allocation, no host read.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

__all__ = ["choose_rows_triton"]

BLOCK_B = 32


@triton.jit
def _choose_kernel(sa_ptr, sb_ptr, ea_ptr, eb_ptr, pick_ptr, ta_ptr, tb_ptr, to_ptr, la_ptr, lb_ptr, lo_ptr,
                   qa_ptr, qb_ptr, qo_ptr, bs, w, Ws, Wt, Wq, s_sa, s_sb, s_ta, s_tb, s_to, s_qa, s_qb, s_qo,
                   HAS_LEN: tl.constexpr, HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < bs
    r = rows.to(tl.int64)
    ea = tl.zeros([BLOCK], dtype=tl.float32)
    eb = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(0, w):
        ea += tl.load(sa_ptr + r * s_sa + j, mask=live, other=0.0)
        eb += tl.load(sb_ptr + r * s_sb + j, mask=live, other=0.0)
    pk = eb > ea
    tl.store(ea_ptr + r, ea, mask=live)
    tl.store(eb_ptr + r, eb, mask=live)
    tl.store(pick_ptr + r, pk, mask=live)
    for j in range(0, Ws):
        a = tl.load(sa_ptr + r * s_sa + j, mask=live, other=0.0)
        b = tl.load(sb_ptr + r * s_sb + j, mask=live, other=0.0)
        tl.store(sa_ptr + r * s_sa + j, tl.where(pk, b, a), mask=live)
    for j in range(0, Wt):
        a = tl.load(ta_ptr + r * s_ta + j, mask=live, other=0)
        b = tl.load(tb_ptr + r * s_tb + j, mask=live, other=0)
        tl.store(to_ptr + r * s_to + j, tl.where(pk, b, a), mask=live)
    if HAS_LEN:
        a = tl.load(la_ptr + r, mask=live, other=0)
        b = tl.load(lb_ptr + r, mask=live, other=0)
        tl.store(lo_ptr + r, tl.where(pk, b, a), mask=live)
    if HAS_Q:
        for j in range(0, Wq):
            a = tl.load(qa_ptr + r * s_qa + j, mask=live, other=0.0)
            b = tl.load(qb_ptr + r * s_qb + j, mask=live, other=0.0)
            tl.store(qo_ptr + r * s_qo + j, tl.where(pk, b, a), mask=live)


def _check(name: str, t: torch.Tensor, like: torch.Tensor) -> None:
    if t.shape != like.shape or t.dim() != like.dim():
        raise ValueError(f"choose_rows_triton: {name} has shape {tuple(t.shape)}, expected {tuple(like.shape)}")
    if t.dim() == 2 and t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"choose_rows_triton: {name} needs unit column stride, got strides {t.stride()}")
    if t.dim() == 1 and t.shape[0] > 1 and t.stride(0) != 1:
        raise ValueError(f"choose_rows_triton: {name} must be contiguous, got stride {t.stride()}")


def choose_rows_triton(surv_a: torch.Tensor, surv_b: torch.Tensor, w: int, e_a: torch.Tensor, e_b: torch.Tensor,
                       pick: torch.Tensor, tok_a: torch.Tensor, tok_b: torch.Tensor, tok_out: torch.Tensor,
                       len_a: Optional[torch.Tensor] = None, len_b: Optional[torch.Tensor] = None,
                       len_out: Optional[torch.Tensor] = None, q_a: Optional[torch.Tensor] = None,
                       q_b: Optional[torch.Tensor] = None, q_out: Optional[torch.Tensor] = None) -> None:
    """Triton twin of ``choose.choose_rows_ref`` (same signature, same values bit for bit)."""
    bs, ws = surv_a.shape
    if not 0 <= w <= ws:
        raise ValueError(f"choose_rows_triton: w={w} outside [0, {ws}]")
    for name, t, like in (("surv_a", surv_a, surv_a), ("surv_b", surv_b, surv_a), ("e_a", e_a, pick),
                          ("e_b", e_b, pick), ("tok_b", tok_b, tok_a), ("tok_out", tok_out, tok_a)):
        _check(name, t, like)
    _check("tok_a", tok_a, tok_a)
    if pick.shape != (bs,):
        raise ValueError(f"choose_rows_triton: pick has shape {tuple(pick.shape)}, expected {(bs,)}")
    has_len, has_q = len_out is not None, q_out is not None
    if has_len:
        for name, t in (("len_a", len_a), ("len_b", len_b), ("len_out", len_out)):
            _check(name, t, pick)
    if has_q:
        for name, t in (("q_a", q_a), ("q_b", q_b), ("q_out", q_out)):
            _check(name, t, q_out)
        if q_out.shape[0] != bs:
            raise ValueError(f"choose_rows_triton: q_out has {q_out.shape[0]} rows, expected {bs}")
    if bs == 0:
        return
    la, lb, lo = (len_a, len_b, len_out) if has_len else (pick, pick, pick)  # unused when not HAS_LEN
    qa, qb, qo = (q_a, q_b, q_out) if has_q else (surv_a, surv_a, surv_a)  # unused when not HAS_Q
    _choose_kernel[(triton.cdiv(bs, BLOCK_B),)](
        surv_a, surv_b, e_a, e_b, pick, tok_a, tok_b, tok_out, la, lb, lo, qa, qb, qo,
        bs, w, ws, tok_a.shape[1], qo.shape[1] if has_q else 0,
        surv_a.stride(0), surv_b.stride(0), tok_a.stride(0), tok_b.stride(0), tok_out.stride(0),
        qa.stride(0), qb.stride(0), qo.stride(0),
        HAS_LEN=has_len, HAS_Q=has_q, BLOCK=BLOCK_B,
    )
