"""The n-gram tail: an n-gram continuation drafted *after* the model chain, which extends it into one linear chain.

A model chain of ``gamma`` tokens that the target accepts whole ends the step with one bonus token. If the
request's history continues past the model chain's last tokens (a quote, a repeated phrase, an edited file),
an n-gram lookup on ``history ++ model chain`` (``TokenHistory.lookup_after``) drafts what follows. Appended to
the model chain it makes one linear chain, so a ragged verify (DSpark's) or a wide fixed window checks it with no
tree mask and no change to SGLang. Token ``j`` of the tail is accepted only if the whole model chain is, so its
survival is ``S_model(gamma) * S_tail(j)``: the price selection then keeps only the tail tokens whose survival
pays for their verify slot, as for any other chain.

Pricing: the tail's per-token estimate ``q`` comes from the calibration table (the same features as any n-gram
draft; the ``agree`` feature, when a table has it, reads "disagree": no model token stands beside the tail), then
a per-request online record of its own (``OnlineCalibration``, scored immediately). A tail is scored only at
steps where the target committed the whole model chain, the only steps where its context was the real one: it
then faces the tokens committed after position ``gamma``.

With the cross-request corpus on, ``CorpusTail`` drafts a second tail: the corpus's walk from the same
``history ++ model chain`` (both lookups run inside one ``TokenHistory.run_after``), priced as the corpus
candidate and scored as the n-gram tail. ``extend`` keeps, per request, the tail with the larger expected
accepted length.

Decode-step rules: ``extend`` and ``update`` write only into buffers made at construction for the largest batch,
never read the device and never branch on device data.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from ..backend import resolve_backend
from ..ngram.config import NgramConfig, NgramDraft
from ..ngram.corpus import CorpusDraft
from .candidates import Q_ONE, price_corpus_draft
from .choose import choose_rows_fn
from .counters import ChainCounters
from .online import DEFAULT_STRENGTH, OnlineCalibration

__all__ = ["CorpusTail", "ModelTail", "make_step_corpus_tail", "make_step_tail"]


class ModelTail:
    """Buffers and online record for tails after a model chain of ``gamma`` tokens.

    ``lookup_cfg``: the tail lookup's n-gram configuration; its ``max_draft`` is the longest tail (``self.tail``).
    ``online``: recalibrate the tail's table estimates from its outcomes (False: the table as is).
    """

    def __init__(self, num_slots: int, max_bs: int, gamma: int, lookup_cfg: NgramConfig, device: torch.device | str,
                 *, online: bool = True, strength: float = DEFAULT_STRENGTH, backend: str = "auto") -> None:
        tail = lookup_cfg.max_draft
        if gamma < 1 or tail < 1:
            raise ValueError(f"ModelTail: gamma and tail must be >= 1, got gamma={gamma}, tail={tail}")
        dev = torch.device(device)
        self.gamma, self.tail, self.lookup_cfg = gamma, tail, lookup_cfg
        i32 = dict(dtype=torch.int32, device=dev)
        # The tail lookup's own output buffers (the history's default buffers hold the step's main lookup).
        self._draft = NgramDraft.zeros(max_bs, tail, dev)
        self.q = torch.zeros(max_bs, tail, dtype=torch.float32, device=dev)
        self.surv = torch.zeros(max_bs, tail, dtype=torch.float32, device=dev)
        self.tokens = torch.zeros(max_bs, gamma + tail, **i32)  # the extended chain
        self.survival = torch.zeros(max_bs, gamma + tail, dtype=torch.float32, device=dev)
        self._no_model = torch.full((max_bs, 1), -1, **i32)  # "disagree" for a table's agree feature
        self._eq = torch.zeros(max_bs, gamma, dtype=torch.bool, device=dev)
        self._whole = torch.zeros(max_bs, dtype=torch.bool, device=dev)
        self._n = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self._zero = torch.zeros((), dtype=torch.int32, device=dev)
        self._gamma = torch.full((), gamma, dtype=torch.int32, device=dev)
        self.online = OnlineCalibration(num_slots, max_bs, tail, dev, strength, backend=backend) if online else None
        # Request-steps that verified the model chain into its tail, and the tail tokens accepted (``counts()``).
        self.counters = ChainCounters(max_bs, dev, ("tail_chosen", "accepted_tail"), offset=gamma + 1,
                                      backend=backend)
        self._is_model = torch.zeros(max_bs, dtype=torch.bool, device=dev)
        self._e_ng = torch.zeros(max_bs, dtype=torch.float32, device=dev)  # the two tails' expected lengths
        self._e_cp = torch.zeros(max_bs, dtype=torch.float32, device=dev)
        self._pick = torch.zeros(max_bs, dtype=torch.bool, device=dev)  # True: the corpus's tail
        kb = resolve_backend(backend, dev)
        self._choose = choose_rows_fn(kb)  # choose.py (a Triton launch on CUDA)
        self._flags = self._flags_torch
        if kb == "triton":  # update's flags in one launch (tail_kernel.py)
            from functools import partial

            from .tail_kernel import tail_flags_triton

            self._flags = partial(tail_flags_triton, self)
        self._view_cache: dict[int, SimpleNamespace] = {}

    def _views(self, bs: int) -> SimpleNamespace:
        """The ``[:bs]`` slices ``extend`` / ``update`` use, made once per batch size: each slice is a Python-level
        op that an eagerly launched step pays on every call."""
        v = self._view_cache.get(bs)
        if v is None:
            g, d = self.gamma, self._draft
            v = SimpleNamespace(q=self.q[:bs], surv=self.surv[:bs], tok=self.tokens[:bs], sv=self.survival[:bs],
                                no_model=self._no_model[:bs], eq=self._eq[:bs], whole=self._whole[:bs],
                                n=self._n[:bs], is_model=self._is_model[:bs], e_ng=self._e_ng[:bs],
                                e_cp=self._e_cp[:bs], pick=self._pick[:bs])
            v.tok_model, v.tok_tail = v.tok[:, :g], v.tok[:, g:]
            v.sv_model, v.sv_tail = v.sv[:, :g], v.sv[:, g:]
            v.draft = d.rows(bs)
            self._view_cache[bs] = v
        return v

    def draft_buffers(self, bs: int) -> NgramDraft:
        """Output buffers for ``TokenHistory.lookup_after`` (rows ``[:bs]``)."""
        return self._views(bs).draft

    def reset(self, slots: torch.Tensor) -> None:
        """At prefill: a new request's record starts empty."""
        if self.online is not None:
            self.online.reset(slots)

    def extend(self, slots: torch.Tensor, draft: NgramDraft, calibration, model_tokens: torch.Tensor,
               model_surv: torch.Tensor, corpus: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model chain extended by its tail: ``(tokens, survival) [bs, gamma + tail]`` (views of buffers).

        ``draft``: the tail lookup (``lookup_after(slots, self.lookup_cfg, model_tokens,
        out=self.draft_buffers(bs))``);
        ``calibration``: a ``DeviceCalibration``; ``model_survival [bs, gamma]``: the model chain's prefix
        survivals. The tail's survivals are 0 past its length, so the selection never admits those columns.
        ``corpus``: the corpus's tail ``(tokens, q, survival) [bs, tail]`` (``CorpusTail.price``); per request the
        tail with the larger expected accepted length is kept (ties: the n-gram's), and ``self.q`` holds its
        per-token estimates."""
        bs, g = model_tokens.shape
        if g != self.gamma:
            raise ValueError(f"ModelTail: model_tokens has {g} columns, gamma is {self.gamma}")
        v = self._views(bs)
        q, surv = v.q, v.surv
        calibration.apply(draft, v.no_model, q, surv)
        if self.online is not None:
            self.online.apply(slots, draft.tokens, draft.length, q, surv)
        v.tok_model.copy_(model_tokens)
        v.tok_tail.copy_(draft.tokens)
        if corpus is not None:  # the better of the two tails, by expected accepted length (ties: the n-gram's)
            ctok, cq, csurv = corpus
            self._choose(surv, csurv, surv.shape[1], v.e_ng, v.e_cp, v.pick, v.tok_tail, ctok, v.tok_tail,
                         q_a=q, q_b=cq, q_out=q)
        v.sv_model.copy_(model_surv)
        torch.mul(surv, model_surv[:, g - 1 :], out=v.sv_tail)
        return v.tok, v.sv

    def draft_and_extend(self, history, slots: torch.Tensor, calibration, model_tokens: torch.Tensor,
                         model_surv: torch.Tensor, corpus: Optional["CorpusTail"] = None,
                         tenant: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Look the tail up after the model chain and ``extend`` with it: the n-gram tail's lookup
        (``history.lookup_after``) or, with ``corpus`` (a ``CorpusTail``; ``tenant`` its lookup's), both tails'
        lookups on one append of the chain (``history.run_after``) and the better tail per request. What
        ``HybridStep.propose`` and the simulator's ``HybridPolicy`` run."""
        out = self.draft_buffers(model_tokens.shape[0])
        if corpus is None:
            draft = history.lookup_after(slots, self.lookup_cfg, model_tokens, out=out)
            return self.extend(slots, draft, calibration, model_tokens, model_surv)
        draft, cdraft = history.run_after(slots, model_tokens, lambda: (
            history.lookup(slots, self.lookup_cfg, out), corpus.lookup(history, slots, tenant)))
        return self.extend(slots, draft, calibration, model_tokens, model_surv, corpus=corpus.price(slots, cdraft))

    def update(self, slots: torch.Tensor, committed: torch.Tensor, counts: torch.Tensor,
               choice: Optional[torch.Tensor] = None, verified: Optional[torch.Tensor] = None,
               corpus: Optional["CorpusTail"] = None) -> None:
        """After verify: score this step's tails where the target committed the whole model chain; with
        ``choice [bs]`` (1 = the n-gram chain) and ``verified [bs]`` (draft tokens verified) count the steps that
        verified into a tail and the tail tokens they accepted. ``corpus``: the step's ``CorpusTail`` (its
        draft is scored too, and its own counters count the steps whose tail was the corpus's).

        ``committed [bs, K]``: accepted drafts then the bonus token, ``counts [bs]`` of them."""
        bs, k = committed.shape
        g = self.gamma
        online = self.online is not None and k > g  # else no committed column past the model chain (host-known)
        count = choice is not None and verified is not None
        cused = corpus.counters.rows(bs)[0] if count and corpus is not None else None
        if online or count:
            self._flags(committed, counts, choice if count else None, verified if count else None, online, cused)
        if online:
            n = self._views(bs).n
            self.online.update(slots, committed[:, g:], n)
            if corpus is not None:
                corpus.update(slots, committed[:, g:], n)
        if count:
            self.counters.add(counts)
            if corpus is not None:  # of those, the steps whose tail was the corpus's (``cused``)
                corpus.counters.add(counts)

    def _flags_torch(self, committed: torch.Tensor, counts: torch.Tensor, choice: Optional[torch.Tensor],
                     verified: Optional[torch.Tensor], online: bool, cused: Optional[torch.Tensor]) -> None:
        """``update``'s flags (the reference of ``tail_kernel.tail_flags_triton`` and the CPU's path). With
        ``online``: ``eq`` / ``whole``, the requests that committed the whole model chain, and ``n``, the tail
        tokens they committed (0 elsewhere). With ``choice`` (and ``verified``): ``used`` (this object's counters'
        mask), the requests that verified the model chain into its tail, and ``cused`` (the corpus tail's mask,
        when given), those of them whose tail was the corpus's."""
        bs = committed.shape[0]
        v = self._views(bs)
        if online:
            eq, whole, n = v.eq, v.whole, v.n
            torch.eq(committed[:, : self.gamma], v.tok_model, out=eq)
            torch.all(eq, 1, out=whole)
            n.copy_(counts)
            n.sub_(self._gamma)
            torch.where(whole, n, self._zero, out=n)
            n.clamp_(min=0)
        if choice is not None:
            used, is_model = self.counters.rows(bs)[0], v.is_model
            torch.gt(verified, self._gamma, out=used)
            torch.eq(choice, self._zero, out=is_model)
            used.logical_and_(is_model)
            if cused is not None:
                torch.logical_and(used, v.pick, out=cused)

    def counts(self) -> dict:
        """Host side, never waits: ``tail_chosen`` (request-steps that verified the model chain into its tail)
        and ``accepted_tail`` (tail tokens accepted on them)."""
        return self.counters.counts()


def make_step_tail(model_tail: int, *, width: int, gamma: int, n_min: int, n_max: int, window: int, num_slots: int,
                   max_bs: int, device, online: bool = True, strength: float = DEFAULT_STRENGTH,
                   backend: str = "auto") -> Optional[ModelTail]:
    """The ``ModelTail`` of a step whose chains are ``width`` columns (``None`` where no column is left past the
    model chain, or with ``model_tail`` 0): tails of at most ``min(model_tail, width - gamma)`` tokens, looked up
    with the step's n-gram settings. Shared by ``HybridStep`` and the simulator's ``HybridPolicy``."""
    tail = min(model_tail, width - gamma)
    if tail <= 0:
        return None
    cfg = NgramConfig(n_min=n_min, n_max=n_max, max_draft=tail, window=window)
    return ModelTail(num_slots, max_bs, gamma, cfg, device, online=online, strength=strength, backend=backend)


class CorpusTail:
    """The cross-request corpus's continuation after the model chain: a second tail candidate.

    Looked up on ``history ++ model chain`` (inside ``TokenHistory.run_after``, beside the n-gram tail's lookup)
    and priced as the corpus candidate is (``candidates.py``): the corpus's own ``q``, the fitted table, then an
    online record of its own, scored as the n-gram tail's (only where the target committed the whole model
    chain). ``ModelTail.extend(..., corpus=self.price(...))`` keeps, per request, the tail with the larger
    expected accepted length. ``table``: the host ``CorpusTable`` (a device copy sized for the tail is made
    here) or None. Buffers are made here for the largest batch; no host read.
    """

    def __init__(self, corpus, num_slots: int, max_bs: int, gamma: int, tail: int, device: torch.device | str, *,
                 table=None, online: bool = True, strength: float = DEFAULT_STRENGTH, backend: str = "auto") -> None:
        if tail < 1 or tail > corpus.max_draft:
            raise ValueError(f"CorpusTail: tail must be in [1, {corpus.max_draft}] (the corpus's max_draft), "
                             f"got {tail}")
        dev = torch.device(device)
        self.corpus, self.tail = corpus, tail
        self.table = table.to_device(max_bs, tail, dev, backend=backend) if table is not None else None
        self._draft = CorpusDraft.zeros(max_bs, tail, dev)
        self.q = torch.zeros(max_bs, tail, dtype=torch.float32, device=dev)
        self.surv = torch.zeros(max_bs, tail, dtype=torch.float32, device=dev)
        self._scale = torch.tensor(1.0 / Q_ONE, dtype=torch.float32, device=dev)
        self.online = OnlineCalibration(num_slots, max_bs, tail, dev, strength, backend=backend) if online else None
        # Request-steps that verified into a corpus tail, and the tail tokens accepted (``ModelTail.update``).
        self.counters = ChainCounters(max_bs, dev, ("corpus_tail_chosen", "accepted_corpus_tail"), offset=gamma + 1,
                                      backend=backend)
        self._view_cache: dict[int, object] = {}

    def _out(self, bs: int):
        d = self._view_cache.get(bs)
        if d is None:
            d = self._view_cache[bs] = self._draft.rows(bs)
        return d

    def reset(self, slots: torch.Tensor) -> None:
        """At prefill: a new request's record starts empty."""
        if self.online is not None:
            self.online.reset(slots)

    def lookup(self, history, slots: torch.Tensor, tenant: Optional[torch.Tensor] = None):
        """The corpus's walk from the end of ``history`` (call it inside ``history.run_after(slots, model
        chain, ...)``); into this object's buffers."""
        return self.corpus.lookup(history, slots, tenant, out=self._out(slots.shape[0]))

    def price(self, slots: torch.Tensor, draft) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(tokens, q, survival) [bs, tail]`` of the tail, priced (survival from the model chain's end; 0 past
        the draft's length), for ``ModelTail.extend(..., corpus=...)``."""
        bs = draft.tokens.shape[0]
        q, surv = self.q[:bs], self.surv[:bs]
        price_corpus_draft(slots, draft, q, surv, self._scale, self.table, self.online)
        return draft.tokens, q, surv

    def counts(self) -> dict:
        """Host side, never waits: ``corpus_tail_chosen`` and ``accepted_corpus_tail``."""
        return self.counters.counts()

    def update(self, slots: torch.Tensor, committed_tail: torch.Tensor, n: torch.Tensor) -> None:
        """Score this step's draft against ``committed_tail[b, :n[b]]`` (the tokens after the model chain where
        the target committed all of it, else ``n`` 0): ``ModelTail.update`` calls it."""
        if self.online is not None:
            self.online.update(slots, committed_tail, n)


def make_step_corpus_tail(enabled: bool, corpus, corpus_cand, tail: Optional[ModelTail], *, num_slots: int,
                          max_bs: int, gamma: int, device, online: bool = True,
                          strength: float = DEFAULT_STRENGTH, backend: str = "auto") -> Optional[CorpusTail]:
    """The ``CorpusTail`` of a step (option ``corpus_tail``), or ``None`` where it is off or has nothing to extend:
    no corpus (``make_step_corpus``'s pair is ``None``) or no n-gram tail (``make_step_tail`` gave ``None``). Its
    tail is as long as the n-gram one, priced with the corpus candidate's fitted table. Shared by ``HybridStep``
    and the simulator's ``HybridPolicy``."""
    if not enabled or tail is None or corpus is None:
        return None
    return CorpusTail(corpus, num_slots, max_bs, gamma, tail.tail, device, table=corpus_cand.table_src,
                      online=online, strength=strength, backend=backend)
