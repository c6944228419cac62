"""Triton kernels of the model-agreement rules (``agreement.py``): one launch each in place of ``ModelAgreement``'s
elementwise torch ops (``apply`` about 22 ops per call, ``share`` about 50, ``update`` about 20).

Each launcher has the signature of the torch method it replaces (``ModelAgreement._apply_elems_torch``,
``_share_elems_torch``, ``_update_elems_torch``: the plain-torch references, the code the CPU runs) and writes
the same values bit for bit. Every value is the same float32 expression of the same operands in the same order:
the divisions are ``div_rn`` (IEEE, as torch's) and the launches use ``enable_fp_fusion=False`` (a fused
multiply-add would round once where torch rounds twice). The prefix tests (``cumprod`` of 0/1 flags in torch) are
a running flag here, which is exact. What is a reduction over a row or the batch (the survivals' ``cumprod``,
the record's sums) stays outside, in the torch ops both paths share.

One program per ``BLOCK_B`` requests, walking the model chain's ``cols`` columns once. No allocation, no host
read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["agreement_apply_triton", "agreement_share_triton", "agreement_update_triton"]

BLOCK_B = 32


@triton.jit
def _clamp01(x):
    return tl.minimum(tl.maximum(x, 0.0), 1.0)


@triton.jit
def _one_of_two(a, b):
    """``a (1 - b) / max(1 - a b, 1e-12)`` in torch's order (``agreement.ModelAgreement._one_of_two``)."""
    den = tl.maximum(1.0 - a * b, 1e-12)
    return tl.math.div_rn((1.0 - b) * a, den)


