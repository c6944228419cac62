"""A fitted calibration of the cross-request corpus's drafts: odds ratios by match length, count and position.

The corpus prices its own drafts: ``q = best / (total + alpha)`` per drafted token (``ngram/corpus.py``). That
frequency estimate is biased in ways that depend on the evidence behind it: a continuation seen once after a
one-token context is a much weaker guess than ``1 / 2``; deep into a draft, a walk that survived its first
tokens is usually copying, and ``q`` under-states it. ``hybrid-spark calibrate --candidate corpus`` replays text
through a real corpus (``corpus_samples.py``) and fits, per cell (match length ``m`` of the first token's
context, clamped to ``[0, n_max]``; count bucket ``c = floor(log2 count)`` in ``[0, 7]``; position ``j``), the
Mantel-Haenszel odds ratio between what was accepted and what ``q`` predicted (the statistic the online record,
``online.py``, keeps per request)::

    O = sum (1 - q) y,   E = sum q (1 - y)     over tried tokens (y = 1: accepted)
    r_j     = (O_j + s) / (E_j + s)                     the position, over all cells
    r_m,j   = (O_m,j + s r_j) / (E_m,j + s)             shrunk towards it
    r_m,c,j = (O_m,c,j + s r_m,j) / (E_m,c,j + s)       and the cell towards that

and the corrected estimate is ``odds(q') = odds(q) r`` (a logit shift: within a cell the corpus's own ranking of
continuations is kept). The worker applies it before the online recalibration (``CorpusCandidate.price``), which
then learns what the table still gets wrong on the live traffic. Positions past the table's width use its last.

File: JSON, ``{"format": FORMAT, "version": 1, "corpus": {n_max, alpha, tau, ways}, "max_draft", "log_ratio":
[n_max + 1][8][max_draft], "fit": {...}, "heldout": {...}}``. A table only prices a corpus with the same
``n_max``, ``alpha``, ``tau`` and ``ways`` (the q it corrects), which ``check_corpus`` enforces at start-up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ..backend import resolve_backend
from ..jsonl_io import read_json

__all__ = ["CorpusTable", "DeviceCorpusTable", "FORMAT", "COUNT_BUCKETS", "count_bucket", "heldout_metrics",
           "load_corpus_table", "DEFAULT_CORPUS_TABLE"]

FORMAT = "sglang-hybrid-corpus-calibration"
VERSION = 1
COUNT_BUCKETS = 8
_CORPUS_KEYS = ("n_max", "alpha", "tau", "ways")
_MAX_LOG_RATIO = 20.0
DEFAULT_CORPUS_TABLE = Path(__file__).resolve().parent.parent / "data" / "calibration" / "corpus_default.json"


def load_corpus_table(spec: str) -> Optional["CorpusTable"]:
    """Option ``corpus_calibration``: ``"default"`` (the shipped table), ``"none"`` (the corpus's own q, no
    table) or a JSON path. A bad file raises ``ValueError`` naming it."""
    if spec == "none":
        return None
    return CorpusTable.load(DEFAULT_CORPUS_TABLE if spec == "default" else spec)


def count_bucket(count: np.ndarray) -> np.ndarray:
    """``floor(log2(max(count, 1)))`` clamped to ``[0, COUNT_BUCKETS - 1]``."""
    c = np.maximum(np.asarray(count, np.int64), 1)
    return np.minimum(np.floor(np.log2(c)).astype(np.int64), COUNT_BUCKETS - 1)


def _odds_shift(q: np.ndarray, r: np.ndarray) -> np.ndarray:
    return q * r / (1.0 + q * (r - 1.0))


class CorpusTable:
    """Fitted log odds ratios ``[n_max + 1, COUNT_BUCKETS, max_draft]`` for a corpus configured as ``corpus``."""

    def __init__(self, log_ratio: np.ndarray, corpus: dict[str, Any], *, fit: Optional[dict] = None,
                 heldout: Optional[dict] = None, source: str = "") -> None:
        lr = np.asarray(log_ratio, dtype=np.float64)
        where = f"corpus calibration {source}" if source else "corpus calibration"
        if lr.ndim != 3 or lr.shape[1] != COUNT_BUCKETS or lr.shape[0] < 1 or lr.shape[2] < 1:
            raise ValueError(f"{where}: log_ratio must be [n_max + 1][{COUNT_BUCKETS}][max_draft], got "
                             f"shape {list(lr.shape)}")
        if not np.all(np.isfinite(lr)) or np.abs(lr).max() > _MAX_LOG_RATIO:
            raise ValueError(f"{where}: log_ratio must be finite and within +-{_MAX_LOG_RATIO}")
        missing = [k for k in _CORPUS_KEYS if k not in corpus]
        if missing:
            raise ValueError(f"{where}: 'corpus' lacks {missing}")
        if int(corpus["n_max"]) + 1 != lr.shape[0]:
            raise ValueError(f"{where}: log_ratio has {lr.shape[0]} match lengths for n_max {corpus['n_max']}")
        self.log_ratio = lr
        self.corpus = {k: corpus[k] for k in _CORPUS_KEYS}
        self.fit_meta = dict(fit or {})
        self.heldout = heldout
        self.source = source

    @property
    def max_draft(self) -> int:
        return int(self.log_ratio.shape[2])

    # ------------------------------------------------------------------ fit and host-side use

    @classmethod
    def fit(cls, samples, corpus_cfg, *, prior_strength: float = 20.0, fit_meta: Optional[dict] = None
            ) -> "CorpusTable":
        """Fit from ``CorpusSamples`` drafted by a corpus configured as ``corpus_cfg`` (see the module doc)."""
        if not prior_strength > 0:
            raise ValueError(f"prior_strength must be > 0, got {prior_strength}")
        s = float(prior_strength)
        M, D = int(corpus_cfg.n_max) + 1, samples.q.shape[1]
        m = np.clip(samples.match_len.astype(np.int64), 0, M - 1)
        c = count_bucket(samples.match_count)
        y = samples.accepted.astype(np.float64)
        t = samples.tried
        o = np.where(t, (1.0 - samples.q) * y, 0.0)
        e = np.where(t, samples.q * (1.0 - y), 0.0)
        O = np.zeros((M, COUNT_BUCKETS, D))
        E = np.zeros((M, COUNT_BUCKETS, D))
        idx = (m * COUNT_BUCKETS + c)[:, None] * D + np.arange(D)[None, :]
        np.add.at(O.reshape(-1), idx.reshape(-1), o.reshape(-1))
        np.add.at(E.reshape(-1), idx.reshape(-1), e.reshape(-1))
        r_j = (O.sum((0, 1)) + s) / (E.sum((0, 1)) + s)
        r_mj = (O.sum(1) + s * r_j[None, :]) / (E.sum(1) + s)
        r = (O + s * r_mj[:, None, :]) / (E + s)
        corpus = {k: getattr(corpus_cfg, k) for k in _CORPUS_KEYS}
        meta = dict(fit_meta or {})
        meta.update(prior_strength=s, drafts=len(samples), tried_tokens=int(t.sum()))
        return cls(np.clip(np.log(r), -_MAX_LOG_RATIO, _MAX_LOG_RATIO), corpus, fit=meta)

    def ratio(self, match_len: np.ndarray, match_count: np.ndarray, width: int) -> np.ndarray:
        """Odds ratios ``[n, width]`` for drafts with these features (positions past the table: its last)."""
        m = np.clip(np.asarray(match_len, np.int64), 0, self.log_ratio.shape[0] - 1)
        j = np.minimum(np.arange(width), self.max_draft - 1)
        return np.exp(self.log_ratio[m[:, None], count_bucket(match_count)[:, None], j[None, :]])

    def apply(self, samples) -> np.ndarray:
        """The corrected ``q' [N, D]`` of ``CorpusSamples`` (host, float64)."""
        return _odds_shift(samples.q, self.ratio(samples.match_len, samples.match_count, samples.q.shape[1]))

    def check_corpus(self, corpus_cfg) -> None:
        """Raise ``ValueError`` (naming the file) unless the table was fitted for this corpus's q."""
        want = {k: getattr(corpus_cfg, k) for k in _CORPUS_KEYS}
        got = {k: self.corpus[k] for k in _CORPUS_KEYS}
        if any(float(want[k]) != float(got[k]) for k in _CORPUS_KEYS):
            raise ValueError(f"corpus calibration {self.source or '(in memory)'} was fitted for a corpus with "
                             f"{got}; this corpus has {want}")

    # ------------------------------------------------------------------ file

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "corpus": self.corpus, "max_draft": self.max_draft,
                "log_ratio": np.round(self.log_ratio, 6).tolist(), "fit": self.fit_meta, "heldout": self.heldout}

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        return p

    @classmethod
    def load(cls, path: str | Path) -> "CorpusTable":
        """Read a table; a missing, unreadable or malformed file raises ``ValueError`` naming it."""
        p = Path(path)
        data = read_json(p, "corpus calibration")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"corpus calibration {p}: not a corpus calibration (\"format\" must be {FORMAT!r}; "
                             "fit one with hybrid-spark calibrate --candidate corpus)")
        if data.get("version") != VERSION:
            raise ValueError(f"corpus calibration {p}: version {data.get('version')!r}, this package reads {VERSION}")
        if not isinstance(data.get("corpus"), dict):
            raise ValueError(f"corpus calibration {p}: 'corpus' must be an object")
        try:
            lr = np.asarray(data.get("log_ratio"), dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"corpus calibration {p}: 'log_ratio' must be a nested list of numbers") from None
        return cls(lr, data["corpus"], fit=data.get("fit"), heldout=data.get("heldout"), source=str(p))

    def to_device(self, max_bs: int, width: int, device, backend: str = "auto") -> "DeviceCorpusTable":
        return DeviceCorpusTable(self, max_bs, width, device, backend=backend)


