"""One Hybrid Spark decode step on tensors: n-gram lookup, calibration, price-based selection, bookkeeping.

This is the SGLang-independent core the worker calls (``sglang_plugin/worker.py``); it owns the device state:
the token-history table, the calibration table, the selection buffers, the online estimate of the model
chain's per-position acceptance, and the device counters behind the metrics.

Decode-step rules (what keeps SGLang's overlap scheduler and CUDA graphs working): ``propose`` and ``record``
never read a device tensor back to the host, never branch on device data, and write into buffers allocated
at construction for the largest batch. ``SGLANG_HYBRID_SYNC_GUARD=1`` makes any host read inside them raise
(the CPU end-to-end tests run with it).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch

from .calibration import CalibrationTable
from .config import HybridConfig
from .hostsync import HostSyncError, sync_guard  # noqa: F401 (re-exported)
from .ngram import NgramConfig, TokenHistory
from .selection import SelectionBuffers, select_chains

logger = logging.getLogger("sglang_hybrid")

# Device counter slots.
C_STEPS, C_REQ_STEPS, C_NGRAM_CHOSEN, C_PROP_MODEL, C_PROP_NGRAM, C_ACC_MODEL, C_ACC_NGRAM, C_VERIFIED = range(8)
SLOT_STAT_NAMES = ("steps", "ngram_chosen", "accepted_ngram", "accepted_model")
COUNTER_NAMES = (
    "decode_steps",
    "request_steps",
    "ngram_chosen",
    "proposed_model",
    "proposed_ngram",
    "accepted_model",
    "accepted_ngram",
    "verified_draft_tokens",
)


@dataclass
class Proposal:
    """Views of preallocated buffers: the merged chain to verify for each request."""

    tokens: torch.Tensor  # [bs, width] int32 (width = max(gamma, n-gram chain length))
    verify_len: torch.Tensor  # [bs] int32, draft tokens to verify (0..width)
    choice: torch.Tensor  # [bs] int32, 1 = n-gram chain
    survival: torch.Tensor  # [bs, width] float32, the chosen chain's prefix survivals (0 past its length)


class HybridStep:
    """Device state and per-step work of Hybrid Spark for a chain drafter of ``gamma`` tokens.

    ``verify_window``: draft tokens the target verifies per request (SGLang's ``speculative_num_draft_tokens``
    minus the root); defaults to ``gamma``. A wider window lets n-gram chains run past the model chain: the n-gram
    chain length is ``cfg.max_draft`` (0 = the whole window), capped by the window.
    """

    def __init__(
        self,
        cfg: HybridConfig,
        *,
        num_slots: int,
        width: int,
        gamma: int,
        max_bs: int,
        device: torch.device | str,
        calibration: Optional[CalibrationTable] = None,
        sps_dense: Optional[torch.Tensor] = None,
        max_context_len: Optional[int] = None,
        verify_window: Optional[int] = None,
    ) -> None:
        cfg.validate()
        self.cfg = cfg
        self.gamma = gamma
        window = gamma if verify_window is None else int(verify_window)
        if window < gamma:
            raise ValueError(f"HybridStep: verify_window ({window}) must be >= gamma ({gamma})")
        self.verify_window = window
        self.max_bs = max_bs
        self.device = torch.device(device)
        # N-gram chains fill the verify window unless max_draft asks for fewer.
        self.ngram_cfg = NgramConfig(
            n_min=cfg.n_min, n_max=cfg.n_max, max_draft=min(cfg.max_draft or window, window), window=cfg.window
        )
        self.ngram_cfg.validate()
        self.history = TokenHistory(
            num_slots, width, self.device, max_batch_size=max_bs, max_context_len=max_context_len,
            max_draft=self.ngram_cfg.max_draft,
        )
        self.calibration = calibration if calibration is not None else CalibrationTable.load_default()
        self.calibration.check_covers(self.ngram_cfg)
        self.calib_dev = self.calibration.to_device(self.device)
        L = self.ngram_cfg.max_draft
        self.q = torch.zeros(max_bs, L, dtype=torch.float32, device=self.device)
        self.ngram_surv = torch.zeros(max_bs, L, dtype=torch.float32, device=self.device)
        self.model_surv = torch.zeros(max_bs, gamma, dtype=torch.float32, device=self.device)
        self.model_tokens = torch.zeros(max_bs, gamma, dtype=torch.int32, device=self.device)
        self.model_cond = torch.full((gamma,), cfg.model_prior, dtype=torch.float32, device=self.device)
        self.width = max(gamma, L)  # columns of a proposal; verify lengths are capped by it
        self.sel = SelectionBuffers(max_bs, self.width, self.device)
        self.conf = torch.zeros(max_bs, self.width, dtype=torch.float32, device=self.device)
        self.conf_prev = torch.zeros(max_bs, self.width, dtype=torch.float32, device=self.device)
        self.sps_dense = sps_dense
        self._budgets: dict[int, torch.Tensor] = {}
        self.counters = torch.zeros(len(COUNTER_NAMES), dtype=torch.int64, device=self.device)
        self.price = torch.zeros(1, dtype=torch.float32, device=self.device)
        pin = self.device.type == "cuda"
        self._host_counters = torch.zeros(len(COUNTER_NAMES) + 1, dtype=torch.float64, pin_memory=pin)
        self._stage = torch.zeros(len(COUNTER_NAMES) + 1, dtype=torch.float64, device=self.device)
        # Per request-pool slot: [steps, n-gram chosen, accepted n-gram tokens, accepted model tokens].
        self.slot_stats = torch.zeros(num_slots, len(SLOT_STAT_NAMES), dtype=torch.int64, device=self.device)
        self._host_slot_stats = torch.zeros_like(self.slot_stats, device="cpu").pin_memory() if pin else (
            torch.zeros_like(self.slot_stats, device="cpu"))
        self._pos = torch.arange(1, gamma + 1, dtype=torch.int32, device=self.device)
        self._guard = os.environ.get("SGLANG_HYBRID_SYNC_GUARD", "") == "1"
        self._steps_host = 0

    # ---- prefill (host-driven, off the decode path) ------------------------------------------------
    def on_prefill(self, slots: torch.Tensor, prompt: torch.Tensor, prompt_len: torch.Tensor,
                   first_tokens: torch.Tensor) -> None:
        """Start each slot's history with its prompt and the first sampled token."""
        self.history.write_prompt(slots, prompt, prompt_len)
        self.slot_stats.index_fill_(0, slots.to(torch.int64), 0)
        ones = torch.ones_like(slots, dtype=torch.int32)
        self.history.append(slots, first_tokens.to(torch.int32).view(-1, 1), ones)

    # ---- decode step --------------------------------------------------------------------------------
    def _budget(self, bs: int) -> Optional[torch.Tensor]:
        if self.sps_dense is not None:
            return None
        b = self._budgets.get(bs)
        if b is None:  # host-known shape only: the fixed verify width
            b = torch.full((1,), bs * self.width, dtype=torch.int32, device=self.device)
            self._budgets[bs] = b
        return b

    def propose(self, slots: torch.Tensor, model_tokens: torch.Tensor,
                model_confidence: Optional[torch.Tensor] = None) -> Proposal:
        """Choose, per request, the model chain ``model_tokens [bs, gamma]`` or the n-gram chain.

        ``model_confidence [bs, gamma]``: the drafter's per-token conditional acceptance estimates when it has
        them (DSpark's confidence head); without them (EAGLE-family chains report a constant 1.0) the online
        per-position estimate is used.
        """
        bs = model_tokens.shape[0]
        with sync_guard(self._guard):
            draft = self.history.lookup(slots, self.ngram_cfg)
            q, ngram_surv = self.q[:bs], self.ngram_surv[:bs]
            self.calib_dev.apply(draft, model_tokens, q, ngram_surv)
            ngram_len = draft.length
            model_surv = self.model_surv[:bs]
            if self.cfg.enable_model and model_confidence is not None:
                torch.cumprod(model_confidence.to(torch.float32).clamp(0.0, 1.0), 1, out=model_surv)
            elif self.cfg.enable_model:
                model_surv.copy_(torch.cumprod(self.model_cond, 0).expand(bs, -1))
            else:
                model_surv.zero_()
            if not self.cfg.enable_ngram:
                ngram_len = ngram_len.mul(0)
            mt = self.model_tokens[:bs]
            mt.copy_(model_tokens)
            out = self.sel.view(bs)
            select_chains(
                mt, model_surv, draft.tokens, ngram_surv, ngram_len,
                self._budget(bs), self.sps_dense, out,
                num_iters=self.cfg.num_iters, max_verify_len=self.width,
            )
            self.price.copy_(out.price)
            return Proposal(tokens=out.tokens[:, : self.width], verify_len=out.verify_len, choice=out.choice,
                            survival=out.survival[:, : self.width])

    def conditional_confidence(self, proposal: Proposal) -> torch.Tensor:
        """The chosen chains as per-token conditional acceptance ``[bs, width]`` (DSpark's ``confidence``).

        ``c_j = S_j / S_{j-1}`` (``S_0 = 1``), 0 past a chain's length, so ``cumprod(c) == proposal.survival``
        up to rounding: what a DSpark-style planner takes to set budgets and verify lengths.
        """
        s = proposal.survival
        bs = s.shape[0]
        with sync_guard(self._guard):
            out = self.conf[:bs]
            prev = self.conf_prev[:bs]
            prev[:, :1].fill_(1.0)
            prev[:, 1:].copy_(s[:, :-1])
            torch.div(s, prev.clamp_(min=1e-12), out=out)
            return out.clamp_(0.0, 1.0)

    def record(self, slots: torch.Tensor, proposal: Proposal, committed: torch.Tensor,
               accept_lens: torch.Tensor) -> None:
        """After verify: append ``committed[b, :accept_lens[b]]`` (accepted drafts + bonus) and update stats."""
        bs = committed.shape[0]
        with sync_guard(self._guard):
            counts = accept_lens.to(torch.int32)
            self.history.append(slots, committed.to(torch.int32), counts)
            acc = (counts - 1).clamp_(min=0)
            vlen = proposal.verify_len
            is_ng = proposal.choice == 1
            is_m = ~is_ng
            # Online refit of the model chain's per-position conditional acceptance (model-chain steps only).
            if self.cfg.model_ema > 0:
                j = self._pos.view(1, -1)
                tried = is_m.view(-1, 1) & (vlen.view(-1, 1) >= j) & (acc.view(-1, 1) >= j - 1)
                ok = tried & (acc.view(-1, 1) >= j)
                trials = tried.sum(0).to(torch.float32)
                rate = ok.sum(0).to(torch.float32) / trials.clamp(min=1.0)
                upd = (1 - self.cfg.model_ema) * self.model_cond + self.cfg.model_ema * rate
                self.model_cond.copy_(torch.where(trials > 0, upd, self.model_cond).clamp_(1e-3, 1.0))
            c = self.counters
            c[C_STEPS] += 1
            c[C_REQ_STEPS] += bs
            c[C_NGRAM_CHOSEN] += is_ng.sum()
            c[C_PROP_MODEL] += (vlen * is_m).sum()
            c[C_PROP_NGRAM] += (vlen * is_ng).sum()
            c[C_ACC_MODEL] += (acc * is_m).sum()
            c[C_ACC_NGRAM] += (acc * is_ng).sum()
            c[C_VERIFIED] += vlen.sum()
            per_req = torch.stack([torch.ones_like(acc), is_ng.to(acc.dtype), acc * is_ng, acc * is_m], 1)
            self.slot_stats.index_add_(0, slots.to(torch.int64), per_req.to(torch.int64))
            self._host_slot_stats.copy_(self.slot_stats, non_blocking=True)
            # Asynchronous device-to-host copy: the host reads it later, one step stale at most.
            self._stage[:-1].copy_(c)
            self._stage[-1:].copy_(self.price)
            self._host_counters.copy_(self._stage, non_blocking=True)
        self._steps_host += 1

    # ---- metrics (host side, never waits on the device) --------------------------------------------
    def metrics(self) -> dict:
        v = self._host_counters.tolist()
        m = dict(zip(COUNTER_NAMES, (int(x) for x in v[:-1])))
        m["price"] = float(v[-1])
        rs = max(m["request_steps"], 1)
        m["ngram_win_rate"] = m["ngram_chosen"] / rs
        m["mean_accept_length"] = 1.0 + (m["accepted_model"] + m["accepted_ngram"]) / rs
        return m

    def request_metrics(self, slot: int) -> dict:
        """Host-side, at most one step stale: this slot's request's counters (for ``meta_info``)."""
        steps, ng, acc_ng, acc_m = (int(x) for x in self._host_slot_stats[slot].tolist())
        return {
            "verify_steps": steps,
            "ngram_chosen_steps": ng,
            "accepted_ngram": acc_ng,
            "accepted_model": acc_m,
            "ngram_win_rate": ng / steps if steps else 0.0,
        }

    def should_log(self) -> bool:
        n = self.cfg.metrics_interval
        return n > 0 and self._steps_host % n == 0
