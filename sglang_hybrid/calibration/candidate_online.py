"""Online calibration of model-free draft candidates, per source, learnt from verify outcomes on the device.

A fitted table (``table.py``) is fit once on other text; a deployment's traffic can differ (chat vs code
edits), and the corpus's own estimates (``q = best / (total + alpha)``) are only a prior. This module keeps,
per cell (source, match length, count bucket, draft position), how often a drafted token was reached, how
often it was accepted and how many acceptances its prior predicted, and corrects each candidate's own prior
by the cell's observed / predicted ratio::

    q = min(1, prior * (accepts + s) / (predicted + s))    # s = ``strength`` pseudo-acceptances

so a cell starts at its prior and converges to the measured rate, while candidates within a cell keep their
own ranking (the corpus's per-token ``q``, for example, still separates a 9-in-10 continuation from a
1-in-2 one in the same cell). Every candidate,
chosen or not, is scored after each step against the tokens the target produced ("shadow verification"):
position ``j`` is a trial if the tokens before it matched and the true token at ``j`` is known; it is an
accept if it matched. Positions past the known tokens are not counted (censored).

Sources: ``0`` = per-request n-gram (``NgramDraft``), ``1`` = corpus (``CorpusDraft``). Features: ``match_len``
clamped to ``[0, 15]``, ``match_count`` bucketed by ``floor(log2)`` into ``[0, 7]``, position ``1 .. max_draft``.
``RequestOddsRatio`` then corrects each request's candidates by that request's own record (the odds-ratio
layer of the worker's ``online.py``), so traffic that mixes kinds (chat beside code edits) is not priced by
their blend. Memory: ``2 * 16 * 8 * max_draft * 3`` float32. Both calls are fixed-shape torch ops on preallocated state
(no host synchronisation; the per-call temporaries are small ``[bs, D]`` tensors).
"""

from __future__ import annotations

import torch

__all__ = ["OnlineCalibration", "RequestOddsRatio"]

_ML, _CB = 16, 8


