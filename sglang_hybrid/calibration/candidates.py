"""Choosing between the two model-free candidates of a decode step: the request's own n-gram and the corpus.

``HybridStep.propose`` (and the simulator's ``HybridPolicy``, which mirrors it) drafts two model-free chains per
request: the per-request n-gram (``TokenHistory.lookup``, priced by the shipped table and the per-request online
recalibration) and the cross-request corpus (``NgramCorpus.lookup``). ``CorpusCandidate`` prices the corpus's
draft and keeps, per request, the candidate with the larger calibrated expected accepted length (the sum of its
prefix survivals); the winner goes to the selection as *the* n-gram chain, priced against the model chain
unchanged.

Pricing the corpus draft, in three stages: the corpus's own per-token estimate ``q = best / (total + alpha)``
(frequency with a pseudo-count); corrected by a fitted table of odds ratios by match length, count and
position (``corpus_table.py``, option ``corpus_calibration``: the shipped table is fitted on other text by
``hybrid-spark calibrate --candidate corpus``; ``"none"`` skips this stage); then recalibrated online by a
second ``OnlineCalibration`` record of its own (the same odds-ratio correction, with the same tests, as the
per-request n-gram's; here it learns how the fitted estimates fare against the target, per request and over
the traffic). With no online evidence the table's estimate is used as is.

Decode-step rules: ``price``, ``choose`` and ``update`` write only into buffers made at construction for the
largest batch, never read the device and never branch on device data.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..backend import resolve_backend
from .choose import choose_rows_fn
from .counters import ChainCounters
from .online import DEFAULT_STRENGTH, OnlineCalibration

__all__ = ["CorpusCandidate", "Q_ONE", "price_corpus_draft"]

Q_ONE = 1 << 16  # the corpus's fixed point for q


def price_corpus_draft(slots: torch.Tensor, draft, q: torch.Tensor, surv: torch.Tensor, scale: torch.Tensor,
                       table, online: Optional[OnlineCalibration]) -> None:
    """A corpus draft's calibrated ``q`` and ``surv [bs, D]`` (float32 buffers, written in place): the corpus's
    own fixed-point ``q`` times ``scale`` (a device scalar, ``1 / Q_ONE``), the fitted ``table``
    (``DeviceCorpusTable`` or None), the running product, then the ``online`` record (or None). Shared by the
    corpus candidate and the corpus's tail (``tail.py: CorpusTail``)."""
    if table is not None:  # scale and table in one (a Triton launch on CUDA)
        table.price(draft.q, scale, draft.match_len, draft.match_count, q)
    else:
        q.copy_(draft.q)  # int32 -> float32 in place (a mixed-dtype mul would allocate a float copy)
        q.mul_(scale)
    torch.cumprod(q, 1, out=surv)
    if online is not None:
        online.apply(slots, draft.tokens, draft.length, q, surv)


