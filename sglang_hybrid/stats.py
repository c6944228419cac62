"""After-verify bookkeeping of Hybrid Spark: device counters, per-slot statistics and the online refit of the
model chain's per-position acceptance; all of it into buffers allocated once, for the largest batch.

``StepStats.update`` runs in the decode step: a fixed sequence of ``out=`` / in-place kernels, no host read,
no allocation (``tests/test_step.py`` counts allocations with the profiler). The host reads the counters only
from pinned copies, at most one step stale (``metrics`` / ``request_metrics``).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from .backend import resolve_backend

# Device counter slots.
C_STEPS, C_REQ_STEPS, C_NGRAM_CHOSEN, C_PROP_MODEL, C_PROP_NGRAM, C_ACC_MODEL, C_ACC_NGRAM, C_VERIFIED = range(8)
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
SLOT_STAT_NAMES = ("steps", "ngram_chosen", "accepted_ngram", "accepted_model")
# Per-request columns summed into the counters: [1, n-gram chosen, acc*ng, acc*m, vlen*m, vlen*ng, vlen];
# the first four are also the per-slot statistics.
_SUMMED = (C_REQ_STEPS, C_NGRAM_CHOSEN, C_ACC_NGRAM, C_ACC_MODEL, C_PROP_MODEL, C_PROP_NGRAM, C_VERIFIED)


class StepStats:
    """Counters and the model chain's online acceptance estimate for batches of up to ``max_bs`` requests."""

    def __init__(self, *, num_slots: int, max_bs: int, gamma: int, model_prior: float, model_ema: float,
                 device: torch.device, backend: str = "auto") -> None:
        kw = dict(device=device)
        # The per-request part of update: the torch ops of _elems_torch (the reference, what the CPU runs) or one
        # Triton launch (stats_kernel.py; "auto" on CUDA), equal exactly (integers and 0/1 flags).
        self.backend = resolve_backend(backend, device)
        self._elems, self._reduce = self._elems_torch, self._reduce_torch
        if self.backend == "triton":
            from functools import partial

            from .stats_kernel import stats_elems_triton, stats_reduce_triton

            self._elems, self._reduce = stats_elems_triton, partial(stats_reduce_triton, self)
        self.model_ema = float(model_ema)
        # Per-position conditional acceptance of the model chain, refit from model-chain steps.
        self.model_cond = torch.full((gamma,), model_prior, dtype=torch.float32, **kw)
        self.counters = torch.zeros(len(COUNTER_NAMES), dtype=torch.int64, **kw)
        self.price = torch.zeros(1, dtype=torch.float32, **kw)
        self.slot_stats = torch.zeros(num_slots, len(SLOT_STAT_NAMES), dtype=torch.int64, **kw)
        pin = device.type == "cuda"
        # Staged for the host: the counters, the price, the most drafts one request accepted / verified in a step.
        self._host_counters = torch.zeros(len(COUNTER_NAMES) + 3, dtype=torch.float64, pin_memory=pin)
        self._host_slot_stats = torch.zeros(num_slots, len(SLOT_STAT_NAMES), dtype=torch.int64, pin_memory=pin)
        self._stage = torch.zeros(len(COUNTER_NAMES) + 3, dtype=torch.float64, **kw)
        self.max_accepted = torch.zeros(1, dtype=torch.int64, **kw)
        self.max_verified = torch.zeros(1, dtype=torch.int64, **kw)
        self._step_max = torch.zeros(1, dtype=torch.int64, **kw)
        # Scratch.
        self._acc = torch.zeros(max_bs, dtype=torch.int64, **kw)
        self._vlen = torch.zeros(max_bs, dtype=torch.int64, **kw)
        self._is_ng = torch.zeros(max_bs, dtype=torch.bool, **kw)
        self._is_m = torch.zeros(max_bs, dtype=torch.bool, **kw)
        self._ng = torch.zeros(max_bs, dtype=torch.int64, **kw)  # is_ng / is_m as 0/1 integers
        self._m = torch.zeros(max_bs, dtype=torch.int64, **kw)
        self._per_req = torch.zeros(max_bs, len(_SUMMED), dtype=torch.int64, **kw)
        self._sums = torch.zeros(len(_SUMMED), dtype=torch.int64, **kw)
        self._sum_idx = torch.tensor(_SUMMED, dtype=torch.int64, **kw)
        self._pos = torch.arange(1, gamma + 1, dtype=torch.int64, **kw).view(1, -1)
        self._pos_m1 = self._pos - 1
        self._tried = torch.zeros(max_bs, gamma, dtype=torch.bool, **kw)
        self._ok = torch.zeros(max_bs, gamma, dtype=torch.bool, **kw)
        self._tried_f = torch.zeros(max_bs, gamma, dtype=torch.float32, **kw)
        self._ok_f = torch.zeros(max_bs, gamma, dtype=torch.float32, **kw)
        # Constants as device tensors: a Python number in a tensor op is wrapped into a fresh tensor each call.
        self._one = torch.ones((), dtype=torch.int64, **kw)
        self._one_i32 = torch.ones((), dtype=torch.int32, **kw)
        self._zero_f = torch.zeros((), dtype=torch.float32, **kw)
        self._ema = torch.full((), self.model_ema, dtype=torch.float32, **kw)
        self._trials = torch.zeros(gamma, dtype=torch.float32, **kw)
        self._hits = torch.zeros(gamma, dtype=torch.float32, **kw)
        self._seen = torch.zeros(gamma, dtype=torch.bool, **kw)
        n = len(COUNTER_NAMES)
        self._steps_counter = self.counters[C_STEPS : C_STEPS + 1]
        self._stage_parts = ((self._stage[:n], self.counters), (self._stage[n : n + 1], self.price),
                             (self._stage[n + 1 : n + 2], self.max_accepted), (self._stage[n + 2 :], self.max_verified))
        self._view_cache: dict[int, SimpleNamespace] = {}

    def _views(self, bs: int) -> SimpleNamespace:
        """The ``[:bs]`` slices ``update`` uses, made once per batch size (each slice is a Python-level op that
        an eagerly launched step pays on every call)."""
        v = self._view_cache.get(bs)
        if v is None:
            v = SimpleNamespace(**{name: getattr(self, "_" + name)[:bs] for name in (
                "acc", "vlen", "is_ng", "is_m", "ng", "m", "per_req", "tried", "ok", "tried_f", "ok_f")})
            v.cols = tuple(v.per_req[:, i] for i in range(len(_SUMMED)))
            v.slot_cols = v.per_req[:, : len(SLOT_STAT_NAMES)]
            v.acc_col, v.vlen_col, v.is_m_col = v.acc.view(-1, 1), v.vlen.view(-1, 1), v.is_m.view(-1, 1)
            self._view_cache[bs] = v
        return v

    def update(self, slots: torch.Tensor, verify_len: torch.Tensor, choice: torch.Tensor,
               accept_lens: torch.Tensor) -> None:
        """Count one verify: ``accept_lens[b]`` committed tokens (accepted drafts + bonus) of request ``b``."""
        v = self._views(accept_lens.shape[0])
        refit = self.model_ema > 0
        self._elems(accept_lens, verify_len, choice, v.acc, v.vlen, v.per_req, v.tried_f, v.ok_f, refit)
        if refit:
            self._refit(v)
        self._reduce(slots, v.acc, v.vlen, v.per_req)
        # Asynchronous device-to-host copies: the host reads them later, one step stale at most.
        self._host_slot_stats.copy_(self.slot_stats, non_blocking=True)
        self._host_counters.copy_(self._stage, non_blocking=True)

    def _reduce_torch(self, slots: torch.Tensor, acc: torch.Tensor, vlen: torch.Tensor, per_req: torch.Tensor) -> None:
        """The batch's part of ``update`` (the torch reference of ``stats_kernel.stats_reduce_triton``): the summed
        columns into the counters, the step counted, the per-slot statistics, the running maxima of accepted and
        verified drafts, and the staging row the host copy reads."""
        torch.sum(per_req, 0, out=self._sums)
        self.counters.index_add_(0, self._sum_idx, self._sums)
        self._steps_counter.add_(self._one)
        v = self._views(acc.shape[0])
        cols = v.slot_cols if per_req is v.per_req else per_req[:, : len(SLOT_STAT_NAMES)]
        self.slot_stats.index_add_(0, slots, cols)
        torch.amax(acc, 0, keepdim=True, out=self._step_max)
        torch.maximum(self.max_accepted, self._step_max, out=self.max_accepted)
        torch.amax(vlen, 0, keepdim=True, out=self._step_max)
        torch.maximum(self.max_verified, self._step_max, out=self.max_verified)
        for part, src in self._stage_parts:
            part.copy_(src)

    def _elems_torch(self, accept_lens: torch.Tensor, verify_len: torch.Tensor, choice: torch.Tensor,
                     acc: torch.Tensor, vlen: torch.Tensor, per_req: torch.Tensor, tried_f: torch.Tensor,
                     ok_f: torch.Tensor, refit: bool) -> None:
        """Each request's part of ``update`` (the torch reference of ``stats_kernel.stats_elems_triton``):
        ``acc`` / ``vlen [bs]`` its accepted and verified drafts, ``per_req [bs, 7]`` its summed columns
        (``_SUMMED``) and, with ``refit``, ``tried_f`` / ``ok_f [bs, gamma]``: position j of a model chain verified
        with every position before it accepted, and position j accepted too."""
        bs = acc.shape[0]
        v = self._views(bs)  # scratch, and the cached column views when the outputs are this object's rows
        is_ng, is_m, ng, m = v.is_ng, v.is_m, v.ng, v.m
        acc.copy_(accept_lens)
        torch.sub(acc, self._one, out=acc)
        acc.clamp_(min=0)
        vlen.copy_(verify_len)
        torch.eq(choice, self._one_i32 if choice.dtype == torch.int32 else self._one, out=is_ng)
        torch.logical_not(is_ng, out=is_m)
        ng.copy_(is_ng)
        m.copy_(is_m)
        c = v.cols if per_req is v.per_req else per_req.unbind(1)
        c[0].fill_(1)
        c[1].copy_(ng)
        torch.mul(acc, ng, out=c[2])
        torch.mul(acc, m, out=c[3])
        torch.mul(vlen, m, out=c[4])
        torch.mul(vlen, ng, out=c[5])
        c[6].copy_(vlen)
        if refit:
            tried, ok = v.tried, v.ok
            acc_col = v.acc_col if acc is v.acc else acc.view(-1, 1)
            vlen_col = v.vlen_col if vlen is v.vlen else vlen.view(-1, 1)
            torch.ge(vlen_col, self._pos, out=tried)
            torch.ge(acc_col, self._pos_m1, out=ok)
            tried.logical_and_(ok).logical_and_(v.is_m_col)
            torch.ge(acc_col, self._pos, out=ok)
            ok.logical_and_(tried)
            tried_f.copy_(tried)
            ok_f.copy_(ok)

    def _refit(self, v: SimpleNamespace) -> None:
        """EMA of the per-position conditional acceptance over the model-chain requests that reached position j
        (``v``: this batch size's views, ``_views``; ``v.tried_f`` / ``v.ok_f`` from ``_elems``)."""
        tried_f, ok_f = v.tried_f, v.ok_f
        torch.sum(tried_f, 0, out=self._trials)
        torch.sum(ok_f, 0, out=self._hits)
        torch.gt(self._trials, self._zero_f, out=self._seen)
        self._trials.clamp_(min=1.0)
        self._hits.div_(self._trials)  # the observed rate
        torch.mul(self._hits, self._ema, out=self._hits).add_(self.model_cond, alpha=1.0 - self.model_ema)
        torch.where(self._seen, self._hits, self.model_cond, out=self.model_cond)
        self.model_cond.clamp_(1e-3, 1.0)

    # ---- host side (never waits on the device) --------------------------------------------------------
    def metrics(self) -> dict:
        v = self._host_counters.tolist()
        n = len(COUNTER_NAMES)
        m = dict(zip(COUNTER_NAMES, (int(x) for x in v[:n])))
        m["price"] = float(v[n])
        m["max_accepted_drafts_in_step"] = int(v[n + 1])
        m["max_verified_drafts_in_step"] = int(v[n + 2])
        rs = max(m["request_steps"], 1)
        m["ngram_win_rate"] = m["ngram_chosen"] / rs
        m["mean_accept_length"] = 1.0 + (m["accepted_model"] + m["accepted_ngram"]) / rs
        return m

    def request_metrics(self, slot: int) -> dict:
        """This slot's request's counters (for ``meta_info``), at most one step stale."""
        steps, ng, acc_ng, acc_m = (int(x) for x in self._host_slot_stats[slot].tolist())
        return {
            "verify_steps": steps,
            "ngram_chosen_steps": ng,
            "accepted_ngram": acc_ng,
            "accepted_model": acc_m,
            "ngram_win_rate": ng / steps if steps else 0.0,
        }
