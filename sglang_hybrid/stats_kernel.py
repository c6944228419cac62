"""Triton kernel of ``StepStats.update``'s per-request work (``stats.py``): one launch in place of about 20 torch
ops.

``stats_elems_triton`` has the signature of ``StepStats._elems_torch`` (the plain-torch reference, the code the
CPU runs) and writes the same values: each request's accepted drafts ``acc = max(accept_len - 1, 0)``, its
verified drafts, its row of the summed columns (``1``, n-gram chosen, ``acc`` and verified split by chain) and,
for the model chain's refit, which positions were tried and which accepted. All of it is integer or 0/1, so the
two agree exactly. The sums over the batch, the per-slot ``index_add_``, the maxima and the refit's rates stay in
the torch ops both paths share. One program per ``BLOCK_B`` requests; no allocation, no host read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["stats_elems_triton"]

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
