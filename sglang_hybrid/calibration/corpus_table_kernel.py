"""Triton kernel of the corpus's fitted table on the device (``corpus_table.py: DeviceCorpusTable.price``): one
launch in place of about 16 torch ops per corpus draft (the corpus candidate's and the corpus tail's).

``corpus_price_triton(table, ...)`` has the signature of ``table._price_torch(...)`` (the plain-torch reference,
the code the CPU runs) and writes the same values bit for bit: the corpus's fixed-point ``q`` as float32 times
``scale``, then ``q' = q r / (1 + q (r - 1))`` with ``r`` the table's ratio at (match length clamped to the
table, count bucket, column clamped to the table), in the same float32 operations and order (``div_rn``, no
fused multiply-add). The count bucket (torch's ``searchsorted`` over the thresholds 2, 4, .., 2^(C-1)) is a count
of thresholds at or under the count. One program per ``BLOCK_B`` requests; no allocation, no host read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["corpus_price_triton"]

BLOCK_B = 32


@triton.jit
def _corpus_price_kernel(ratio_ptr, dq_ptr, scale_ptr, ml_ptr, mc_ptr, q_ptr, bs, W, C, Dt, mmax,
                         s_dq, c_dq, s_ml, s_mc, s_q, c_q, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < bs
    r64 = rows.to(tl.int64)
    ml = tl.minimum(tl.maximum(tl.load(ml_ptr + r64 * s_ml, mask=live, other=0).to(tl.int64), 0), mmax)
    cnt = tl.load(mc_ptr + r64 * s_mc, mask=live, other=0).to(tl.int64)
    cb = tl.zeros([BLOCK], dtype=tl.int64)
    for i in range(1, C):  # the bucket: thresholds 2^i (i = 1 .. C - 1) at or under the count
        cb += ((tl.full([BLOCK], 1, tl.int64) << i) <= cnt).to(tl.int64)
    base = ml * C * Dt + cb * Dt
    scale = tl.load(scale_ptr)
    for j in range(0, W):
        r = tl.load(ratio_ptr + base + tl.minimum(j, Dt - 1), mask=live, other=1.0)
        q = tl.load(dq_ptr + r64 * s_dq + j * c_dq, mask=live, other=0).to(tl.float32) * scale
        q = tl.math.div_rn(q * r, (r - 1.0) * q + 1.0)
        tl.store(q_ptr + r64 * s_q + j * c_q, q, mask=live)


def corpus_price_triton(table, draft_q: torch.Tensor, scale: torch.Tensor, match_len: torch.Tensor,
                        match_count: torch.Tensor, q: torch.Tensor) -> None:
    """Triton twin of ``DeviceCorpusTable._price_torch`` (``table``: the ``DeviceCorpusTable``): ``q [bs, w]``
    float32 becomes the fitted ``q'`` of the corpus draft's fixed-point ``draft_q [bs, w]`` times ``scale`` (a
    device scalar)."""
    bs, w = q.shape
    if bs == 0:
        return
    _corpus_price_kernel[(triton.cdiv(bs, BLOCK_B),)](
        table._ratio, draft_q, scale, match_len, match_count, q, bs, w, table.buckets, table.columns, table._mmax,
        draft_q.stride(0), draft_q.stride(1), match_len.stride(0), match_count.stride(0), q.stride(0), q.stride(1),
        BLOCK=BLOCK_B, enable_fp_fusion=False,
    )
