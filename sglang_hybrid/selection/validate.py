"""Host-side argument checks of the chain selection: shapes, dtypes, devices and config only.

Nothing here reads device data, so the checks are safe (and cheap) inside a decode step and under
CUDA-graph capture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .buffers import SelectionOutput


class SelectionArgumentError(ValueError):
    """A bad argument to the chain selection; the message names the argument."""


@dataclass(frozen=True)
class SelectionShape:
    """What the checks established: batch size, chain widths and the resolved verify cap."""

    bs: int
    gamma: int  # G, model chain width
    ngram_width: int  # L, n-gram chain width
    width: int  # Lm = max(G, L)
    max_verify_len: int  # resolved: 1..Lm


def _bad(name: str, why: str) -> SelectionArgumentError:
    return SelectionArgumentError(f"select_chains: argument '{name}' {why}")


def _tensor(name: str, t, dtype: torch.dtype, ndim: int, device: Optional[torch.device]) -> None:
    if not isinstance(t, torch.Tensor):
        raise _bad(name, f"must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise _bad(name, f"must have dtype {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        raise _bad(name, f"must be {ndim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise _bad(name, f"must be on {device} (the device of model_tokens), got {t.device}")


def validate_selection_args(
    model_tokens: torch.Tensor,
    model_surv: torch.Tensor,
    ngram_tokens: torch.Tensor,
    ngram_surv: torch.Tensor,
    ngram_len: torch.Tensor,
    budget: Optional[torch.Tensor],
    sps: Optional[torch.Tensor],
    out: SelectionOutput,
    *,
    num_iters: int,
    survival_eps: float,
    max_verify_len: int,
) -> SelectionShape:
    """Check every argument of ``select_chains``; raise :class:`SelectionArgumentError` naming it."""
    _tensor("model_tokens", model_tokens, torch.int32, 2, None)
    dev = model_tokens.device
    bs, gamma = model_tokens.shape
    if bs < 1:
        raise _bad("model_tokens", f"must have at least one row (request), got shape {tuple(model_tokens.shape)}")
    if gamma < 1:
        raise _bad("model_tokens", f"must have at least one column (gamma >= 1), got shape {tuple(model_tokens.shape)}")
    _tensor("model_surv", model_surv, torch.float32, 2, dev)
    if tuple(model_surv.shape) != (bs, gamma):
        raise _bad("model_surv", f"must have the shape of model_tokens {(bs, gamma)}, got {tuple(model_surv.shape)}")
    _tensor("ngram_tokens", ngram_tokens, torch.int32, 2, dev)
    if ngram_tokens.shape[0] != bs:
        raise _bad("ngram_tokens", f"must have bs={bs} rows, got shape {tuple(ngram_tokens.shape)}")
    L = ngram_tokens.shape[1]
    if L < 1:
        raise _bad("ngram_tokens", f"must have at least one column (L_max >= 1), got shape {tuple(ngram_tokens.shape)}")
    _tensor("ngram_surv", ngram_surv, torch.float32, 2, dev)
    if tuple(ngram_surv.shape) != (bs, L):
        raise _bad("ngram_surv", f"must have the shape of ngram_tokens {(bs, L)}, got {tuple(ngram_surv.shape)}")
    _tensor("ngram_len", ngram_len, torch.int32, 1, dev)
    if ngram_len.shape[0] != bs:
        raise _bad("ngram_len", f"must have shape ({bs},), got {tuple(ngram_len.shape)}")

    width = max(gamma, L)
    if (budget is None) == (sps is None):
        raise _bad("budget", "and 'sps': exactly one must be given (budget mode or SPS mode), got "
                   + ("both" if budget is not None else "neither"))
    if budget is not None:
        _tensor("budget", budget, torch.int32, 1, dev)
        if budget.numel() != 1:
            raise _bad("budget", f"must have shape (1,), got {tuple(budget.shape)}")
    if sps is not None:
        _tensor("sps", sps, torch.float32, 1, dev)
        need = bs * (1 + width) + 1
        if sps.numel() < need:
            raise _bad("sps", f"must have at least bs*(1+Lm)+1 = {need} entries (one per verify batch size B), "
                       f"got {sps.numel()}")

    if not isinstance(out, SelectionOutput):
        raise _bad("out", f"must be a SelectionOutput, got {type(out).__name__}")
    for field, dtype, shape in (
        ("choice", torch.int32, (bs,)),
        ("verify_len", torch.int32, (bs,)),
        ("tokens", torch.int32, (bs, width)),
        ("survival", torch.float32, (bs, width)),
        ("price", torch.float32, (1,)),
        ("budget_used", torch.int32, (1,)),
    ):
        t = getattr(out, field)
        _tensor(f"out.{field}", t, dtype, len(shape), dev)
        if tuple(t.shape) != shape:
            what = " (Lm = max(gamma, L_max) columns)" if len(shape) == 2 else ""
            raise _bad(f"out.{field}", f"must have shape {shape}{what}, got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise _bad(f"out.{field}", "must be contiguous")

    if isinstance(num_iters, bool) or not isinstance(num_iters, int) or num_iters < 0:
        raise _bad("num_iters", f"must be an int >= 0, got {num_iters!r}")
    if not isinstance(survival_eps, (int, float)) or not math.isfinite(survival_eps) or survival_eps < 0:
        raise _bad("survival_eps", f"must be a finite number >= 0, got {survival_eps!r}")
    if isinstance(max_verify_len, bool) or not isinstance(max_verify_len, int) or not 0 <= max_verify_len <= width:
        raise _bad("max_verify_len", f"must be an int in [0, Lm={width}] (0 = Lm), got {max_verify_len!r}")
    return SelectionShape(bs=bs, gamma=gamma, ngram_width=L, width=width,
                          max_verify_len=max_verify_len or width)
