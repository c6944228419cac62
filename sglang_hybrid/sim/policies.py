"""The three policies the simulator compares, each calling the real code a server would run.

* ``DSparkPolicy``: SGLang 0.5.23's own DSpark planner (re-implemented in ``dspark_planner.py``): the batch budget
  ``compute_verify_token_budget`` on survivals ``lag`` steps old (SGLang's default relay lag is 2 steps) and
  the per-request top-K ``schedule_verify_lens_topk`` on the fresh confidences (its CPU torch path).
* ``NgramPolicy``: like SGLang's NGRAM: the n-gram draft (our prompt-lookup drafter, ``TokenHistory.lookup``)
  verified whole, in a fixed window of ``width`` tokens per request (root included) whatever the draft's
  length, no budget. (SGLang's NGRAM drafts a BFS tree from a cross-request trie; a linear chain from the
  request's own history stands in for it.)
* ``HybridPolicy``: what the HYBRID_SPARK worker runs (``sglang_hybrid.step.HybridStep.propose``): the n-gram
  lookup, the calibration (``DeviceCalibration.apply``) and ``select_chains`` in SPS mode (budget from the
  fresh merged chains), with the model chain's survival from the drafter's confidences, extended by the n-gram
  tail after it (``calibration/tail.py``) where the chain width leaves room.

``step`` returns the chosen chain's tokens ``[bs, C]`` (int32), draft tokens to verify ``[bs]`` (a prefix of
the chain), the verify batch ``B`` in tokens (what the step costs) and which requests took the n-gram chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from ..calibration.agreement import ModelAgreement
from ..calibration.candidates import make_step_corpus
from ..calibration.deferred import DEFAULT_DEPTH
from ..calibration.online import DEFAULT_STRENGTH, OnlineCalibration
from ..calibration.echo import make_step_echo
from ..calibration.splice import make_step_splice
from ..calibration.tail import make_step_corpus_tail, make_step_tail
from ..ngram import NgramConfig, TokenHistory
from ..selection import SelectionBuffers, dense_sps, select_chains
from ..selection.fairness import FairWeights
from ..selection.sps2d import DenseSps2D, Sps2DTable
from ..selection.sps import SpsTable
from ..selection.two_branch import select_two_branch
from .dspark_planner import DSparkPlanner


@dataclass
class StepInput:
    """What a policy sees at one decode step (rows are the running requests, in slot order)."""

    slots: torch.Tensor  # [bs] int64 token-history slots
    requests: Sequence[int]  # request index of each row (a list or an int64 array)
    model_tokens: torch.Tensor  # [bs, gamma] int32 the model drafter's chain
    conf: torch.Tensor  # [bs, gamma] float32 its per-position conditional confidences
    context_tokens: Optional[torch.Tensor] = None  # 0-d float: the KV tokens the step reads (all requests)
    # [bs] int32 each request's tenant: the simulator gives each request kind its own (fairness_scope "tenant")
    tenant: Optional[torch.Tensor] = None
    # The reference continuation [bs, look] int64 (-1 past the end): only for a policy whose ``clairvoyant`` is
    # True (``oracle.py``, a yardstick); what a server runs never sees it.
    reference: Optional[np.ndarray] = None


@dataclass
class StepOutput:
    tokens: torch.Tensor  # [bs, C] int32 chosen chain
    verify_len: torch.Tensor  # [bs] draft tokens verified
    batch_tokens: int  # verify batch B (roots included)
    ngram_chosen: torch.Tensor  # [bs] bool
    # Calibration diagnostics (hybrid): the n-gram chain as drafted and its calibrated survivals.
    ngram_tokens: Optional[torch.Tensor] = None  # [bs, L]
    ngram_len: Optional[torch.Tensor] = None  # [bs]
    ngram_surv: Optional[torch.Tensor] = None  # [bs, L]
    # Two-branch verify: a second branch sharing the root (the request keeps the longer accepted branch).
    second_tokens: Optional[torch.Tensor] = None  # [bs, L2]
    second_len: Optional[torch.Tensor] = None  # [bs] draft tokens verified on it (0 = one branch)


class DSparkPolicy:
    """Model chain only; SGLang's DSpark budget (lagged survivals) and top-K verify lengths.

    The planner is ``dspark_planner.DSparkPlanner``, SGLang 0.5.23's CPU path re-implemented (tested equal), so
    the simulator never imports SGLang.
    """

    name = "dspark"
    uses_model = True

    def __init__(self, gamma: int, sps: SpsTable, lag: int = 2) -> None:
        if lag < 0:
            raise ValueError(f"dspark lag: must be >= 0, got {lag}")
        self.planner = DSparkPlanner(gamma, sps)
        self.gamma = gamma
        self.lag = lag
        # Per slot, a ring of the last `lag` steps' (request, confidences): the relay SGLang's planner reads.
        self._req = torch.full((0, max(lag, 1)), -1, dtype=torch.int64)
        self._conf = torch.zeros(0, max(lag, 1), gamma, dtype=torch.float32)
        self._count = torch.zeros(0, dtype=torch.int64)

    def _grow(self, n: int) -> None:
        k = n - self._req.shape[0]
        if k > 0:
            self._req = torch.cat([self._req, torch.full((k, self._req.shape[1]), -1, dtype=torch.int64)])
            self._conf = torch.cat([self._conf, torch.zeros(k, *self._conf.shape[1:], dtype=torch.float32)])
            self._count = torch.cat([self._count, torch.zeros(k, dtype=torch.int64)])

    def _lagged(self, inp: StepInput) -> torch.Tensor:
        if self.lag == 0:
            return inp.conf
        s = inp.slots
        self._grow(int(s.max()) + 1)
        req = torch.as_tensor(inp.requests, dtype=torch.int64)
        idx = self._count[s] % self.lag  # the oldest of the last `lag` entries (the next one overwritten)
        same = (self._req[s, idx] == req).view(-1, 1)  # this request has been here `lag` steps already
        # SGLang: a request younger than the lag counts as all-surviving.
        rows = torch.where(same, self._conf[s, idx], torch.ones_like(inp.conf))
        self._req[s, idx] = req
        self._conf[s, idx] = inp.conf.to(torch.float32)
        self._count[s] += 1
        return rows

    def step(self, inp: StepInput, history: TokenHistory) -> StepOutput:
        survival = torch.cumprod(self._lagged(inp).to(torch.float32), dim=1)
        budget = self.planner.budget(survival)
        lens = self.planner.verify_lens(inp.conf, budget).to(torch.int64) - 1
        bs = inp.conf.shape[0]
        return StepOutput(inp.model_tokens, lens, bs + int(lens.sum()), torch.zeros(bs, dtype=torch.bool))


class NgramPolicy:
    """N-gram chain only, verified whole in a fixed ``width``-token window per request (SGLang NGRAM-like)."""

    name = "ngram"
    uses_model = False

    def __init__(self, width: int = 12, n_min: int = 2, n_max: int = 8, window: int = 0) -> None:
        if width < 2:
            raise ValueError(f"ngram verify width: must be >= 2 (root + 1 draft), got {width}")
        self.width = width
        self.cfg = NgramConfig(n_min=n_min, n_max=n_max, max_draft=width - 1, window=window)
        self.cfg.validate()

    def step(self, inp: StepInput, history: TokenHistory) -> StepOutput:
        d = history.lookup(inp.slots, self.cfg)
        bs = inp.slots.shape[0]
        return StepOutput(d.tokens, d.length.to(torch.int64), bs * self.width, d.length > 0)


class HybridPolicy:
    """Hybrid Spark: n-gram lookup + calibration + ``select_chains``, as the worker runs them.

    ``fixed_window``: None models a ragged verify (DSpark-style: SPS-mode budget, a step verifies only the chosen
    lengths). An int ``W`` models the EAGLE-family worker: every request runs a ``W + 1``-token verify window
    whichever chain it takes (``B = bs * (W + 1)``), the budget never binds (``K = bs * W``), and the price only
    picks each request's chain.
    """

    name = "hybrid"
    uses_model = True

    def __init__(self, gamma: int, max_bs: int, sps: SpsTable, calibration, *, n_min: int = 2, n_max: int = 8,
                 max_draft: int = 7, window: int = 0, num_iters: int = 2, enable_ngram: bool = True,
                 max_verify_len: Optional[int] = None, fixed_window: Optional[int] = None,
                 online_calibration: bool = True, online_strength: float = DEFAULT_STRENGTH,
                 online_defer: int = DEFAULT_DEPTH, online_bins: int = 0, sps2d: Optional[Sps2DTable] = None,
                 two_branch: bool = False, corpus: str = "off", corpus_entries: int = 1 << 21,
                 corpus_calibration="default", model_tail: int = 0, model_agreement: bool = True,
                 corpus_tail: bool = True, fairness: float = 0.0, fairness_scope: str = "request",
                 model_splices: int = 0, splice_margin: float = 0.2, model_echo: bool = True,
                 echo_probes: int = 0) -> None:
        self.cfg = NgramConfig(n_min=n_min, n_max=n_max, max_draft=max_draft, window=window)
        self.cfg.validate()
        calibration.check_covers(self.cfg)
        self.calib = calibration.to_device("cpu")
        self.gamma = gamma
        self.enable_ngram = enable_ngram
        self.num_iters = num_iters
        width = max(gamma, max_draft)
        self.max_verify_len = gamma if max_verify_len is None else max_verify_len
        self.sel = SelectionBuffers(max_bs, width, "cpu")
        self.sps = dense_sps(sps, max_bs * (1 + gamma + max_draft), "cpu")
        # A 2-D table: the price row is rewritten every step for the step's context (selection/sps2d.py).
        self.sps2d = DenseSps2D(sps2d, self.sps.shape[0] - 1, "cpu") if sps2d is not None else None
        if two_branch and fixed_window is not None:
            raise ValueError("two_branch: needs the ragged verify (a fixed window has no room for a second branch)")
        self.two_branch = two_branch
        if fixed_window is not None and fixed_window < width:
            raise ValueError(f"fixed_window ({fixed_window}) must be >= max(gamma, max_draft) = {width}")
        self.fixed_window = fixed_window
        self._budget = torch.zeros(1, dtype=torch.int32)
        self.q = torch.zeros(max_bs, max_draft, dtype=torch.float32)
        self.surv = torch.zeros(max_bs, max_draft, dtype=torch.float32)
        # Per-request recalibration (the simulator's slots are 0..max_bs-1), as HybridStep runs it.
        self.online = OnlineCalibration(max_bs, max_bs, max_draft, "cpu", online_strength, defer=online_defer,
                                        bins=online_bins) \
            if online_calibration else None
        # The cross-request corpus, as HybridStep builds it (shared: the simulator has one tenant).
        self.corpus, self.corpus_cand = make_step_corpus(
            corpus, corpus_entries, num_slots=max_bs, max_bs=max_bs, width=max_draft, device="cpu",
            backend="torch", online=online_calibration, strength=online_strength, table=corpus_calibration)
        # The n-gram tail after the model chain (calibration/tail.py), as HybridStep builds it.
        self.tail = make_step_tail(model_tail if enable_ngram else 0, width=width, gamma=gamma, n_min=n_min,
                                   n_max=n_max, window=window, num_slots=max_bs, max_bs=max_bs, device="cpu",
                                   online=online_calibration, strength=online_strength)
        # The corpus's tail beside the n-gram one (calibration/tail.py: CorpusTail), as HybridStep builds it.
        self.ctail = make_step_corpus_tail(corpus_tail, self.corpus, self.corpus_cand, self.tail, num_slots=max_bs,
                                           max_bs=max_bs, gamma=gamma, device="cpu", online=online_calibration,
                                           strength=online_strength)
        # Splices of the model chain (calibration/splice.py), as HybridStep builds them.
        self.splice = make_step_splice(model_splices if enable_ngram else 0, splice_margin,
                                       width=gamma + (self.tail.tail if self.tail is not None else 0), gamma=gamma,
                                       lookup_cfg=self.cfg, max_bs=max_bs, device="cpu")
        # The history's echo of the model chain (calibration/echo.py), as HybridStep builds it.
        self.echo = make_step_echo(model_echo and enable_ngram, tail=self.tail is not None,
                                   splice_points=self.splice.points if self.splice is not None else (),
                                   probes=echo_probes, lookup_cfg=self.cfg, max_bs=max_bs, gamma=gamma,
                                   width=gamma + (self.tail.tail if self.tail is not None else 0), device="cpu",
                                   strength=online_strength)
        # Both model-free candidates re-priced beside the model chain (calibration/agreement.py), as HybridStep.
        self.agreement = ModelAgreement(max_bs, max_draft, gamma, "cpu", strength=online_strength) \
            if model_agreement and enable_ngram else None
        # Fairness weights between requests (selection/fairness.py), as HybridStep builds them.
        # A fixed window never binds a budget, so there is nothing for the weights to move.
        self.fair = FairWeights(max_bs, max_bs, gamma, width, fairness, self.sps, "cpu", scope=fairness_scope) \
            if fairness > 0 and fixed_window is None else None
        self._history: Optional[TokenHistory] = None

    def on_prefill(self, slots: torch.Tensor) -> None:
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

    def record(self, inp: StepInput, out: StepOutput, committed: torch.Tensor, counts: torch.Tensor) -> None:
        """After verify: ``committed[b, :counts[b]]`` are the tokens the target produced (as HybridStep.record)."""
        if self.online is not None and self.online.deferred is not None:
            self.online.update_from_history(inp.slots, self._history.tokens, self._history.lens)
        elif self.online is not None:
            self.online.update(inp.slots, committed, counts)
        if self.agreement is not None:
            self.agreement.update(committed, counts)
        if self.echo is not None:  # the echo's record (calibration/echo.py)
            self.echo.score(committed, counts)
        if self.tail is not None:
            choice = out.ngram_chosen.to(torch.int32)
            if self.splice is not None:  # a spliced chain is neither the model chain's tail nor the n-gram chain
                choice = self.splice.for_record(choice, out.verify_len)[0]
            self.tail.update(inp.slots, committed, counts, choice, out.verify_len, corpus=self.ctail)
        if self.corpus is not None:  # every request's committed tokens, after the history append (as HybridStep)
            self.corpus.insert(self._history, inp.slots, counts)
            self.corpus_cand.update(inp.slots, committed, counts)
        if self.fair is not None:  # the chain each request verified, as the selection saw it
            self.fair.update(inp.slots, self.sel.view(inp.slots.shape[0]).survival, out.verify_len)

    def counts(self) -> dict:
        """The worker's chain counters (``HybridStep.metrics``): request-steps that verified into the n-gram tail
        and the corpus's tail, and the tail tokens they accepted."""
        m = {} if self.tail is None else self.tail.counts()
        if self.ctail is not None:
            m.update(self.ctail.counts())
        return m

    def _reprice(self, inp: StepInput, draft, q: torch.Tensor, surv: torch.Tensor, source: int) -> None:
        """The last word on a model-free candidate's ``(q, surv)`` before the choice: beside the model chain
        (calibration/agreement.py). ``draft``: its lookup (``tokens``, ``length``, ``match_len``,
        ``match_count``); ``source``: 0 = the request's own history, 1 = the corpus. ``oracle.EstimateOracle``
        and ``steplog.StepLogPolicy`` override it."""
        if self.agreement is not None:
            self.agreement.apply(draft.tokens, draft.length, q, surv, inp.model_tokens, inp.conf)

    def step(self, inp: StepInput, history: TokenHistory) -> StepOutput:
        bs = inp.slots.shape[0]
        d = history.lookup(inp.slots, self.cfg)
        q, surv = self.q[:bs], self.surv[:bs]
        self.calib.apply(d, inp.model_tokens, q, surv)
        self._history = history
        if self.sps2d is not None and inp.context_tokens is not None:
            self.sps2d.fill(inp.context_tokens, self.sps)
        if self.online is not None:
            self.online.apply(inp.slots, d.tokens, d.length, q, surv, start=history.lens[inp.slots])
        self._reprice(inp, d, q, surv, 0)
        ntok, nlen = d.tokens, d.length
        if self.corpus is not None:  # the better of the own-history and corpus candidates (HybridStep.propose)
            cd = self.corpus.lookup(history, inp.slots)
            cq, csurv = self.corpus_cand.price(inp.slots, cd)
            self._reprice(inp, cd, cq, csurv, 1)
            ntok, nlen = self.corpus_cand.choose(d.tokens, surv, d.length, cd, csurv)
        nlen = nlen if self.enable_ngram else torch.zeros_like(d.length)
        model_surv = torch.cumprod(inp.conf, dim=1)
        raw_surv = model_surv.clone() if self.splice is not None else None  # before the agreement's shared price
        if self.fair is not None:  # DSpark's plan for these model chains alone: the fairness yardstick
            self.fair.plan(model_surv)
        mtok = inp.model_tokens
        if self.agreement is not None:  # the tokens both chains share: one price, learnt from the traffic
            self.agreement.share(ntok, nlen, surv, mtok, inp.conf, model_surv)
        if self.tail is not None:  # the model chain extended by the continuation after it (n-gram or corpus)
            mtok, model_surv = self.tail.draft_and_extend(history, inp.slots, self.calib, mtok, model_surv,
                                                          corpus=self.ctail)
        out = self.sel.view(bs)
        if self.echo is not None:  # the model tokens the history echoes (the tail's lookup, the probes', the splices')
            self.echo.start(bs, self.tail.draft_buffers(bs).length if self.tail is not None else None)
            self.echo.probe(history, inp.slots, inp.model_tokens)
            if self.splice is None:
                model_surv = self.echo.lift_model(model_surv)
                self.echo.finish(mtok, model_surv)
        if self.splice is not None:  # the model chain or a splice of it, at the last step's price (out.price)
            mtok, model_surv = self.splice.splice(history, inp.slots, self.calib, mtok, model_surv, raw_surv, out.price,
                                                  echo=self.echo)
        if self.fair is not None:  # as HybridStep.propose: both chains of a request weighted alike
            fw = self.fair.weights(inp.slots, inp.tenant).view(-1, 1)
            sel_m, sel_n = model_surv * fw, surv * fw  # the selection's inputs; the figures keep the estimates
        else:
            sel_m, sel_n = model_surv, surv
        if self.fixed_window is None:
            select_chains(mtok, sel_m, ntok, sel_n, nlen, None, self.sps, out,
                          num_iters=self.num_iters, max_verify_len=self.max_verify_len)
        else:
            self._budget.fill_(bs * self.fixed_window)
            select_chains(mtok, sel_m, ntok, sel_n, nlen, self._budget, None, out,
                          num_iters=self.num_iters, max_verify_len=self.max_verify_len)
        if self.two_branch:
            tb = select_two_branch(mtok, sel_m, ntok, sel_n, nlen, out.choice, out.verify_len,
                                   self.sps, max_verify_len=self.max_verify_len)
            batch = bs + int((tb.model_len + tb.ngram_len).sum())
            return StepOutput(mtok, tb.model_len, batch, tb.ngram_len > 0, ntok, nlen, surv,
                              second_tokens=ntok, second_len=tb.ngram_len)
        vl = out.verify_len.to(torch.int64)
        batch = bs + int(vl.sum()) if self.fixed_window is None else bs * (1 + self.fixed_window)
        return StepOutput(out.tokens, vl, batch, out.choice == 1, ntok, nlen, surv)
