"""The better of two model-free chains per request: what ``CorpusCandidate.choose`` (the request's own n-gram or
the corpus) and ``ModelTail.extend`` (the n-gram's tail or the corpus's after the model chain) both do.

Per request the chain with the larger expected accepted length (the sum of its first ``w`` prefix survivals)
wins, ties going to chain ``a``; its survivals overwrite ``surv_a`` and its tokens (and, where given, its length
and per-token estimates) are written to the ``*_out`` buffers (which may be the ``a`` buffers themselves).

Three functions with one signature:
- ``choose_rows_torch``: the torch ops the CPU runs (``torch.sum`` for the sums);
- ``choose_rows_ref``: the same with each row summed left to right, the reference of
- ``choose_rows_triton`` (``choose_kernel.py``): one launch in place of about six torch ops, equal to the
  reference bit for bit. ``torch.sum`` may add in another order, so on a CPU and a GPU the two sums of a
  near-tie can round apart and pick differently; outputs stay lossless either way (the verify decides).

No allocation, no host read: every output is a preallocated buffer.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

__all__ = ["choose_rows_torch", "choose_rows_ref", "choose_rows_fn"]


def _select(pick: torch.Tensor, surv_a, surv_b, tok_a, tok_b, tok_out, len_a, len_b, len_out, q_a, q_b,
            q_out) -> None:
    col = pick.view(-1, 1)
    torch.where(col, surv_b, surv_a, out=surv_a)
    torch.where(col, tok_b, tok_a, out=tok_out)
    if len_out is not None:
        torch.where(pick, len_b, len_a, out=len_out)
    if q_out is not None:
        torch.where(col, q_b, q_a, out=q_out)


def choose_rows_torch(surv_a: torch.Tensor, surv_b: torch.Tensor, w: int, e_a: torch.Tensor, e_b: torch.Tensor,
                      pick: torch.Tensor, tok_a: torch.Tensor, tok_b: torch.Tensor, tok_out: torch.Tensor,
                      len_a: Optional[torch.Tensor] = None, len_b: Optional[torch.Tensor] = None,
                      len_out: Optional[torch.Tensor] = None, q_a: Optional[torch.Tensor] = None,
                      q_b: Optional[torch.Tensor] = None, q_out: Optional[torch.Tensor] = None) -> None:
    """``e_a, e_b [bs]`` = the sums of ``surv_a, surv_b [bs, W]`` (float32) over their first ``w`` columns,
    ``pick [bs]`` (bool) = ``e_b > e_a``; then where ``pick``: ``surv_a <- surv_b``, ``tok_out <- tok_b`` (else
    ``tok_a``; int32 ``[bs, Wt]``), ``len_out <- len_b`` (``[bs]``) and ``q_out <- q_b`` (float32 ``[bs, Wq]``)
    when given."""
    torch.sum(surv_a[:, :w], 1, out=e_a)
    torch.sum(surv_b[:, :w], 1, out=e_b)
    torch.gt(e_b, e_a, out=pick)
    _select(pick, surv_a, surv_b, tok_a, tok_b, tok_out, len_a, len_b, len_out, q_a, q_b, q_out)


def choose_rows_ref(surv_a: torch.Tensor, surv_b: torch.Tensor, w: int, e_a: torch.Tensor, e_b: torch.Tensor,
                    pick: torch.Tensor, tok_a: torch.Tensor, tok_b: torch.Tensor, tok_out: torch.Tensor,
                    len_a: Optional[torch.Tensor] = None, len_b: Optional[torch.Tensor] = None,
                    len_out: Optional[torch.Tensor] = None, q_a: Optional[torch.Tensor] = None,
                    q_b: Optional[torch.Tensor] = None, q_out: Optional[torch.Tensor] = None) -> None:
    """``choose_rows_torch`` with each row's sum taken left to right (column 0 first), as the kernel adds."""
    e_a.zero_()
    e_b.zero_()
    for j in range(w):
        e_a.add_(surv_a[:, j])
        e_b.add_(surv_b[:, j])
    torch.gt(e_b, e_a, out=pick)
    _select(pick, surv_a, surv_b, tok_a, tok_b, tok_out, len_a, len_b, len_out, q_a, q_b, q_out)


def choose_rows_fn(backend: str) -> Callable[..., None]:
    """The function of a resolved backend (``"torch"`` or ``"triton"``)."""
    if backend == "triton":
        from .choose_kernel import choose_rows_triton

        return choose_rows_triton
    return choose_rows_torch
