"""Triton kernel of ``ModelTail.update``'s flags (``tail.py``): one launch in place of up to ten torch ops.

``tail_flags_triton(tail, ...)`` has the signature of ``tail._flags_torch(...)`` (the plain-torch reference, the
code the CPU runs) and writes the same values: with ``online``, which requests committed the whole model chain
(``eq`` / ``whole``) and the tail tokens they committed past it (``n = max(counts - gamma, 0)`` where whole, else
0); with ``choice``, the requests that verified the model chain into its tail (``used``: verified past gamma on
the model chain, ``is_model``) and, with ``cused``, those whose tail was the corpus's. All integer and 0/1, so the
two agree exactly. One program per ``BLOCK_B`` requests; no allocation, no host read.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

__all__ = ["tail_flags_triton"]

BLOCK_B = 32


@triton.jit
def _tail_flags_kernel(com_ptr, tm_ptr, counts_ptr, choice_ptr, ver_ptr, pick_ptr, eq_ptr, whole_ptr, n_ptr,
                       used_ptr, ism_ptr, cused_ptr, bs, s_com, c_com, s_tm, s_eq, s_counts, s_choice, s_ver,
                       G: tl.constexpr, GB: tl.constexpr, ONLINE: tl.constexpr, COUNT: tl.constexpr,
                       CORPUS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < bs
    r = rows.to(tl.int64)
    if ONLINE:
        cols = tl.arange(0, GB)
        m2 = live[:, None] & (cols[None, :] < G)
        c = tl.load(com_ptr + r[:, None] * s_com + cols[None, :].to(tl.int64) * c_com, mask=m2, other=0)
        t = tl.load(tm_ptr + r[:, None] * s_tm + cols[None, :], mask=m2, other=0)
        e = c == t
        tl.store(eq_ptr + r[:, None] * s_eq + cols[None, :], e, mask=m2)
        whole = tl.sum((e | (cols[None, :] >= G)).to(tl.int32), 1) == GB
        tl.store(whole_ptr + r, whole, mask=live)
        n = tl.load(counts_ptr + r * s_counts, mask=live, other=0).to(tl.int32) - G
        n = tl.maximum(tl.where(whole, n, 0), 0)
        tl.store(n_ptr + r, n, mask=live)
    if COUNT:
        ver = tl.load(ver_ptr + r * s_ver, mask=live, other=0)
        ism = tl.load(choice_ptr + r * s_choice, mask=live, other=1) == 0
        used = (ver > G) & ism
        tl.store(ism_ptr + r, ism, mask=live)
        tl.store(used_ptr + r, used, mask=live)
        if CORPUS:
            tl.store(cused_ptr + r, used & (tl.load(pick_ptr + r, mask=live, other=0) != 0), mask=live)


def tail_flags_triton(tail, committed: torch.Tensor, counts: torch.Tensor, choice: Optional[torch.Tensor],
                      verified: Optional[torch.Tensor], online: bool, cused: Optional[torch.Tensor]) -> None:
    """Triton twin of ``ModelTail._flags_torch`` (``tail``: the ``ModelTail``, whose buffers it writes)."""
    bs = committed.shape[0]
    if bs == 0:
        return
    v = tail._views(bs)
    count = choice is not None
    if v.tok_model.stride(1) != 1 or v.eq.stride(1) != 1:  # this object's own buffers: always
        raise ValueError("tail_flags_triton: the model chain and eq need unit column stride")
    g = tail.gamma
    dummy = v.n  # never read or written where its flag is off
    used = tail.counters.rows(bs)[0]
    _tail_flags_kernel[(triton.cdiv(bs, BLOCK_B),)](
        committed, v.tok_model, counts, choice if count else dummy, verified if count else dummy, v.pick, v.eq,
        v.whole, v.n, used, v.is_model, cused if cused is not None else dummy, bs, committed.stride(0),
        committed.stride(1), v.tok_model.stride(0), v.eq.stride(0), counts.stride(0), choice.stride(0) if count else 0,
        verified.stride(0) if count else 0,
        G=g, GB=triton.next_power_of_2(g), ONLINE=bool(online), COUNT=count, CORPUS=count and cused is not None,
        BLOCK=BLOCK_B,
    )
