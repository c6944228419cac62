"""Triton kernel of ``ChainCounters.add`` (``counters.py``): one launch in place of eight torch ops, three times
per step with the corpus and both tails on.

``chain_counters_add_triton(cc, ...)`` has the signature of ``cc._add_torch(...)`` (the plain-torch reference, the
code the CPU runs) and writes the same values: each request's mask as int64, its accepted drafts
``max(counts - offset, 0)`` where marked, this step's two sums and the running counters. All of it is integer,
so the sums are exact in any order and the two paths agree bit for bit. One program loops over the batch in
blocks of ``BLOCK``; no allocation, no host read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["chain_counters_add_triton"]

BLOCK = 256


@triton.jit
def _chain_counters_kernel(used_ptr, counts_ptr, offset_ptr, used_i_ptr, acc_ptr, step_ptr, counters_ptr, bs,
                           s_used, s_counts, BLOCK: tl.constexpr):
    off = tl.load(offset_ptr)
    su = tl.zeros([BLOCK], dtype=tl.int64)
    sa = tl.zeros([BLOCK], dtype=tl.int64)
    for b0 in range(0, bs, BLOCK):
        i = b0 + tl.arange(0, BLOCK)
        live = i < bs
        i64 = i.to(tl.int64)
        u = tl.load(used_ptr + i64 * s_used, mask=live, other=0).to(tl.int64)
        a = tl.maximum(tl.load(counts_ptr + i64 * s_counts, mask=live, other=0).to(tl.int64) - off, 0) * u
        tl.store(used_i_ptr + i64, u, mask=live)
        tl.store(acc_ptr + i64, a, mask=live)
        su += u
        sa += a
    tu = tl.sum(su, 0)
    ta = tl.sum(sa, 0)
    tl.store(step_ptr, tu)
    tl.store(step_ptr + 1, ta)
    tl.store(counters_ptr, tl.load(counters_ptr) + tu)
    tl.store(counters_ptr + 1, tl.load(counters_ptr + 1) + ta)


def chain_counters_add_triton(cc, used: torch.Tensor, used_i: torch.Tensor, acc: torch.Tensor,
                              counts: torch.Tensor) -> None:
    """Triton twin of ``ChainCounters._add_torch`` (``cc``: the ``ChainCounters``): ``used [bs]`` (bool) marks the
    requests counted, ``counts [bs]`` (int32 / int64) their committed tokens; ``used_i`` and ``acc [bs]`` (int64,
    contiguous) are scratch; ``cc._step`` gets this step's sums and ``cc.counters`` their running total."""
    bs = counts.shape[0]
    if bs == 0:
        return
    if not (used_i.is_contiguous() and acc.is_contiguous()):
        raise ValueError("chain_counters_add_triton: used_i and acc must be contiguous")
    _chain_counters_kernel[(1,)](used, counts, cc._offset, used_i, acc, cc._step, cc.counters, bs,
                                 used.stride(0), counts.stride(0), BLOCK=min(BLOCK, triton.next_power_of_2(bs)))
