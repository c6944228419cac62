"""``select_chains``: validate on the host, then run the Triton kernel (CUDA) or the torch reference."""

from __future__ import annotations

import os
from typing import Optional

import torch

from .buffers import MAX_FLAT_ELEMENTS, SelectionOutput, flat_size
from .reference import select_chains_ref
from .validate import SelectionArgumentError, validate_selection_args

BACKENDS = ("auto", "torch", "triton")


def select_chains(
    model_tokens: torch.Tensor,
    model_surv: torch.Tensor,
    ngram_tokens: torch.Tensor,
    ngram_surv: torch.Tensor,
    ngram_len: torch.Tensor,
    budget: Optional[torch.Tensor],
    sps: Optional[torch.Tensor],
    out: SelectionOutput,
    *,
    num_iters: int = 2,
    survival_eps: float = 1e-6,
    max_verify_len: int = 0,
    backend: str = "auto",
) -> SelectionOutput:
    """Choose each request's chain and verify length under one batch-wide budget; returns ``out``.

    Arguments as :func:`select_chains_ref`. ``backend``: ``"auto"`` runs Triton on CUDA tensors (falling
    back to torch when the batch exceeds the kernel's ``MAX_FLAT_ELEMENTS``) and torch elsewhere;
    ``"triton"`` forces the kernel (CPU tensors need ``TRITON_INTERPRET=1``); ``"torch"`` forces the
    reference. Both give identical results. Raises :class:`SelectionArgumentError` naming the argument.
    """
    if backend not in BACKENDS:
        raise SelectionArgumentError(f"select_chains: argument 'backend' must be one of {BACKENDS}, got {backend!r}")
    kw = dict(num_iters=num_iters, survival_eps=survival_eps, max_verify_len=max_verify_len)
    shp = validate_selection_args(model_tokens, model_surv, ngram_tokens, ngram_surv, ngram_len, budget, sps,
                                  out, **kw)
    fits = flat_size(shp.bs, shp.width) <= MAX_FLAT_ELEMENTS
    on_cuda = model_tokens.device.type == "cuda"
    if backend == "triton":
        if not on_cuda and os.environ.get("TRITON_INTERPRET", "") != "1":
            raise SelectionArgumentError(
                "select_chains: argument 'backend'='triton' needs CUDA tensors, or TRITON_INTERPRET=1 set "
                f"before triton is imported for CPU tensors; got tensors on {model_tokens.device}"
            )
        use_triton = True
    else:
        use_triton = backend == "auto" and on_cuda and fits
    if use_triton:
        from .triton_kernel import select_chains_triton  # imported lazily: triton is heavy

        select_chains_triton(model_tokens, model_surv, ngram_tokens, ngram_surv, ngram_len, budget, sps, out, **kw)
    else:
        select_chains_ref(model_tokens, model_surv, ngram_tokens, ngram_surv, ngram_len, budget, sps, out, **kw)
    return out
