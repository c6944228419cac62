"""N-gram chains longer than the model's draft chain: a verify window wider than ``speculative_num_steps + 1``.

SGLang 0.5.23 ties the verify window of a chain drafter (``topk == 1``) to its draft length,
``speculative_num_draft_tokens == speculative_num_steps + 1``, in three places:

1. ``arg_groups/speculative_hook.py: _handle_eagle_family`` resets the draft-token count to ``steps + 1``. It
   never runs for a registered algorithm (``HybridSparkAlgo.handle_server_args`` sets the fields instead), so
   nothing is needed there.
2. ``speculative/base_spec_worker.py: EagleDraftWorkerBase._rebuild_topk1_chain_buffers`` asserts the relation
   while it builds the draft chain's constant parent / score-index buffers. Hook :func:`rebuild_topk1_hook`
   builds them for the ``steps``-token draft chain, which is what the draft loop produces.
3. ``speculative/eagle_worker_common.py: build_eagle_verify_input`` is handed the ``steps``-token draft chain and
   the ``num_draft_tokens``-wide window; its chain path needs ``num_draft_tokens == num_steps + 1`` and its tree
   path gathers ``num_draft_tokens - 1`` tokens through ``top_scores_index``. Hook :func:`verify_input_hook`
   pads the draft chain to the window (the pad columns are filled by the n-gram chain in the worker's
   ``verify``, or unlinked) and calls the original with a chain topology of ``num_draft_tokens - 1`` steps.

Everything downstream is already generic in the window width: the KV write window
(``prepare_for_draft``), the target verify (``run_eagle_verify``), the accept-index width (``spec_steps + 1``),
the draft extend over the window (``_draft_extend_for_decode``), the scheduler's KV reservation and the result
processor's stride all read ``speculative_num_draft_tokens``.

Both hooks are registered through SGLang's ``HookRegistry`` (``AROUND``) in every process and do nothing unless
the process runs ``HYBRID_SPARK`` with a window wider than ``steps + 1``: a combination stock SGLang refuses, so
no built-in algorithm can reach the new branch. The pad buffers are allocated once per (device, width) for the
largest batch and only grow for an eager batch past it (as SGLang's own topk=1 buffers do).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Tuple

import torch

logger = logging.getLogger("sglang_hybrid")

REBUILD_TARGET = "sglang.srt.speculative.base_spec_worker.EagleDraftWorkerBase._rebuild_topk1_chain_buffers"
BUILD_TARGET = "sglang.srt.speculative.eagle_worker_common.build_eagle_verify_input"

_APPLIED: list[str] = []


def _hybrid_process() -> bool:
    from sglang.srt.runtime_context import get_spec

    from .algo import ALGO_NAME

    try:
        return get_spec().speculative_algorithm == ALGO_NAME
    except Exception:  # noqa: BLE001 - no published config yet: not a serving process
        return False


def widened(topk: int, num_steps: int, num_draft_tokens: int) -> bool:
    """Whether a (topk, steps, window) triple is a widened HYBRID_SPARK chain window."""
    return topk == 1 and num_draft_tokens is not None and num_draft_tokens > num_steps + 1 and _hybrid_process()


def rebuild_topk1_hook(original_fn, self, *args, **kwargs):
    """Build the draft chain's buffers for ``speculative_num_steps`` tokens when the window is wider."""
    n = self.speculative_num_draft_tokens
    if not widened(self.topk, self.speculative_num_steps, n):
        return original_fn(self, *args, **kwargs)
    self.speculative_num_draft_tokens = self.speculative_num_steps + 1
    try:
        return original_fn(self, *args, **kwargs)
    finally:
        self.speculative_num_draft_tokens = n


class _ChainPad:
    """Preallocated ``[rows, width]`` buffers: the padded draft chain and its constant chain topology."""

    def __init__(self, rows: int, width: int, device: torch.device, dtype: torch.dtype) -> None:
        self.rows = rows
        self.tokens = torch.zeros(rows, width, dtype=dtype, device=device)
        self.parents = torch.arange(-1, width - 1, dtype=torch.long, device=device).repeat(rows, 1)
        self.scores = torch.arange(width, dtype=torch.long, device=device).repeat(rows, 1)


_PADS: Dict[Tuple[str, int, torch.dtype], _ChainPad] = {}


def reserve(device: torch.device | str, width: int, rows: int, dtype: torch.dtype = torch.int64) -> None:
    """Allocate the pad buffers for batches up to ``rows`` (the worker calls it at start-up; SGLang's draft
    tokens are int64)."""
    _pad(torch.device(device), width, rows, dtype)


def pads() -> Dict[Tuple[str, int, torch.dtype], _ChainPad]:
    """The pad buffers allocated so far (for the start-up memory report)."""
    return _PADS


def _pad(device: torch.device, width: int, rows: int, dtype: torch.dtype) -> _ChainPad:
    key = (str(device), width, dtype)
    pad = _PADS.get(key)
    if pad is None or pad.rows < rows:
        pad = _ChainPad(max(rows, pad.rows if pad else 0), width, device, dtype)
        _PADS[key] = pad
    return pad


def verify_input_hook(original_fn, batch, draft_input, parent_list, top_scores_index, draft_tokens, draft_probs,
                      **kwargs):
    """Pad a ``steps``-token draft chain to a ``num_draft_tokens - 1`` chain before the verify input is built."""
    topk, num_steps, n = kwargs.get("topk"), kwargs.get("num_steps"), kwargs.get("num_draft_tokens")
    if not widened(topk, num_steps, n):
        return original_fn(batch, draft_input, parent_list, top_scores_index, draft_tokens, draft_probs, **kwargs)
    width = n - 1
    kwargs["num_steps"] = width
    if batch.forward_mode.is_idle():
        return original_fn(batch, draft_input, parent_list, top_scores_index, draft_tokens, draft_probs, **kwargs)
    if draft_probs is not None:
        raise RuntimeError("HYBRID_SPARK: draft probabilities (rejection sampling) cannot be used with a widened "
                           "verify window")
    bs = draft_tokens.shape[0]
    pad = _pad(draft_tokens.device, width, bs, draft_tokens.dtype)
    tokens = pad.tokens[:bs]
    tokens[:, : draft_tokens.shape[1]].copy_(draft_tokens)
    return original_fn(batch, draft_input, pad.parents[:bs], pad.scores[:bs], tokens, draft_probs, **kwargs)


def apply_wide_chain_hooks() -> list[str]:
    """Register both hooks with SGLang's HookRegistry (idempotent); returns the targets hooked."""
    if _APPLIED:
        return list(_APPLIED)
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(REBUILD_TARGET, rebuild_topk1_hook, HookType.AROUND)
    HookRegistry.register(BUILD_TARGET, verify_input_hook, HookType.AROUND)
    HookRegistry.apply_hooks()
    _APPLIED.extend([REBUILD_TARGET, BUILD_TARGET])
    return list(_APPLIED)