@triton.jit
def _agreement_apply_kernel(tok_ptr, len_ptr, q_ptr, mt_ptr, mc_ptr, bs, G,
                            s_tok, c_tok, s_q, c_q, s_mt, c_mt, s_mc, c_mc, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < bs
    r64 = rows.to(tl.int64)
    n = tl.load(len_ptr + r64, mask=live, other=0).to(tl.int64)
    alive = live  # every token before j within the length and equal to the model's
    for j in range(0, G):
        inside = live & (j < n)
        t = tl.load(tok_ptr + r64 * s_tok + j * c_tok, mask=live, other=0).to(tl.int64)
        m = tl.load(mt_ptr + r64 * s_mt + j * c_mt, mask=live, other=0).to(tl.int64)
        eq = (t == m) & inside
        c = _clamp01(tl.load(mc_ptr + r64 * s_mc + j * c_mc, mask=live, other=0.0).to(tl.float32))
        q = tl.load(q_ptr + r64 * s_q + j * c_q, mask=live, other=0.0)
        new = tl.where(alive & eq, tl.maximum(q, c), q)
        new = tl.where(alive & inside & ~eq, _one_of_two(q, c), new)
        tl.store(q_ptr + r64 * s_q + j * c_q, new, mask=live)
        alive = alive & eq


def agreement_apply_triton(tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor, model_tokens: torch.Tensor,
                           model_cond: torch.Tensor, cols: int) -> None:
    """Triton twin of ``ModelAgreement._apply_elems_torch``: re-price ``q[:, :cols]`` in place (``apply``'s rules;
    its survivals are the shared ``cumprod`` after)."""
    bs = q.shape[0]
    if bs == 0:
        return
    _agreement_apply_kernel[(triton.cdiv(bs, BLOCK_B),)](
        tokens, length, q, model_tokens, model_cond, bs, cols,
        tokens.stride(0), tokens.stride(1), q.stride(0), q.stride(1), model_tokens.stride(0), model_tokens.stride(1),
        model_cond.stride(0), model_cond.stride(1), BLOCK=BLOCK_B, enable_fp_fusion=False,
    )


@triton.jit
def _agreement_share_kernel(tok_ptr, len_ptr, sv_ptr, mt_ptr, mc_ptr, rec_ptr, s_ptr,
                            up_ptr, c_ptr, p_ptr, sh_ptr, tk_ptr, bs, G,
                            s_tok, c_tok, s_sv, c_sv, s_mt, c_mt, s_mc, c_mc, s_out, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < bs
    r64 = rows.to(tl.int64)
    n = tl.load(len_ptr + r64, mask=live, other=0).to(tl.int64)
    s = tl.load(s_ptr)
    r = tl.math.div_rn(tl.load(rec_ptr + 1) + s, tl.load(rec_ptr) + s)  # R = (O + s) / (E + s)
    rm1 = r - 1.0
    alive = live
    prev = tl.full([BLOCK], 1.0, tl.float32)  # S_{j-1}, clamped (S_{-1} = 1)
    for j in range(0, G):
        inside = live & (j < n)
        t = tl.load(tok_ptr + r64 * s_tok + j * c_tok, mask=live, other=0).to(tl.int64)
        m = tl.load(mt_ptr + r64 * s_mt + j * c_mt, mask=live, other=0)
        eq = (t == m.to(tl.int64)) & inside
        shared = alive & eq
        first = alive & inside & ~eq
        sv = tl.load(sv_ptr + r64 * s_sv + j * c_sv, mask=live, other=0.0)
        up = _clamp01(tl.math.div_rn(sv, prev))  # the chain's q_j = S_j / S_{j-1}
        prev = tl.maximum(sv, 1e-12)
        c = _clamp01(tl.load(mc_ptr + r64 * s_mc + j * c_mc, mask=live, other=0.0).to(tl.float32))
        den = tl.maximum(up * c - c + 1.0, 1e-12)
        q0 = tl.math.div_rn(up, den)  # the n-gram's q before apply's parting rule
        c = tl.where(first, _one_of_two(c, q0), c)
        p = tl.where(shared, tl.maximum(up, c), 0.0)
        lifted = tl.math.div_rn(p * r, p * rm1 + 1.0)  # odds(p) times R
        up = tl.where(shared, lifted, up)
        c = tl.where(shared, lifted, c)
        o = r64 * s_out + j
        tl.store(up_ptr + o, up, mask=live)
        tl.store(c_ptr + o, c, mask=live)
        tl.store(p_ptr + o, p, mask=live)
        tl.store(sh_ptr + o, shared, mask=live)
        tl.store(tk_ptr + o, m.to(tl.int32), mask=live)
        alive = alive & eq


def agreement_share_triton(tokens: torch.Tensor, length: torch.Tensor, survival: torch.Tensor,
                           model_tokens: torch.Tensor, model_cond: torch.Tensor, record: torch.Tensor,
                           strength: torch.Tensor,
                           up: torch.Tensor, c: torch.Tensor, p: torch.Tensor, shared: torch.Tensor,
                           tok: torch.Tensor) -> None:
    """Triton twin of ``ModelAgreement._share_elems_torch``: the new conditionals of both chains on the model's
    ``cols`` columns (``up`` n-gram, ``c`` model), the pre-lift estimate ``p`` and the ``shared`` flags, and the
    model's tokens ``tok``, for ``update``. ``record [2]`` / ``strength`` (a 0-d float32 tensor): the odds ratio's.
    Outputs ``[bs, cols]``, one row stride, contiguous rows."""
    bs, g = up.shape
    if bs == 0:
        return
    if not (up.stride(0) == c.stride(0) == p.stride(0) == shared.stride(0) == tok.stride(0)
            and up.stride(1) == c.stride(1) == p.stride(1) == shared.stride(1) == tok.stride(1) == 1):
        raise ValueError("agreement_share_triton: the outputs need one row stride and contiguous rows")
    _agreement_share_kernel[(triton.cdiv(bs, BLOCK_B),)](
        tokens, length, survival, model_tokens, model_cond, record, strength, up, c, p, shared, tok, bs, g,
        tokens.stride(0), tokens.stride(1), survival.stride(0), survival.stride(1), model_tokens.stride(0),
        model_tokens.stride(1), model_cond.stride(0), model_cond.stride(1), up.stride(0),
        BLOCK=BLOCK_B, enable_fp_fusion=False,
    )


@triton.jit
def _agreement_update_kernel(tk_ptr, p_ptr, sh_ptr, cmt_ptr, cnt_ptr, ev_ptr, bs, G, K,
                             s_in, s_cmt, c_cmt, s_ev0, s_ev1, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < bs
    r64 = rows.to(tl.int64)
    n = tl.load(cnt_ptr + r64, mask=live, other=0).to(tl.int64)
    alive = live  # the committed row matched every shared token before j
    for j in range(0, G):
        inside = live & (j < n)
        t = tl.load(tk_ptr + r64 * s_in + j, mask=live, other=0)
        # columns past the commit read as -1, as the torch path pads them
        cm = tl.load(cmt_ptr + r64 * s_cmt + j * c_cmt, mask=live & (j < K), other=-1).to(tl.int32)
        eq = (t == cm) & inside
        y = eq.to(tl.float32)
        tried = (alive & inside & tl.load(sh_ptr + r64 * s_in + j, mask=live, other=0).to(tl.int1)).to(tl.float32)
        p = tl.load(p_ptr + r64 * s_in + j, mask=live, other=0.0)
        tl.store(ev_ptr + r64 * s_ev1 + j, (1.0 - y) * p * tried, mask=live)
        tl.store(ev_ptr + s_ev0 + r64 * s_ev1 + j, (1.0 - p) * y * tried, mask=live)
        alive = alive & eq


def agreement_update_triton(tok: torch.Tensor, p: torch.Tensor, shared: torch.Tensor, committed: torch.Tensor,
                            counts: torch.Tensor, ev: torch.Tensor) -> None:
    """Triton twin of ``ModelAgreement._update_elems_torch``: each shared token's evidence against
    ``committed[b, :counts[b]]`` into ``ev [2, bs, cols]`` (``p (1 - y)`` and ``(1 - p) y`` on the shared tokens
    the target tried, 0 elsewhere). ``tok`` / ``p`` / ``shared``: ``share``'s kept rows (one row stride,
    contiguous rows)."""
    bs, g = p.shape
    if bs == 0:
        return
    if not (tok.stride(0) == p.stride(0) == shared.stride(0) and tok.stride(1) == p.stride(1) == shared.stride(1)
            == ev.stride(2) == 1):
        raise ValueError("agreement_update_triton: the kept rows need one row stride and contiguous rows")
    _agreement_update_kernel[(triton.cdiv(bs, BLOCK_B),)](
        tok, p, shared, committed, counts, ev, bs, g, min(g, committed.shape[1]),
        p.stride(0), committed.stride(0), committed.stride(1), ev.stride(0), ev.stride(1),
        BLOCK=BLOCK_B, enable_fp_fusion=False,
    )
