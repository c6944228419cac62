"""One Hybrid Spark decode step on tensors: n-gram lookup, calibration, price-based selection, bookkeeping.

This is the SGLang-independent core the worker calls (``sglang_plugin/worker.py``); it owns the device state:
the token-history table, the cross-request n-gram corpus (when ``cfg.corpus`` is on), the calibration table,
the selection buffers, the online estimate of the model chain's per-position acceptance, and the device
counters behind the metrics.

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
from .calibration.agreement import ModelAgreement
from .calibration.agreement import conditional as _conditional
from .calibration.apply import DeviceCalibration
from .calibration.candidates import make_step_corpus
from .calibration.online import OnlineCalibration
from .calibration.echo import make_step_echo
from .calibration.splice import make_step_splice
from .calibration.tail import make_step_corpus_tail, make_step_tail
from .config import HybridConfig
from .hostsync import HostSyncError, sync_guard  # noqa: F401 (re-exported)
from .ngram import NgramConfig, TokenHistory
from .selection import SelectionBuffers, select_chains
from .selection.fairness import FairWeights
from .selection.sps2d import DenseSps2D, Sps2DTable
from .stats import COUNTER_NAMES, SLOT_STAT_NAMES, StepStats  # noqa: F401 (re-exported)

logger = logging.getLogger("sglang_hybrid")
TENANTS_TRACKED = 1 << 16  # distinct tenant ids the metric tenants_seen counts (host memory stays bounded)

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

    # Host-side counters ``propose`` / ``record`` keep in Python (a graph replay of them runs none of it).
    HOST_COUNTERS = ("active_window", "window_switches", "narrow_steps", "_steps_host")

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
        sps2d: Optional[Sps2DTable] = None,
        max_context_len: Optional[int] = None,
        verify_window: Optional[int] = None,
        kernel_backend: str = "auto",
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
            max_draft=self.ngram_cfg.max_draft, backend=kernel_backend,
        )
        self.kernel_backend = kernel_backend
        self.calibration = calibration if calibration is not None else CalibrationTable.load_default()
        self.calibration.check_covers(self.ngram_cfg)
        self.calib_dev = DeviceCalibration(self.calibration, self.device, backend=kernel_backend)
        L = self.ngram_cfg.max_draft
        # Per-request recalibration of the table's estimates (None: the table alone).
        self.online = OnlineCalibration(num_slots, max_bs, L, self.device, cfg.online_strength,
                                        defer=cfg.online_defer, bins=cfg.online_bins, backend=kernel_backend) \
            if cfg.online_calibration else None
        self._hist_start = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        # The cross-request corpus (cfg.corpus != "off"): a second n-gram candidate per request, priced by its
        # own calibration; the better of the two goes to the selection. ``slot_tenant``: each slot's tenant id
        # (written at prefill where ``tracks_tenant``; a "shared" corpus reads every id as 0).
        self.corpus, self.corpus_cand = make_step_corpus(
            cfg.corpus, cfg.corpus_entries, num_slots=num_slots, max_bs=max_bs, width=L, device=self.device,
            backend=kernel_backend, online=cfg.online_calibration, strength=cfg.online_strength,
            table=cfg.corpus_calibration)
        # Both model-free candidates re-priced beside the model chain (calibration/agreement.py).
        self.agreement = ModelAgreement(max_bs, L, gamma, self.device, strength=cfg.online_strength,
                                        backend=kernel_backend) \
            if cfg.model_agreement and cfg.enable_model and cfg.enable_ngram else None
        self.slot_tenant = torch.zeros(num_slots, dtype=torch.int32, device=self.device)
        self._tenant = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.q = torch.zeros(max_bs, L, dtype=torch.float32, device=self.device)
        self.ngram_surv = torch.zeros(max_bs, L, dtype=torch.float32, device=self.device)
        self.model_surv = torch.zeros(max_bs, gamma, dtype=torch.float32, device=self.device)
        self.model_tokens = torch.zeros(max_bs, gamma, dtype=torch.int32, device=self.device)
        self.width = max(gamma, L)  # columns of a proposal; verify lengths are capped by it
        # The n-gram tail after the model chain (calibration/tail.py): it fills the columns past gamma.
        self.tail = make_step_tail(
            cfg.model_tail if cfg.enable_model and cfg.enable_ngram else 0, width=self.width, gamma=gamma,
            n_min=cfg.n_min, n_max=cfg.n_max, window=cfg.window, num_slots=num_slots, max_bs=max_bs,
            device=self.device, online=cfg.online_calibration, strength=cfg.online_strength, backend=kernel_backend)
        if self.tail is not None:
            self.history.reserve_after(gamma)
        # The corpus's tail beside the n-gram one (the better of the two per request; calibration/tail.py).
        self.ctail = make_step_corpus_tail(cfg.corpus_tail, self.corpus, self.corpus_cand, self.tail,
                                           num_slots=num_slots, max_bs=max_bs, gamma=gamma, device=self.device,
                                           online=cfg.online_calibration, strength=cfg.online_strength,
                                           backend=kernel_backend)
        # Splices of the model chain (calibration/splice.py): the chain cut after token k and continued by the
        # request's own n-gram, kept where it beats the model chain (as the tail extended it) by a margin.
        self.splice = make_step_splice(
            cfg.model_splices if cfg.enable_model and cfg.enable_ngram else 0, cfg.splice_margin,
            width=gamma + (self.tail.tail if self.tail is not None else 0), gamma=gamma, lookup_cfg=self.ngram_cfg,
            max_bs=max_bs, device=self.device)
        # The history's echo of the model chain (calibration/echo.py): the model tokens a lookup after them (the
        # tail's, the probes' (echo_probes), the splices') finds in the history, priced by the traffic's record.
        self.echo = make_step_echo(
            cfg.model_echo and cfg.enable_model and cfg.enable_ngram, tail=self.tail is not None,
            splice_points=self.splice.points if self.splice is not None else (), probes=cfg.echo_probes,
            lookup_cfg=self.ngram_cfg, max_bs=max_bs, gamma=gamma,
            width=gamma + (self.tail.tail if self.tail is not None else 0), device=self.device,
            strength=cfg.online_strength)
        if self.splice is not None:
            self.history.reserve_after(gamma)
            self._raw_surv = torch.zeros(max_bs, gamma, dtype=torch.float32, device=self.device)
        self.sel = SelectionBuffers(max_bs, self.width, self.device)
        # Fairness between requests (option ``fairness``, selection/fairness.py): each request's survivals are
        # weighted by its speed relative to DSpark's plan for it before the selection. None (no ops at all) when 0,
        # and without an SPS table (a fixed verify window has no budget for the weights to move).
        self.fair = FairWeights(num_slots, max_bs, gamma, self.width, cfg.fairness, sps_dense, self.device,
                                backend=kernel_backend, scope=cfg.fairness_scope) \
            if cfg.fairness > 0 and sps_dense is not None else None
        # Whether prefill must hand each request's tenant id (the corpus per tenant, or fairness between tenants).
        self.tracks_tenant = cfg.corpus == "tenant" or (self.fair is not None and self.fair.scope == "tenant")
        if cfg.fairness > 0 and sps_dense is None:
            logger.warning("HYBRID_SPARK: fairness=%g has no effect with a fixed verify window (no SPS budget to "
                           "share); it applies on DSpark's ragged verify", cfg.fairness)
        if cfg.fairness == 0 and cfg.fairness_scope != "request":
            logger.warning("HYBRID_SPARK: fairness_scope=%s has no effect with fairness=0 (set fairness, e.g. 2-4)",
                           cfg.fairness_scope)
        if cfg.tenant_key != "cache" and not self.tracks_tenant:
            logger.warning("HYBRID_SPARK: tenant_key=%s has no effect: nothing reads tenants (set corpus=tenant, or "
                           "fairness_scope=tenant with fairness > 0 on DSpark's ragged verify)", cfg.tenant_key)
        if cfg.corpus == "tenant" and cfg.tenant_key == "routing_key":
            logger.warning("HYBRID_SPARK: corpus=tenant with tenant_key=routing_key isolates the corpus by routing key "
                           "only: requests with different cache_salt / extra_key but one routing key share its "
                           "continuations (tenant_key=cache+routing_key keeps them apart)")
        # Distinct tenant ids prefilled so far (host ints from the workers' prefill hook; metric tenants_seen).
        self._tenants_seen: set = set()
        if self.fair is not None:
            self._fair_model = torch.zeros(max_bs, self.width, dtype=torch.float32, device=self.device)
            self._fair_ngram = torch.zeros(max_bs, L, dtype=torch.float32, device=self.device)
        self.conf = torch.zeros(max_bs, self.width, dtype=torch.float32, device=self.device)
        self.conf_prev = torch.zeros(max_bs, self.width, dtype=torch.float32, device=self.device)
        self.sps_dense = sps_dense
        # A 2-D SPS table (selection/sps2d.py): the price row is rewritten each step for the step's KV context.
        self.sps2d = DenseSps2D(sps2d, sps_dense.shape[0] - 1, self.device) \
            if sps2d is not None and sps_dense is not None else None
        self._budgets: dict[int, torch.Tensor] = {}
        self._cond_surv = torch.zeros(gamma, dtype=torch.float32, device=self.device)
        self._no_ngram = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        # planner_confidence scratch (DSpark worker); G <= the verify window.
        g_max = max(window, L)
        self._ng_conf = torch.zeros(max_bs, g_max, dtype=torch.float32, device=self.device)
        self._ng_prev = torch.zeros(max_bs, L, dtype=torch.float32, device=self.device)
        self._model_conf = torch.zeros(max_bs, g_max, dtype=torch.float32, device=self.device)
        self._in_chain = torch.zeros(max_bs, g_max, dtype=torch.bool, device=self.device)
        self._is_ng = torch.zeros(max_bs, dtype=torch.bool, device=self.device)
        self._cols = torch.arange(g_max, dtype=torch.int32, device=self.device).view(1, -1)
        self._one_i32 = torch.ones((), dtype=torch.int32, device=self.device)
        self._zero_f = torch.zeros((), dtype=torch.float32, device=self.device)
        self._ngram_len = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.stats = StepStats(num_slots=num_slots, max_bs=max_bs, gamma=gamma, model_prior=cfg.model_prior,
                               model_ema=cfg.model_ema, device=self.device, backend=kernel_backend)
        self.model_cond = self.stats.model_cond  # the model chain's online per-position acceptance
        self.price = self.stats.price
        self._guard = os.environ.get("SGLANG_HYBRID_SYNC_GUARD", "") == "1"
        self.active_window = self.verify_window  # the last step's verify window, root excluded (host int)
        self.window_switches = 0
        self.extra_metrics: dict = {}  # set by the worker glue (e.g. narrow_above auto), reported by metrics()
        self.narrow_steps = 0  # decode steps verified with a window narrower than verify_window
        self._steps_host = 0

    # ---- prefill (host-driven, off the decode path) ------------------------------------------------
    def on_prefill(self, slots: torch.Tensor, prompt: torch.Tensor, prompt_len: torch.Tensor,
                   first_tokens: torch.Tensor, tenant: Optional[torch.Tensor] = None) -> None:
        """Start each slot's history with its prompt and the first sampled token.

        ``tenant [bs]`` int32: each request's tenant id (read where ``tracks_tenant``; default 0)."""
        self.history.write_prompt(slots, prompt, prompt_len)
        self.stats.slot_stats.index_fill_(0, slots.to(torch.int64), 0)
        if self.fair is not None:
            self.fair.reset(slots)
        if self.online is not None:
            self.online.reset(slots)
        if self.tail is not None:
            self.tail.reset(slots)
        if self.ctail is not None:
            self.ctail.reset(slots)
        if self.corpus is not None:
            self.corpus_cand.reset(slots)
        if self.tracks_tenant:  # elsewhere nothing reads slot_tenant (a "shared" corpus reads every id as 0)
            s = slots.to(torch.int64)
            if tenant is None:
                self.slot_tenant.index_fill_(0, s, 0)
            else:
                self.slot_tenant.index_copy_(0, s, tenant.to(device=self.device, dtype=torch.int32))
        ones = torch.ones_like(slots, dtype=torch.int32)
        self.history.append(slots, first_tokens.to(torch.int32).view(-1, 1), ones)

    def note_tenants(self, ids) -> None:
        """Host side, at prefill: remember the distinct tenant ids (at most ``TENANTS_TRACKED``; past that the
        metric ``tenants_seen`` is a floor)."""
        for t in ids:
            if len(self._tenants_seen) >= TENANTS_TRACKED:
                return
            self._tenants_seen.add(int(t))

    # ---- decode step --------------------------------------------------------------------------------
    def _batch_tenant(self, slots: torch.Tensor) -> Optional[torch.Tensor]:
        """The requests' tenant ids (a view of a preallocated buffer), or None where nothing reads tenants (the
        corpus then reads tenant 0, as a "shared" corpus reads every id)."""
        if not self.tracks_tenant:
            return None
        ten = self._tenant[: slots.shape[0]]
        torch.index_select(self.slot_tenant, 0, slots, out=ten)
        return ten

    def _budget(self, bs: int) -> Optional[torch.Tensor]:
        if self.sps_dense is not None:
            return None
        b = self._budgets.get(bs)
        if b is None:  # host-known shape only: the fixed verify width
            b = torch.full((1,), bs * self.width, dtype=torch.int32, device=self.device)
            self._budgets[bs] = b
        return b

    def propose(self, slots: torch.Tensor, model_tokens: torch.Tensor,
                model_confidence: Optional[torch.Tensor] = None, window: Optional[int] = None,
                context_tokens: Optional[torch.Tensor] = None) -> Proposal:
        """Choose, per request, the model chain ``model_tokens [bs, gamma]`` or the n-gram chain.

        ``model_confidence [bs, gamma]``: the drafter's per-token conditional acceptance estimates when it has
        them (DSpark's confidence head); without them (EAGLE-family chains report a constant 1.0) the online
        per-position estimate is used. ``window``: draft tokens this step verifies (a host int, at most
        ``verify_window``; default ``verify_window``); chains and the proposal are cut to it.
        ``context_tokens``: a device scalar, the KV tokens this step reads (all requests); with a 2-D SPS table
        the selection prices verify tokens at that context.
        """
        bs = model_tokens.shape[0]
        win = self.note_window(window)
        w = min(win, self.width)
        with sync_guard(self._guard):
            if self.sps2d is not None and context_tokens is not None:
                self.sps2d.fill(context_tokens, self.sps_dense)
            draft = self.history.lookup(slots, self.ngram_cfg)
            q, ngram_surv = self.q[:bs], self.ngram_surv[:bs]
            self.calib_dev.apply(draft, model_tokens, q, ngram_surv)
            if self.online is not None:
                start = self._hist_start[:bs]
                torch.index_select(self.history.lens, 0, slots, out=start)  # where draft token 0 will land
                self.online.apply(slots, draft.tokens, draft.length, q, ngram_surv, start=start)
            if self.agreement is not None:  # the model's conditional confidences (or its online estimate)
                mcond = model_confidence if model_confidence is not None else self.model_cond.expand(bs, -1)
                self.agreement.apply(draft.tokens, draft.length, q, ngram_surv, model_tokens, mcond)
            ngram_tokens, ngram_len = draft.tokens, draft.length
            ten = self._batch_tenant(slots)  # read once for the corpus and the fairness weights
            if self.corpus is not None:
                cdraft = self.corpus.lookup(self.history, slots, ten)
                cq, csurv = self.corpus_cand.price(slots, cdraft)
                if self.agreement is not None:
                    self.agreement.apply(cdraft.tokens, cdraft.length, cq, csurv, model_tokens, mcond)
                ngram_tokens, ngram_len = self.corpus_cand.choose(draft.tokens, ngram_surv, draft.length, cdraft,
                                                                  csurv, limit=w)
            model_surv = self.model_surv[:bs]
            if self.cfg.enable_model and model_confidence is not None:
                torch.clamp(model_confidence, 0.0, 1.0, out=model_surv)
                model_surv.cumprod_(1)
            elif self.cfg.enable_model:
                torch.cumprod(self.model_cond, 0, out=self._cond_surv)
                model_surv.copy_(self._cond_surv.expand(bs, -1))
            else:
                model_surv.zero_()
            if self.splice is not None:  # the drafter's own survivals, before the agreement's shared price
                self._raw_surv[:bs].copy_(model_surv)
            if not self.cfg.enable_ngram:
                ngram_len = self._no_ngram[:bs]
            if self.fair is not None:  # DSpark's plan for these model chains alone: the fairness yardstick
                self.fair.plan(model_surv)
            if self.agreement is not None:  # the tokens both chains share: one price, learnt from the traffic
                self.agreement.share(ngram_tokens, ngram_len, ngram_surv, model_tokens, mcond, model_surv)
            self._ngram_len[:bs].copy_(ngram_len)
            mt = self.model_tokens[:bs]
            mt.copy_(model_tokens)
            if self.tail is not None:  # the model chain extended by the continuation after it (n-gram or corpus)
                mt, model_surv = self.tail.draft_and_extend(self.history, slots, self.calib_dev, mt, model_surv,
                                                            corpus=self.ctail,
                                                            tenant=ten if self.ctail is not None else None)
            if self.echo is not None:  # the model tokens the history echoes (the tail's lookup, the probes', the
                self.echo.start(bs, self.tail.draft_buffers(bs).length if self.tail is not None else None)  # splices')
                self.echo.probe(self.history, slots, mt[:, : self.gamma])
                if self.splice is None:
                    model_surv = self.echo.lift_model(model_surv)
                    self.echo.finish(mt, model_surv)
            if self.splice is not None:  # the model chain or a splice of it, at the last step's price
                mt, model_surv = self.splice.splice(self.history, slots, self.calib_dev, mt, model_surv,
                                                    self._raw_surv[:bs], self.price, echo=self.echo)
            out = self.sel.view(bs)
            if self.fair is not None:  # both chains of a request alike: only its share of the budget moves
                fw = self.fair.weights(slots, ten).view(-1, 1)  # scope "request" ignores the tenant ids
                model_surv = torch.mul(model_surv, fw, out=self._fair_model[:bs, : model_surv.shape[1]])
                ngram_surv = torch.mul(ngram_surv, fw, out=self._fair_ngram[:bs, : ngram_surv.shape[1]])
            select_chains(
                mt, model_surv, ngram_tokens, ngram_surv, ngram_len,
                self._budget(bs), self.sps_dense, out,
                num_iters=self.cfg.num_iters, max_verify_len=w, backend=self.kernel_backend,
            )
            self.price.copy_(out.price)
            return Proposal(tokens=out.tokens[:, :w], verify_len=out.verify_len, choice=out.choice,
                            survival=out.survival[:, :w])

    def note_window(self, window: Optional[int]) -> int:
        """The host-side bookkeeping of a step's verify window (``propose`` calls it; so does a graph replay of
        ``propose``, which runs no Python): returns the window, counts switches and narrowed steps."""
        win = self.verify_window if window is None else int(window)
        if win != self.active_window:
            self.window_switches += 1
            self.active_window = win
        if win < self.verify_window:
            self.narrow_steps += 1
        return win

    def conditional_confidence(self, proposal: Proposal) -> torch.Tensor:
        """The chosen chains as per-token conditional acceptance ``[bs, width]`` (DSpark's ``confidence``).

        ``c_j = S_j / S_{j-1}`` (``S_0 = 1``), 0 past a chain's length, so ``cumprod(c) == proposal.survival``
        up to rounding: what a DSpark-style planner takes to set budgets and verify lengths.
        """
        s = proposal.survival
        bs = s.shape[0]
        with sync_guard(self._guard):
            return _conditional(s, self.conf_prev[:bs], self.conf[:bs])

    def planner_confidence(self, proposal: Proposal, model_confidence: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Per-token conditional confidence of each request's chosen chain, for a DSpark-style planner.

        ``model_confidence [bs, G]``: the drafter's own confidences (G >= gamma columns; columns past gamma are
        not the model chain: they read as the n-gram tail's calibrated per-token acceptance, 0 past the tail or
        with the tail off). A request on the model chain keeps its first gamma unchanged, except the tokens the
        history echoes (``model_echo``, calibration/echo.py), which read as the selection priced them, lifted, and
        a spliced chain's tokens past its splice point; so with the n-gram drafter off (no echo, no splices) the
        planner sees exactly what it would without Hybrid Spark; a request on the n-gram chain
        gets its calibrated per-token acceptance ``q_j`` up to the chain's length, 0 past it. Writes ``out
        [bs, G]`` (a preallocated buffer) and returns it. The planner's budget and top-K allocation then run
        unchanged over the chosen chains. With ``fairness`` on, column 0 is multiplied by each request's weight
        from this step's ``propose`` (``selection/fairness.py``), so the planner shares its budget as the selection
        did.
        """
        bs, g = model_confidence.shape
        w = min(g, self.ngram_cfg.max_draft)
        with sync_guard(self._guard):
            ng = self._ng_conf[:bs, :g]
            ng.zero_()
            _conditional(self.ngram_surv[:bs, :w], self._ng_prev[:bs, :w], ng[:, :w])
            torch.lt(self._cols[:, :g], self._ngram_len[:bs].view(-1, 1), out=self._in_chain[:bs, :g])
            torch.where(self._in_chain[:bs, :g], ng, self._zero_f, out=ng)
            mc = self._model_conf[:bs, :g]
            mc.copy_(model_confidence)
            if g > self.gamma:
                mc[:, self.gamma:].zero_()
                if self.tail is not None:  # the tail's calibrated per-token acceptance (0 past its length)
                    t = min(g - self.gamma, self.tail.tail)
                    mc[:, self.gamma : self.gamma + t].copy_(self.tail.q[:bs, :t])
            if self.echo is not None:  # the echoed model tokens (calibration/echo.py), as the selection priced them
                ge = min(g, self.echo.width)
                torch.where(self.echo.echoed[:bs, :ge], self.echo.cond[:bs, :ge], mc[:, :ge], out=mc[:, :ge])
            if self.splice is not None:  # a spliced chain: its draft's per-token acceptance past the splice point
                gg = min(g, self.splice.width)
                torch.where(self.splice.after[:bs, :gg], self.splice.cond[:bs, :gg], mc[:, :gg], out=mc[:, :gg])
            is_ng = self._is_ng[:bs].view(-1, 1)
            torch.eq(proposal.choice.view(-1, 1), self._one_i32, out=is_ng)
            torch.where(is_ng, ng, mc, out=out)
            if self.fair is not None:  # the weights of this step's propose: the planner shares the budget so too
                out[:, 0].mul_(self.fair.w[:bs])
            return out

    def record(self, slots: torch.Tensor, proposal: Proposal, committed: torch.Tensor,
               accept_lens: torch.Tensor, verified_len: Optional[torch.Tensor] = None) -> None:
        """After verify: append ``committed[b, :accept_lens[b]]`` (accepted drafts + bonus) and update stats.

        ``verified_len [bs]``: the draft tokens the target really verified per request when a planner other than
        the selection set them (DSpark's ragged layout); default ``proposal.verify_len``."""
        with sync_guard(self._guard):
            if committed.dtype != torch.int32:  # host-known dtype; SGLang's verify already yields int32
                committed = committed.to(torch.int32)
            self.history.append(slots, committed, accept_lens)
            if self.online is not None and self.online.deferred is not None:
                self.online.update_from_history(slots, self.history.tokens, self.history.lens)
            elif self.online is not None:
                self.online.update(slots, committed, accept_lens)
            if self.agreement is not None:
                self.agreement.update(committed, accept_lens)
            if self.echo is not None:  # the echo's record (calibration/echo.py)
                self.echo.score(committed, accept_lens)
            vlen = proposal.verify_len if verified_len is None else verified_len
            choice, model_vlen = proposal.choice, vlen
            if self.splice is not None:  # a spliced chain: neither the tail's nor the n-gram's; the model's own k
                choice, model_vlen = self.splice.for_record(proposal.choice, vlen)
            if self.tail is not None:
                self.tail.update(slots, committed, accept_lens, choice, vlen, corpus=self.ctail)
            if self.corpus is not None:
                self.corpus.insert(self.history, slots, accept_lens, self._batch_tenant(slots))
                self.corpus_cand.update(slots, committed, accept_lens, choice)
            self.stats.update(slots, model_vlen, choice, accept_lens)
            if self.fair is not None:  # the chain each request verified, as the selection saw it
                self.fair.update(slots, proposal.survival, vlen)
        self.note_record()

    def note_record(self) -> None:
        """The host-side bookkeeping of ``record`` (the step count behind ``should_log``)."""
        self._steps_host += 1

    # ---- metrics (host side, never waits on the device) --------------------------------------------
    def metrics(self) -> dict:
        """Server-wide counters (at most one step stale) and the shape of the step."""
        m = self.stats.metrics()
        m["model_chain_tokens"] = self.gamma
        m["verify_window_tokens"] = self.verify_window + 1  # root included, as --speculative-num-draft-tokens
        m["ngram_chain_tokens"] = self.ngram_cfg.max_draft
        m["active_window_tokens"] = self.active_window + 1  # the last step's window, root included
        m["window_switches"] = self.window_switches
        m["narrow_window_steps"] = self.narrow_steps
        m["price_sps2d"] = int(self.sps2d is not None)
        m["fairness"] = self.cfg.fairness if self.fair is not None else 0.0  # the exponent in use (0 = the batch total)
        m["fairness_scope"] = self.fair.scope if self.fair is not None else ""  # what it evens out ("" = off)
        m["tenant_key"] = self.cfg.tenant_key if self.tracks_tenant else ""  # what names a tenant ("" = unused)
        m["tenants_seen"] = len(self._tenants_seen)  # distinct tenants prefilled (0 where unused)
        m.update(self.extra_metrics)
        m["model_tail_tokens"] = 0 if self.tail is None else self.tail.tail
        m["model_splice_points"] = 0 if self.splice is None else len(self.splice.points)
        m["echo_probe_points"] = 0 if self.echo is None else len(self.echo.points)
        m["model_echo_ratio"] = 0.0 if self.echo is None else self.echo.host_ratio()  # 0 = off, 1 = no evidence
        if self.tail is not None:
            m.update(self.tail.counts())
        if self.ctail is not None:
            m.update(self.ctail.counts())
        if self.corpus is not None:
            m.update(self.corpus_cand.counts())
            m["corpus_entries"] = self.corpus.cfg.entries
        return m

    def device_parts(self, **extra) -> dict:
        """The step's state by part, for ``memory.device_bytes`` (``extra``: the worker's own parts, counted before
        the rest of the step)."""
        return {"token history": self.history, "corpus": (self.corpus, self.corpus_cand, self.ctail),
                "online calibration": self.online, "fairness": self.fair, **extra, "the rest of the step": self}

    def request_metrics(self, slot: int) -> dict:
        """Host-side, at most one step stale: this slot's request's counters (for ``meta_info``)."""
        return self.stats.request_metrics(slot)

    def should_log(self) -> bool:
        n = self.cfg.metrics_interval
        return n > 0 and self._steps_host % n == 0