class DeviceCorpusTable:
    """``CorpusTable`` on the device for drafts of up to ``max_bs`` rows and ``width`` columns: ``apply`` and
    ``price`` work on buffers made here (no allocation, no host read, no branch on device data). ``backend``:
    ``price`` as the torch ops of ``_price_torch`` or as one Triton launch (``corpus_table_kernel.py``; ``"auto"``
    on CUDA), equal bit for bit."""

    def __init__(self, table: CorpusTable, max_bs: int, width: int, device, backend: str = "auto") -> None:
        dev = torch.device(device)
        M, C, Dt = table.log_ratio.shape
        self.buckets, self.columns = C, Dt
        self.backend = resolve_backend(backend, dev)
        self._price = self._price_torch
        if self.backend == "triton":
            from functools import partial

            from .corpus_table_kernel import corpus_price_triton

            self._price = partial(corpus_price_triton, self)
        self._ratio = torch.tensor(np.exp(table.log_ratio).reshape(-1), dtype=torch.float32, device=dev)
        self._mmax = M - 1
        self._col = torch.clamp(torch.arange(width, device=dev), max=Dt - 1).view(1, width)
        # Strides as device scalars: a Python number in an in-place mul would be wrapped in a tensor per call.
        self._cstride = torch.tensor(Dt, dtype=torch.int64, device=dev)
        self._mstride = torch.tensor(C * Dt, dtype=torch.int64, device=dev)
        self._thresh = torch.tensor([1 << i for i in range(1, C)], dtype=torch.int32, device=dev)  # 2, 4, .. 2^7
        self._cb = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self._m = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        # Flat, so that [:bs * w] is contiguous for any chain width w <= width.
        self._cell = torch.zeros(max_bs * width, dtype=torch.int64, device=dev)
        self._r = torch.zeros(max_bs * width, dtype=torch.float32, device=dev)
        self._den = torch.zeros(max_bs * width, dtype=torch.float32, device=dev)
        self._one = torch.ones((), dtype=torch.float32, device=dev)  # a Python scalar would be wrapped per call

    def apply(self, match_len: torch.Tensor, match_count: torch.Tensor, q: torch.Tensor) -> None:
        """``q [bs, w]`` (float32, the corpus's own estimate; 0 past a draft) becomes ``q'`` in place."""
        bs, w = q.shape
        cb, m = self._cb[:bs], self._m[:bs]
        n = bs * w
        cell, r, den = self._cell[:n].view(bs, w), self._r[:n].view(bs, w), self._den[:n].view(bs, w)
        torch.searchsorted(self._thresh, match_count, right=True, out=cb)  # thresholds <= count: the bucket
        m.copy_(match_len)
        m.clamp_(0, self._mmax)
        m.mul_(self._mstride)
        cb.mul_(self._cstride)
        m.add_(cb)
        torch.add(self._col[:, :w], m.view(-1, 1), out=cell)
        torch.index_select(self._ratio, 0, self._cell[:n], out=self._r[:n])
        torch.sub(r, self._one, out=den)  # q' = q r / (1 + q (r - 1))
        den.mul_(q)
        den.add_(self._one)
        q.mul_(r)
        q.div_(den)

    def price(self, draft_q: torch.Tensor, scale: torch.Tensor, match_len: torch.Tensor, match_count: torch.Tensor,
              q: torch.Tensor) -> None:
        """``q [bs, w]`` (float32) becomes the fitted estimate of a corpus draft: its fixed-point ``draft_q [bs, w]``
        (int32) times ``scale`` (a device scalar, ``1 / Q_ONE``), then ``apply``."""
        self._price(draft_q, scale, match_len, match_count, q)

    def _price_torch(self, draft_q: torch.Tensor, scale: torch.Tensor, match_len: torch.Tensor,
                     match_count: torch.Tensor, q: torch.Tensor) -> None:
        """The torch reference of ``corpus_table_kernel.corpus_price_triton`` (same arguments, same writes)."""
        q.copy_(draft_q)  # int32 -> float32 in place (a mixed-dtype mul would allocate a float copy)
        q.mul_(scale)
        self.apply(match_len, match_count, q)


def heldout_metrics(table: CorpusTable, samples) -> dict[str, Any]:
    """Per-token metrics (``metrics._summary``: ECE, AUC, Brier, log-loss) of the corpus's own ``q`` (``raw``)
    and of the table's ``q'`` (``fitted``) on the tried tokens of ``CorpusSamples``."""
    from .metrics import Events, _summary

    t = samples.tried
    y = samples.accepted[t].astype(np.float64)
    return {"drafts": len(samples), "raw": _summary(Events(samples.q[t], y)),
            "fitted": _summary(Events(table.apply(samples)[t], y))}
