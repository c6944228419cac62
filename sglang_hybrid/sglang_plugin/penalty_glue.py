"""What both workers do for sampling penalties (``penalties.py``): rows at prefill, this step's penalised rows,
the commits after the step, the metrics. Where the penalties meet the verify logits is each worker's own
(``dspark_worker.py``: before DSpark's accept; ``worker.py``: after the target's verify forward, with SGLang's
relaxed penalties taken off the rows applied here)."""

from __future__ import annotations

import logging
from typing import Any, List, Optional

import torch

from ..hostsync import sync_guard
from ..penalties import PenaltyTable, to_device, is_penalised
from .hooks import SAMPLING_PENALTY_FIELDS, SUPPORTED_SGLANG

logger = logging.getLogger("sglang_hybrid")


def carries_penalties(sampling_info: Any) -> bool:
    """Whether any request of a decode batch has a penalizer on (frequency, presence, repetition, min_new_tokens):
    the overlap scheduler's accumulated tensors exist, or (without overlap) the penalizer's host flag is set. Reads
    no tensor data, so no sync."""
    if sampling_info is None:
        return False
    if any(getattr(sampling_info, f, None) is not None for f in SAMPLING_PENALTY_FIELDS):
        return True
    orchestrator = getattr(sampling_info, "penalizer_orchestrator", None)
    return bool(orchestrator is not None and orchestrator.is_required)


class WorkerPenalties:
    """A worker's penalty table and its per-step bookkeeping (host side; the device work is ``PenaltyTable``'s)."""

    def __init__(self, rows: int, num_slots: int, vocab: int, device, guard: bool, worker: str) -> None:
        self.table: Optional[PenaltyTable] = PenaltyTable(num_slots, vocab, rows, device) if rows > 0 else None
        self.vocab, self._guard, self._worker = vocab, guard, worker
        self.rows: List[int] = []  # this step's batch rows whose penalties are applied (host ints)
        self.min_new = False  # whether min_new_tokens may still hold for one of them
        self.slots: Optional[torch.Tensor] = None  # this step's request-pool slots
        self.steps = 0
        self.steps_unapplied = 0

    def on_prefill(self, batch, first_tokens: torch.Tensor) -> None:
        if self.table is not None and batch.reqs and not batch.forward_mode.is_idle():
            self.table.on_prefill(batch.reqs, [r.kv.req_pool_idx for r in batch.reqs], batch.req_pool_indices,
                                  first_tokens)

    def begin_step(self, batch) -> None:
        """Host side, before the step: the batch rows that hold a table row, whether ``min_new_tokens`` may still
        hold for one of them, and whether a penalised request has none. A batch whose penalizers are all off (the
        common case) costs one flag check, not a loop over its requests."""
        self.rows, self.min_new, self.slots = [], False, batch.req_pool_indices
        if not carries_penalties(batch.sampling_info):
            return
        refused = False
        for i, req in enumerate(batch.reqs):
            sp = req.sampling_params
            if not is_penalised(sp):
                continue
            if self.table is not None and self.table.row_of_slot(req.kv.req_pool_idx) is not None:
                self.rows.append(i)
                # the host's output lags the device's by up to a step: it may only over-state what still holds
                self.min_new |= len(req.output_ids) < sp.min_new_tokens
            else:
                refused = True
        if refused:
            self.note_unapplied("more penalised requests than option penalty_rows "
                                f"({0 if self.table is None else self.table.rows})")

    def apply(self, logits: torch.Tensor, verify_ids: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        """Penalise this step's rows of the verify logits ``[bs * W, V]`` (``verify_ids [bs, W]``, column 0 the root)
        in place; ``bias [bs, V]`` a logit bias they already carry."""
        bs, w = verify_ids.shape
        if logits is None or logits.shape[0] != bs * w or logits.shape[1] != self.vocab:
            self.note_unapplied("the verify's logits are not [bs * window, vocab] (a fused argmax)")
            return
        with sync_guard(self._guard):  # the tests' guard: no host read of device data here
            self.table.apply(logits.view(bs, w, logits.shape[1]), verify_ids, self.slots, self.rows,
                             bias=None if bias is None else bias[:bs], min_new=self.min_new)
        self.steps += 1

    def take_over_relaxed(self, sampling_info) -> None:
        """SGLang's EAGLE verify adds the overlap scheduler's accumulated penalties at every position ("relaxed":
        the output's counts, one token a step): neutral on this step's rows, whose exact penalties ``apply`` puts
        on the logits instead. The tensors are this step's own (``copy_for_forward`` builds them per step)."""
        idx = to_device(self.rows, torch.int64, self.slots.device)
        if sampling_info.acc_additive_penalties is not None:
            sampling_info.acc_additive_penalties.index_fill_(0, idx, 0.0)
        if sampling_info.acc_scaling_penalties is not None:
            sampling_info.acc_scaling_penalties.index_fill_(0, idx, 1.0)

    def commit(self, batch, committed: torch.Tensor, accept_lens: torch.Tensor) -> None:
        """After the step: the committed tokens join the penalised requests' counts (the rest: the sink row)."""
        if self.rows:
            bs = batch.req_pool_indices.shape[0]
            with sync_guard(self._guard):
                self.table.commit(batch.req_pool_indices, committed.view(bs, -1), accept_lens)
            self.rows = []

    def note_unapplied(self, why: str) -> None:
        """Count (metric ``penalty_steps_unapplied``) and, once, warn: some request's penalties were not applied."""
        self.steps_unapplied += 1
        if self.steps_unapplied == 1:
            logger.warning(
                "HYBRID_SPARK (%s): a request's sampling penalties were not applied exactly on a step (%s); it "
                "decodes as SGLang %s's %s verify treats penalties. Counted in metric penalty_steps_unapplied.",
                self._worker, why, SUPPORTED_SGLANG, self._worker)

    def metrics(self) -> dict:
        t = self.table
        return {
            "penalty_steps": self.steps,
            "penalty_steps_unapplied": self.steps_unapplied,
            "penalty_rows": 0 if t is None else t.rows,
            "penalty_rows_in_use": 0 if t is None else t.rows_in_use,
            "penalty_rows_refused": 0 if t is None else t.refused,
        }
