"""Pricing an n-gram chain beside the model chain it competes with: where the two agree, and where they part.

The calibration table and the online records price an n-gram draft from its own features (match length, count,
position, source). At a decode step the model chain stands beside it, with its per-token conditional
confidence ``c_j``, and the two chains say something about each other:

* **Where they agree** (token j of both chains is the same and so are all before it), the n-gram token is right
  exactly when the model's is: ``q'_j = max(q_j, c_j)``. Two drafters proposing the same token is evidence
  for it; ``max`` takes the stronger of the two estimates and claims nothing more (how much more agreement is
  worth depends on how correlated the two drafters' errors are, which this module does not assume).
* **At the first token where they part**, at most one of the two is right. If each is right with its own
  probability and independently of the other (two experts), the n-gram token is right with probability
  ``q'_j = q_j (1 - c_j) / (1 - q_j c_j)``: a confident model token that disagrees makes the n-gram token
  unlikely, a doubtful one leaves it almost as it was.
* **After that** the chains are on different paths, and the model's confidences say nothing about the n-gram's
  tokens: ``q'_j = q_j``. Past the model chain (``j >= gamma``) the same.

The survivals are then ``prod_{i<=j} q'_i``. Measured on the simulator's chat workload (all 240 requests,
batch 4): in the rows where the own-history draft's first token disagrees with the model's, the predicted
``q'_0`` and the observed rate agree bucket by bucket (0.022 / 0.018, 0.147 / 0.154, 0.374 / 0.388), where
the table's ``q_0`` alone said about 0.48 for all of them. No constant is fitted: the rule reads only the two
estimates it combines.

Decode-step rules: ``apply`` writes only into buffers made at construction for the largest batch, never reads
the device and never branches on device data. ``agreement_ref`` below is the plain definition the tests compare
against.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

__all__ = ["ModelAgreement", "agreement_ref"]


def agreement_ref(tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor, model_tokens: torch.Tensor,
                  model_cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain definition, row by row: ``(q', survival') [bs, L]`` of the n-gram chains ``tokens [bs, L]`` (first
    ``length`` tokens; ``q`` is 0 past them) beside the model chains ``model_tokens [bs, G]`` with conditional
    confidences ``model_cond [bs, G]`` (see the module docstring)."""
    bs, L = q.shape
    out = q.clone()
    for b in range(bs):
        n = min(int(length[b]), L)
        for j in range(min(n, model_tokens.shape[1])):
            c = model_cond[b, j].to(torch.float32).clamp(0.0, 1.0)  # float32 scalars, as the batched ops
            qj = q[b, j]
            if int(tokens[b, j]) == int(model_tokens[b, j]):
                out[b, j] = torch.maximum(qj, c)
            else:
                out[b, j] = (1.0 - c) * qj / (1.0 - qj * c).clamp(min=1e-12)
                break
    return out, torch.cumprod(out, 1)


class ModelAgreement:
    """Buffers for ``apply`` on up to ``max_bs`` n-gram chains of ``width`` tokens beside model chains of ``gamma``."""

    def __init__(self, max_bs: int, width: int, gamma: int, device: torch.device | str) -> None:
        if max_bs < 1 or width < 1 or gamma < 1:
            raise ValueError(f"ModelAgreement: max_bs, width and gamma must be >= 1, got {max_bs}, {width}, {gamma}")
        dev = torch.device(device)
        self.width, self.gamma = width, gamma
        g = min(width, gamma)
        self.cols = g  # the columns the model chain can speak for
        f32 = dict(dtype=torch.float32, device=dev)
        self._eq = torch.zeros(max_bs, g, dtype=torch.bool, device=dev)
        self._pref = torch.zeros(max_bs, g + 1, dtype=torch.int32, device=dev)  # column 0: 1 (nothing parted yet)
        self._pref[:, 0] = 1
        self._eqi = torch.zeros(max_bs, g, dtype=torch.int32, device=dev)
        self._first = torch.zeros(max_bs, g, dtype=torch.bool, device=dev)
        self._agree = torch.zeros(max_bs, g, dtype=torch.bool, device=dev)
        self._in = torch.zeros(max_bs, g, dtype=torch.bool, device=dev)
        self._c = torch.zeros(max_bs, g, **f32)
        self._up = torch.zeros(max_bs, g, **f32)
        self._dis = torch.zeros(max_bs, g, **f32)
        self._den = torch.zeros(max_bs, g, **f32)
        self._col = torch.arange(g, dtype=torch.int32, device=dev).view(1, g)
        self._one = torch.ones((), **f32)
        self._views: dict[int, SimpleNamespace] = {}

    def _rows(self, bs: int) -> SimpleNamespace:
        v = self._views.get(bs)
        if v is None:
            v = SimpleNamespace(eq=self._eq[:bs], eqi=self._eqi[:bs], pref=self._pref[:bs, 1:], prev=self._pref[:bs, :-1],
                                first=self._first[:bs], agree=self._agree[:bs], inn=self._in[:bs], c=self._c[:bs],
                                up=self._up[:bs], dis=self._dis[:bs], den=self._den[:bs])
            self._views[bs] = v
        return v

    def apply(self, tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor, survival: torch.Tensor,
              model_tokens: torch.Tensor, model_cond: torch.Tensor) -> None:
        """Re-price in place the n-gram chains' conditional ``q [bs, L]`` and their ``survival [bs, L]``.

        ``tokens [bs, L]`` / ``length [bs]``: the chains (``q`` is 0 past ``length``); ``model_tokens [bs, G]``
        and ``model_cond [bs, G]`` (``G >= gamma`` columns; the first ``gamma`` are read): the model chains and
        their per-token conditional confidences."""
        bs, L = q.shape
        if L != self.width:
            raise ValueError(f"ModelAgreement: q has {L} columns, built for {self.width}")
        if model_tokens.shape[1] < self.gamma or model_cond.shape[1] < self.gamma:
            raise ValueError(f"ModelAgreement: the model chain needs >= {self.gamma} columns, "
                             f"got {model_tokens.shape[1]} and {model_cond.shape[1]}")
        g = self.cols
        v = self._rows(bs)
        qg = q[:, :g]
        torch.eq(tokens[:, :g], model_tokens[:, :g], out=v.eq)
        torch.lt(self._col, length.view(-1, 1), out=v.inn)
        v.eq.logical_and_(v.inn)
        v.eqi.copy_(v.eq)  # a bool cumprod would cast into a new tensor
        torch.cumprod(v.eqi, 1, out=v.pref)  # 1 while every token so far agrees
        torch.gt(v.prev, v.pref, out=v.first)  # the first token where the chains part
        v.first.logical_and_(v.inn)
        torch.clamp(model_cond[:, :g], 0.0, 1.0, out=v.c)
        torch.maximum(qg, v.c, out=v.up)
        # q (1 - c) / (1 - q c)
        torch.mul(qg, v.c, out=v.den)
        torch.sub(self._one, v.den, out=v.den)
        v.den.clamp_(min=1e-12)
        torch.sub(self._one, v.c, out=v.dis)
        v.dis.mul_(qg)
        v.dis.div_(v.den)
        v.agree.copy_(v.pref)
        torch.where(v.agree, v.up, qg, out=qg)
        torch.where(v.first, v.dis, qg, out=qg)
        torch.cumprod(q, 1, out=survival)
