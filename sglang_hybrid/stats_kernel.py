"""Triton kernels of ``StepStats.update`` (``stats.py``): its per-request work, one launch in place of about 20
torch ops, and its batch reductions, one launch in place of 12.

``stats_elems_triton`` has the signature of ``StepStats._elems_torch`` (the plain-torch reference, the code the
CPU runs) and writes the same values: each request's accepted drafts ``acc = max(accept_len - 1, 0)``, its
verified drafts, its row of the summed columns (``1``, n-gram chosen, ``acc`` and verified split by chain) and,
for the model chain's refit, which positions were tried and which accepted. All of it is integer or 0/1, so the
two agree exactly. One program per ``BLOCK_B`` requests; no allocation, no host read.

``stats_reduce_triton(stats, ...)`` has the signature of ``StepStats._reduce_torch`` and writes the same integers:
the summed columns added to the counters, the step counted, the first four columns added to the request's slot
(atomic adds: slots may repeat), the step's largest accepted and verified drafts folded into the running maxima,
and the host's staging row (the counters, the price and the two maxima as float64). One program loops over the
batch; integer sums are exact in any order. The refit's float rates stay in torch ops (``StepStats._refit``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .stats import C_STEPS

__all__ = ["stats_elems_triton", "stats_reduce_triton"]

BLOCK_B = 32


@triton.jit
def _stats_elems_kernel(acc_in, vlen_in, choice_ptr, acc_ptr, vlen_ptr, pr_ptr, tried_ptr, ok_ptr, bs, G,
                        s_acc, s_vlen, s_choice, s_pr, s_t, REFIT: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < bs
    r64 = rows.to(tl.int64)
    acc = tl.maximum(tl.load(acc_in + r64 * s_acc, mask=live, other=0).to(tl.int64) - 1, 0)
    vlen = tl.load(vlen_in + r64 * s_vlen, mask=live, other=0).to(tl.int64)
    ng = (tl.load(choice_ptr + r64 * s_choice, mask=live, other=0).to(tl.int64) == 1).to(tl.int64)
    m = 1 - ng
    tl.store(acc_ptr + r64, acc, mask=live)
    tl.store(vlen_ptr + r64, vlen, mask=live)
    row = pr_ptr + r64 * s_pr
    tl.store(row, tl.full([BLOCK], 1, tl.int64), mask=live)
    tl.store(row + 1, ng, mask=live)
    tl.store(row + 2, acc * ng, mask=live)
    tl.store(row + 3, acc * m, mask=live)
    tl.store(row + 4, vlen * m, mask=live)
    tl.store(row + 5, vlen * ng, mask=live)
    tl.store(row + 6, vlen, mask=live)
    if REFIT:  # position j tried: model chain, verified past j, and every position before j accepted
        for j in range(0, G):
            tried = (vlen >= j + 1) & (acc >= j) & (m == 1)
            ok = tried & (acc >= j + 1)
            tl.store(tried_ptr + r64 * s_t + j, tried.to(tl.float32), mask=live)
            tl.store(ok_ptr + r64 * s_t + j, ok.to(tl.float32), mask=live)


def stats_elems_triton(accept_lens: torch.Tensor, verify_len: torch.Tensor, choice: torch.Tensor, acc: torch.Tensor,
                       vlen: torch.Tensor, per_req: torch.Tensor, tried_f: torch.Tensor, ok_f: torch.Tensor,
                       refit: bool) -> None:
    """Triton twin of ``StepStats._elems_torch`` (same arguments, same writes). ``acc`` / ``vlen [bs]`` int64,
    ``per_req [bs, 7]`` int64 and ``tried_f`` / ``ok_f [bs, gamma]`` float32 (written with ``refit``), rows
    contiguous."""
    bs = acc.shape[0]
    if bs == 0:
        return
    if not (per_req.stride(1) == 1 and tried_f.stride(1) == ok_f.stride(1) == 1
            and tried_f.stride(0) == ok_f.stride(0)):
        raise ValueError("stats_elems_triton: per_req, tried_f and ok_f need contiguous rows (one row stride)")
    _stats_elems_kernel[(triton.cdiv(bs, BLOCK_B),)](
        accept_lens, verify_len, choice, acc, vlen, per_req, tried_f, ok_f, bs, tried_f.shape[1],
        accept_lens.stride(0), verify_len.stride(0), choice.stride(0), per_req.stride(0), tried_f.stride(0),
        REFIT=bool(refit), BLOCK=BLOCK_B,
    )


REDUCE_BLOCK = 128
_NEG = tl.constexpr(-(2**62))  # below any count: the maxima start here


@triton.jit
def _stats_reduce_kernel(pr_ptr, acc_ptr, vlen_ptr, slots_ptr, sum_idx_ptr, counters_ptr, slot_stats_ptr,
                         max_acc_ptr, max_vlen_ptr, price_ptr, stage_ptr, bs, num_slots, s_pr, s_slots, s_ss,
                         NSUM: tl.constexpr, NSLOT: tl.constexpr, NC: tl.constexpr, C_STEPS: tl.constexpr,
                         BLOCK: tl.constexpr):
    cols = tl.arange(0, NC)  # NSUM <= NC columns of per_req; NC counters
    csum = tl.zeros([NC], dtype=tl.int64)
    ma = tl.full([BLOCK], _NEG, tl.int64)
    mv = tl.full([BLOCK], _NEG, tl.int64)
    for b0 in range(0, bs, BLOCK):
        i = b0 + tl.arange(0, BLOCK)
        live = i < bs
        i64 = i.to(tl.int64)
        tile = tl.load(pr_ptr + i64[:, None] * s_pr + cols[None, :], mask=live[:, None] & (cols[None, :] < NSUM),
                       other=0)
        csum += tl.sum(tile, 0)
        ma = tl.maximum(ma, tl.load(acc_ptr + i64, mask=live, other=_NEG))
        mv = tl.maximum(mv, tl.load(vlen_ptr + i64, mask=live, other=_NEG))
        sl = tl.load(slots_ptr + i64 * s_slots, mask=live, other=-1).to(tl.int64)
        ok = live & (sl >= 0) & (sl < num_slots)
        tl.atomic_add(slot_stats_ptr + sl[:, None] * s_ss + cols[None, :], tile,
                      mask=ok[:, None] & (cols[None, :] < NSLOT))
    # counter k gets the summed column j with sum_idx[j] == k (a permutation of some counters), plus the step
    idx = tl.load(sum_idx_ptr + cols, mask=cols < NSUM, other=-1)
    inc = tl.sum(tl.where(idx[None, :] == cols[:, None], csum[None, :], 0), 1) + (cols == C_STEPS).to(tl.int64)
    cnt = tl.load(counters_ptr + cols) + inc
    tl.store(counters_ptr + cols, cnt)
    new_ma = tl.maximum(tl.load(max_acc_ptr), tl.max(ma, 0))
    new_mv = tl.maximum(tl.load(max_vlen_ptr), tl.max(mv, 0))
    tl.store(max_acc_ptr, new_ma)
    tl.store(max_vlen_ptr, new_mv)
    tl.store(stage_ptr + cols, cnt.to(tl.float64))
    tl.store(stage_ptr + NC, tl.load(price_ptr).to(tl.float64))
    tl.store(stage_ptr + NC + 1, new_ma.to(tl.float64))
    tl.store(stage_ptr + NC + 2, new_mv.to(tl.float64))


def stats_reduce_triton(stats, slots: torch.Tensor, acc: torch.Tensor, vlen: torch.Tensor,
                        per_req: torch.Tensor) -> None:
    """Triton twin of ``StepStats._reduce_torch`` (``stats``: the ``StepStats``): ``acc`` / ``vlen [bs]`` int64
    and ``per_req [bs, 7]`` int64 (contiguous, from ``_elems``), ``slots [bs]`` int32 / int64 in range (an
    out-of-range slot is skipped here; torch's ``index_add_`` refuses it)."""
    bs = acc.shape[0]
    if bs == 0:
        return
    if not (acc.is_contiguous() and vlen.is_contiguous() and per_req.stride(1) == 1):
        raise ValueError("stats_reduce_triton: acc and vlen must be contiguous, per_req rows contiguous")
    nc, nsum = stats.counters.shape[0], per_req.shape[1]
    nslot = stats.slot_stats.shape[1]
    if not (nsum <= nc and nslot <= nsum and nc == triton.next_power_of_2(nc)):
        raise ValueError(f"stats_reduce_triton: {nsum} summed columns, {nslot} per slot, {nc} counters")
    _stats_reduce_kernel[(1,)](
        per_req, acc, vlen, slots, stats._sum_idx, stats.counters, stats.slot_stats, stats.max_accepted,
        stats.max_verified, stats.price, stats._stage, bs, stats.slot_stats.shape[0], per_req.stride(0),
        slots.stride(0), stats.slot_stats.stride(0),
        NSUM=nsum, NSLOT=nslot, NC=nc, C_STEPS=C_STEPS, BLOCK=min(REDUCE_BLOCK, triton.next_power_of_2(bs)),
    )