def _tried(tokens: torch.Tensor, length: torch.Tensor, truth: torch.Tensor, truth_len: torch.Tensor,
           pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(trial, accepted) ``[bs, D]``: token ``j`` is a trial if it was drafted, the truth is known there and
    tokens ``0..j-1`` matched; accepted if it matched too."""
    D = tokens.shape[1]
    known = (pos < length.long()[:, None]) & (pos < truth_len.long()[:, None])
    eq = (tokens.long() == truth[:, :D].long()) & known
    before = torch.cumprod(torch.cat([torch.ones_like(eq[:, :1]), eq[:, :-1]], 1).to(torch.int32), 1).bool()
    trial = known & before
    return trial, trial & eq


class OnlineCalibration:
    def __init__(self, max_draft: int, device, *, sources: int = 2, strength: float = 4.0) -> None:
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        if not strength > 0:
            raise ValueError(f"strength must be > 0, got {strength}")
        self.D, self.S, self.strength = max_draft, sources, float(strength)
        shape = (sources, _ML, _CB, max_draft)
        self.trials = torch.zeros(shape, dtype=torch.float32, device=device)
        self.accepts = torch.zeros(shape, dtype=torch.float32, device=device)
        self.predicted = torch.zeros(shape, dtype=torch.float32, device=device)
        self._pos = torch.arange(max_draft, device=device)

    def _cells(self, source: int, match_len: torch.Tensor, match_count: torch.Tensor, D: int) -> torch.Tensor:
        ml = match_len.long().clamp(0, _ML - 1)
        c = match_count.long().clamp(min=1)
        cb = torch.zeros_like(c)
        for i in range(1, _CB):
            cb += (c >= (1 << i)).long()
        base = ((source * _ML + ml) * _CB + cb) * self.D
        return base[:, None] + self._pos[None, :D]

    def estimate(self, source: int, length: torch.Tensor, match_len: torch.Tensor, match_count: torch.Tensor,
                 prior: torch.Tensor, out_q: torch.Tensor, out_survival: torch.Tensor) -> None:
        """``out_q / out_survival [bs, D]`` (float32, 0 past ``length``) from the counts and ``prior [bs, D]``."""
        D = out_q.shape[1]
        cell = self._cells(source, match_len, match_count, D)
        e, a = self.predicted.view(-1)[cell], self.accepts.view(-1)[cell]
        q = torch.clamp(prior.float() * (a + self.strength) / (e + self.strength), max=1.0)
        q = torch.where(self._pos[None, :D] < length.long()[:, None], q, torch.zeros_like(q))
        out_q.copy_(q)
        out_survival.copy_(torch.cumprod(q, dim=1))

    def update(self, source: int, tokens: torch.Tensor, length: torch.Tensor, match_len: torch.Tensor,
               match_count: torch.Tensor, prior: torch.Tensor, truth: torch.Tensor, truth_len: torch.Tensor) -> None:
        """Score a candidate (``tokens [bs, D]``, ``length``, its ``prior [bs, D]``) against the produced
        tokens ``truth [bs, >=D]`` (valid up to ``truth_len``); add its trials, accepts and predicted accepts."""
        D = tokens.shape[1]
        trial, ok = _tried(tokens, length, truth, truth_len, self._pos[None, :D])
        cell = self._cells(source, match_len, match_count, D)
        self.trials.view(-1).scatter_add_(0, cell.reshape(-1), trial.reshape(-1).float())
        self.accepts.view(-1).scatter_add_(0, cell.reshape(-1), ok.reshape(-1).float())
        self.predicted.view(-1).scatter_add_(0, cell.reshape(-1),
                                             torch.where(trial, prior[:, :D].float(), 0.0).reshape(-1))


class RequestOddsRatio:
    """How each request's candidates fare against the estimates they were priced with, per source.

    The cells above are the traffic's: in mixed traffic they blend chat (few copies) with code edits (long ones),
    so each kind is mis-priced the other's way. Per request (row) and source the layer keeps the
    Mantel-Haenszel sums of the worker's per-request record (``online.py``) over every tried token,
    ``E = sum q (1 - y)`` and ``O = sum (1 - q) y`` with ``q`` the estimate it corrects, and shifts that
    estimate's odds by ``R = (O + s) / (E + s)``: no evidence gives ``R = 1`` (bit for bit the input), and a
    request's own ratio takes over as its evidence grows. ``reset`` at a new request. Memory
    ``2 * sources * rows`` float32; fixed-shape torch ops, no host read.
    """

    def __init__(self, sources: int, rows: int, max_draft: int, device, strength: float = 2.0) -> None:
        if not strength > 0:
            raise ValueError(f"strength must be > 0, got {strength}")
        self.s = float(strength)
        self.O = torch.zeros((sources, rows), dtype=torch.float32, device=device)
        self.E = torch.zeros((sources, rows), dtype=torch.float32, device=device)
        self._pos = torch.arange(max_draft, device=device)

    def reset(self, rows: torch.Tensor) -> None:
        self.O[:, rows] = 0.0
        self.E[:, rows] = 0.0

    def ratio(self, source: int) -> torch.Tensor:
        return (self.O[source] + self.s) / (self.E[source] + self.s)

    def apply(self, source: int, q: torch.Tensor, out_q: torch.Tensor, out_survival: torch.Tensor) -> None:
        """``out_q = odds^-1(odds(q) R)`` per row, ``out_survival`` its running product (``q [bs, D]``)."""
        r = self.ratio(source)[: q.shape[0], None]
        out_q.copy_(q * r / (1.0 + q * (r - 1.0)))
        out_survival.copy_(torch.cumprod(out_q, dim=1))

    def update(self, source: int, tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor,
               truth: torch.Tensor, truth_len: torch.Tensor) -> None:
        """Score a candidate priced ``q [bs, D]`` (before this layer) against the produced tokens."""
        D = tokens.shape[1]
        trial, ok = _tried(tokens, length, truth, truth_len, self._pos[None, :D])
        qf = q[:, :D].float()
        bs = tokens.shape[0]
        self.O[source, :bs] += torch.where(ok, 1.0 - qf, 0.0).sum(1)
        self.E[source, :bs] += torch.where(trial & ~ok, qf, 0.0).sum(1)