class CorpusCandidate:
    """Buffers and online record for the corpus candidate of ``max_bs`` requests with chains of ``width`` tokens.

    ``online``: recalibrate the corpus's q from verify outcomes (False: its q as is). ``table``: a fitted
    ``CorpusTable`` applied before the online stage (None: the corpus's own q).
    """

    def __init__(self, num_slots: int, max_bs: int, width: int, device: torch.device | str, *,
                 online: bool = True, strength: float = DEFAULT_STRENGTH, table=None, backend: str = "auto") -> None:
        dev = torch.device(device)
        self.width = width
        self.table_src = table  # the host table (the corpus tail makes its own device copy)
        self.table = table.to_device(max_bs, width, dev, backend=backend) if table is not None else None
        self.q = torch.zeros(max_bs, width, dtype=torch.float32, device=dev)
        self.surv = torch.zeros(max_bs, width, dtype=torch.float32, device=dev)
        self.tokens = torch.zeros(max_bs, width, dtype=torch.int32, device=dev)  # the chosen candidate
        self.length = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.pick = torch.zeros(max_bs, dtype=torch.bool, device=dev)  # True: the corpus won
        self._e_own = torch.zeros(max_bs, dtype=torch.float32, device=dev)
        self._e_corpus = torch.zeros(max_bs, dtype=torch.float32, device=dev)
        self._scale = torch.tensor(1.0 / Q_ONE, dtype=torch.float32, device=dev)
        self.online = OnlineCalibration(num_slots, max_bs, width, dev, strength, backend=backend) if online else None
        # Request-steps that verified a corpus chain, and the drafts accepted on them (``counts()``).
        self.counters = ChainCounters(max_bs, dev, ("corpus_chosen", "accepted_corpus"), offset=1, backend=backend)
        self._one = torch.ones((), dtype=torch.int32, device=dev)
        self._choose = choose_rows_fn(resolve_backend(backend, dev))  # choose.py (a Triton launch on CUDA)

    def reset(self, slots: torch.Tensor) -> None:
        """At prefill: a new request's record starts empty."""
        if self.online is not None:
            self.online.reset(slots)

    def price(self, slots: torch.Tensor, draft) -> tuple[torch.Tensor, torch.Tensor]:
        """The corpus draft's calibrated ``(q, survival) [bs, width]`` (views of this object's buffers; 0 past
        its length)."""
        bs = draft.tokens.shape[0]
        q, surv = self.q[:bs], self.surv[:bs]
        price_corpus_draft(slots, draft, q, surv, self._scale, self.table, self.online)
        return q, surv

    def choose(self, own_tokens: torch.Tensor, own_surv: torch.Tensor, own_len: torch.Tensor, draft,
               corpus_surv: torch.Tensor, limit: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per request, the candidate with the larger expected accepted length (ties: the request's own),
        counting only the first ``limit`` tokens (a host int: the tokens this step can verify; default all).

        ``own_surv`` is overwritten with the winner's survivals; returns ``(tokens, length)`` of the winner
        (views of this object's buffers)."""
        bs = own_tokens.shape[0]
        w = own_surv.shape[1] if limit is None else max(1, min(int(limit), own_surv.shape[1]))
        tok, length = self.tokens[:bs], self.length[:bs]
        self._choose(own_surv, corpus_surv, w, self._e_own[:bs], self._e_corpus[:bs], self.pick[:bs], own_tokens,
                     draft.tokens, tok, own_len, draft.length, length)
        return tok, length

    def update(self, slots: torch.Tensor, committed: torch.Tensor, counts: torch.Tensor,
               choice: Optional[torch.Tensor] = None) -> None:
        """After verify: score this step's corpus drafts (chosen or not) against the committed tokens; with
        ``choice [bs]`` (1 = the n-gram chain was verified) count the corpus chains verified and accepted."""
        if self.online is not None:
            self.online.update(slots, committed, counts)
        if choice is not None:
            used = self.counters.rows(counts.shape[0])[0]
            torch.eq(choice, self._one, out=used)
            used.logical_and_(self.pick[: counts.shape[0]])
            self.counters.add(counts)

    def counts(self) -> dict:
        """Host side, never waits: ``corpus_chosen`` (request-steps verifying a corpus chain) and
        ``accepted_corpus`` (drafts accepted on them)."""
        return self.counters.counts()


# The step's corpus walks stop once their survival falls below this. The step prices every drafted token (the
# fitted table, then the online record) and the selection cuts the chain where a token no longer pays, so a
# low kernel-side cut only gives the price longer walks to choose from; the stand-alone corpus
# (``CorpusConfig.tau``, 0.25) has no price after it. Measured in the README ("The step's walk cut").
STEP_CORPUS_TAU = 0.05


def corpus_config(isolation: str, entries: int, insert_chunk: int):
    """The ``CorpusConfig`` of a step (``None`` for ``"off"``): the insert buffers fit a whole verify, and the
    walks stop at ``STEP_CORPUS_TAU``. ``hybrid-spark calibrate --candidate corpus`` fits its table for it."""
    if isolation == "off":
        return None
    from ..ngram.corpus import CorpusConfig

    return CorpusConfig(entries=entries, isolation=isolation, tau=STEP_CORPUS_TAU,
                        insert_chunk=max(CorpusConfig.insert_chunk, int(insert_chunk)))


def make_step_corpus(isolation: str, entries: int, *, num_slots: int, max_bs: int, width: int, device,
                     backend: str = "auto", online: bool = True, strength: float = DEFAULT_STRENGTH,
                     table: str = "default") -> tuple[Optional[object], Optional[CorpusCandidate]]:
    """``(NgramCorpus, CorpusCandidate)`` for a step with n-gram chains of ``width`` tokens, or ``(None, None)``
    with the corpus off. ``table``: option ``corpus_calibration`` (``load_corpus_table``) or a ``CorpusTable``;
    a bad or mismatched table raises ``ValueError`` naming its file. Shared by ``HybridStep`` and the
    simulator's ``HybridPolicy``."""
    cfg = corpus_config(isolation, entries, width + 1)
    if cfg is None:
        return None, None
    from ..ngram.corpus import NgramCorpus
    from .corpus_table import load_corpus_table

    fitted = load_corpus_table(table) if isinstance(table, str) else table
    if fitted is not None:
        fitted.check_corpus(cfg)
    corpus = NgramCorpus(cfg, device, backend=backend, max_batch_size=max_bs, max_draft=width)
    return corpus, CorpusCandidate(num_slots, max_bs, width, device, online=online, strength=strength,
                                   table=fitted, backend=backend)
