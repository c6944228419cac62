"""Splices: the model chain cut after its first ``k`` tokens and continued by the request's own n-gram lookup.

The tail (``tail.py``) continues the model chain after its last token. A splice continues it after token ``k``
(``k`` in ``points``, each ``< gamma``): the lookup on ``history ++ model[:k]`` (``TokenHistory.run_after`` with
``counts`` k) drafts what follows, and the candidate chain is ``model[:k] ++ draft``. It pays where the model
chain would fail after ``k`` and the history continues the text the model began (a quote picked up in mid
phrase, an edit that returns to the file's text). One linear chain, so a ragged verify (DSpark's) or a wide
fixed window checks it with no tree mask.

Pricing: the draft's per-token estimate ``q`` comes from the calibration table (the ``agree`` feature, when a
table has it, reads "disagree"), and token ``j`` of the draft survives with ``S_model(k) * S_draft(j)``, where
``S_model`` is the drafter's own prefix survival (before the agreement's shared price). Per request the chain
with the largest surplus ``sum_j max(0, s_j - price)`` at the last step's price is kept: the model chain (as the
tail extended it) unless a splice with a non-empty draft beats it by more than ``margin`` expected tokens. The
margin stands for what the estimates cannot see: the splice with the largest estimate among several is the one
most likely over-estimated. The selection then chooses between the kept chain and the n-gram chain as before.
After verify, ``for_record`` keeps a spliced chain out of the model chain's own records. With the step's echo
(``echo.py``), a lookup that matches also says the model's first ``k`` tokens echo the history: the model chain's
and the splices' prefixes are priced lifted before the choice.

``HybridStep`` (option ``model_splices``, off by default) and the simulator's ``HybridPolicy``
(``--model-splices``) build it with ``make_step_splice``.

Decode-step rules: ``splice`` writes only into buffers made at construction for the largest batch, never reads
the device and never branches on device data.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from ..ngram.config import NgramConfig, NgramDraft
from .echo import ModelEcho

__all__ = ["ModelSplice", "make_step_splice", "splice_points"]


def splice_points(gamma: int, count: int) -> tuple[int, ...]:
    """The ``count`` splice points just before the model chain's end: ``k = gamma - count .. gamma - 1`` (at
    least 1)."""
    if count < 0:
        raise ValueError(f"model_splices: must be >= 0 (0 = off), got {count}")
    return tuple(range(max(1, gamma - count), gamma))


class ModelSplice:
    """Buffers for splicing chains ``width`` wide whose model part is ``gamma`` tokens (see the module docstring).

    ``points``: the ``k`` after which a splice may start (each in ``[1, gamma - 1]``); ``lookup_cfg``: the
    step's n-gram settings (``max_draft`` is replaced by the longest continuation, ``width - min(points)``).
    """

    def __init__(self, max_bs: int, gamma: int, width: int, points: tuple[int, ...], lookup_cfg: NgramConfig,
                 margin: float, device: torch.device | str) -> None:
        if not points or any(not (1 <= k < gamma) for k in points) or width < gamma:
            raise ValueError(f"ModelSplice: points must be in [1, gamma - 1] and width >= gamma, got "
                             f"points={points}, gamma={gamma}, width={width}")
        if margin < 0:
            raise ValueError(f"splice_margin: must be >= 0, got {margin}")
        dev = torch.device(device)
        self.gamma, self.width, self.points, self.margin = gamma, width, tuple(sorted(points)), float(margin)
        d = width - self.points[0]
        self.cfg = NgramConfig(n_min=lookup_cfg.n_min, n_max=lookup_cfg.n_max, max_draft=d, window=lookup_cfg.window)
        i32, f32 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.float32, device=dev)
        self._draft = NgramDraft.zeros(max_bs, d, dev)
        self._q, self._s = torch.zeros(max_bs, d, **f32), torch.zeros(max_bs, d, **f32)
        self.tokens = torch.zeros(max_bs, width, **i32)  # the kept chain
        self.survival = torch.zeros(max_bs, width, **f32)
        self.cond = torch.zeros(max_bs, width, **f32)  # its draft's per-token q from the splice point on, else 0
        self.point = torch.zeros(max_bs, **i32)  # the splice point k of the kept chain, 0 = the model chain
        self.after = torch.zeros(max_bs, width, dtype=torch.bool, device=dev)  # columns past a kept splice point
        self._cols = torch.arange(width, **i32).view(1, -1)
        self._zero = torch.zeros((), **i32)
        self._two = torch.full((), 2, **i32)
        self._spliced = torch.zeros(max_bs, dtype=torch.bool, device=dev)
        self._choice = torch.zeros(max_bs, **i32)
        self._vlen = torch.zeros(max_bs, **i32)
        self._kept = torch.zeros(max_bs, **i32)
        self._csv = torch.zeros(max_bs, width, **f32)
        self._ccond = torch.zeros(max_bs, width, **f32)
        self._best, self._cand = torch.zeros(max_bs, **f32), torch.zeros(max_bs, **f32)
        self._take = torch.zeros(max_bs, dtype=torch.bool, device=dev)
        self._gap = torch.zeros(max_bs, width, **f32)
        self._no_model = torch.full((max_bs, 1), -1, **i32)  # "disagree" for a table's agree feature
        self._k = {k: torch.full((max_bs,), k, **i32) for k in self.points}  # run_after's append counts
        self._margin = torch.tensor(self.margin, **f32)
        # Each point's candidate (the lookups run first: the echo's reach needs all of them before any choice).
        npt = len(self.points)
        self._ptok = torch.zeros(npt, max_bs, width, **i32)
        self._ps, self._pq = torch.zeros(npt, max_bs, d, **f32), torch.zeros(npt, max_bs, d, **f32)
        self._phas = torch.zeros(npt, max_bs, dtype=torch.bool, device=dev)
        self._msv = torch.zeros(max_bs, gamma, **f32)  # the drafter's own survivals (without the echo)
        self._view_cache: dict[int, SimpleNamespace] = {}

    def _views(self, bs: int) -> SimpleNamespace:
        v = self._view_cache.get(bs)
        if v is None:
            d = self._draft
            v = SimpleNamespace(
                draft=d.rows(bs),
                q=self._q[:bs], s=self._s[:bs], tok=self.tokens[:bs], sv=self.survival[:bs], cond=self.cond[:bs],
                point=self.point[:bs], csv=self._csv[:bs], ccond=self._ccond[:bs],
                best=self._best[:bs], cand=self._cand[:bs], take=self._take[:bs], gap=self._gap[:bs],
                after=self.after[:bs], spliced=self._spliced[:bs], choice=self._choice[:bs], vlen=self._vlen[:bs],
                kept=self._kept[:bs],
                no_model=self._no_model[:bs], k={k: t[:bs] for k, t in self._k.items()},
                ptok=self._ptok[:, :bs], ps=self._ps[:, :bs], pq=self._pq[:, :bs], phas=self._phas[:, :bs],
                msv=self._msv[:bs])
            self._view_cache[bs] = v
        return v

    def _surplus(self, survival: torch.Tensor, price: torch.Tensor, gap: torch.Tensor, out: torch.Tensor) -> None:
        torch.sub(survival, price, out=gap)
        gap.clamp_(min=0)
        torch.sum(gap, 1, out=out)

    def splice(self, history, slots: torch.Tensor, calibration, tokens: torch.Tensor, survival: torch.Tensor,
               model_surv: torch.Tensor, price: torch.Tensor, echo: Optional[ModelEcho] = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept chains ``(tokens, survival) [bs, width]`` (views of this object's buffers).

        ``tokens`` / ``survival [bs, width]``: the model chain as the selection would see it (its first ``gamma``
        columns are the model's, the rest the tail's or 0) and its prefix survivals; ``model_surv [bs, gamma]``:
        the drafter's own prefix survivals (the cumulative product of its confidences), which price a splice's
        first ``k`` tokens; ``price [1]``: the last step's price per verified token; ``calibration``: a
        ``DeviceCalibration``. ``self.point`` says which rows were spliced and where. A splice needs a draft of
        at least one token. ``echo``: the step's ``ModelEcho`` (``echo.py``), started for this step: each lookup
        that matches extends its reach, and both the model chain and the splices' prefixes are priced lifted."""
        bs, w = tokens.shape
        if w != self.width:
            raise ValueError(f"ModelSplice: tokens has {w} columns, the splice width is {self.width}")
        v = self._views(bs)
        v.cond.zero_()
        v.point.zero_()
        model = tokens[:, : self.gamma]
        for i, k in enumerate(self.points):  # every lookup first: the echo's reach is needed before any choice
            draft = history.run_after(slots, model, lambda: history.lookup(slots, self.cfg, v.draft), counts=v.k[k])
            calibration.apply(draft, v.no_model, v.q, v.s)  # q and survival 0 past the draft's length
            n = w - k
            v.ptok[i, :, :k].copy_(tokens[:, :k])
            v.ptok[i, :, k:].copy_(draft.tokens[:, :n])
            v.ps[i].copy_(v.s)
            v.pq[i].copy_(v.q)
            torch.gt(draft.length, self._zero, out=v.phas[i])
            if echo is not None:
                echo.note(v.phas[i], v.k[k])
        if echo is not None:  # the prefixes the history echoes, lifted on the model chain and in the splices
            v.sv.copy_(echo.lift_model(survival))
            v.msv.copy_(echo.lift_raw(model_surv[:, : self.gamma]))
        else:
            v.sv.copy_(survival)
            v.msv.copy_(model_surv[:, : self.gamma])
        v.tok.copy_(tokens)
        self._surplus(v.sv, price, v.gap, v.best)
        v.best.add_(self._margin)
        for i, k in enumerate(self.points):
            n = w - k
            v.csv[:, :k].copy_(v.msv[:, :k])
            torch.mul(v.ps[i, :, :n], v.msv[:, k - 1 : k], out=v.csv[:, k:])
            v.ccond[:, :k].zero_()
            v.ccond[:, k:].copy_(v.pq[i, :, :n])
            self._surplus(v.csv, price, v.gap, v.cand)
            torch.gt(v.cand, v.best, out=v.take)
            v.take.logical_and_(v.phas[i])
            take = v.take.view(-1, 1)
            torch.where(take, v.ptok[i], v.tok, out=v.tok)
            torch.where(take, v.csv, v.sv, out=v.sv)
            torch.where(take, v.ccond, v.cond, out=v.cond)
            torch.where(v.take, v.cand, v.best, out=v.best)
            torch.where(v.take, v.k[k], v.point, out=v.point)
        torch.ge(self._cols, v.point.view(-1, 1), out=v.after)
        torch.gt(v.point, self._zero, out=v.spliced)
        v.after.logical_and_(v.spliced.view(-1, 1))
        if echo is not None:  # what its record scores and the planner reads: the kept chain's lifted columns
            echo.finish(v.tok, v.sv, v.after, v.spliced)
        return v.tok, v.sv

    def for_record(self, choice: torch.Tensor, verify_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """After verify: ``(choice, verify_len) [bs]`` as the model chain's records should read them. A request
        that verified a spliced chain (choice 0, ``point`` k > 0) reads choice 2 (neither the model chain's tail
        nor the n-gram chain counts it) and at most ``k`` verified tokens (the model's own; the online refit of
        the model chain's acceptance sees only those). Views of buffers; the inputs are not changed."""
        bs = choice.shape[0]
        v = self._views(bs)
        v.choice.copy_(choice)
        v.vlen.copy_(verify_len)
        torch.eq(v.choice, self._zero, out=v.take)
        v.take.logical_and_(v.spliced)
        torch.where(v.take, self._two, v.choice, out=v.choice)
        torch.minimum(v.vlen, v.point, out=v.kept)
        torch.where(v.take, v.kept, v.vlen, out=v.vlen)
        return v.choice, v.vlen


def make_step_splice(model_splices: int, margin: float, *, width: int, gamma: int, lookup_cfg: NgramConfig,
                     max_bs: int, device):
    """The ``ModelSplice`` of a step (``None`` with ``model_splices`` 0 or a one-token model chain). Shared by
    ``HybridStep`` and the simulator's ``HybridPolicy``."""
    points = splice_points(gamma, model_splices)
    if not points:
        return None
    return ModelSplice(max_bs, gamma, width, points, lookup_cfg, margin, device)
