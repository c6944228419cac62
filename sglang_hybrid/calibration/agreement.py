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

The survivals are then ``prod_{i<=j} q'_i``. ``apply`` does this for each model-free candidate (own history,
corpus) before the choice between them. Measured on the simulator's chat workload (all 240 requests, batch 4):
in the rows where the own-history draft's first token disagrees with the model's, the predicted ``q'_0`` and
the observed rate agree bucket by bucket (0.022 / 0.018, 0.147 / 0.154, 0.374 / 0.388), where the table's
``q_0`` alone said about 0.48 for all of them. No constant is fitted: the rule reads only the two estimates it
combines.

**The shared tokens** (``share``, after the choice; ``update``, after verify). The leading tokens the chosen
n-gram chain shares with the model chain are the same tokens on both chains, so they get one price on both:
``p' = p R / (1 + p (R - 1))`` (the odds of ``p = max(q, c)`` times ``R``), where ``R = (O + s) / (E + s)`` is
what agreement has been worth on this traffic: ``E`` sums ``p (1 - y)`` and ``O`` sums ``(1 - p) y`` over the
shared tokens the target tried (``y`` = 1 if accepted), decayed per request-step as the online calibration's
traffic level (``online.py``), ``s`` its prior strength. Where two drafters' errors are independent (the
simulator: a wrong model token never equals an n-gram token) ``R`` grows and shared tokens approach 1; where
they make the same mistakes ``R`` stays near 1 or falls below it, and shared tokens are priced at or under
``max(q, c)``. Raised on the n-gram
chain alone the shared tokens would tilt the choice towards it for tokens the model chain carries too; the
model chain's survival is rewritten the same way (the selection reads it; DSpark's planner keeps the drafter's
own confidences for model rows). Where the chosen chain parts from the model chain, the model's token gets the
parting rule too, ``c' = c (1 - q) / (1 - q c)`` with the n-gram's ``q`` from before its own parting rule (at
most one of two different tokens is right, whichever chain carries it).

Decode-step rules: ``apply``, ``share`` and ``update`` write only into buffers made at construction for the
largest batch, never read the device and never branch on device data. ``agreement_ref``, ``share_ref`` and
``update_ref`` below are the plain definitions the tests compare against.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..backend import resolve_backend
from .online import DEFAULT_GLOBAL_DECAY, DEFAULT_STRENGTH

__all__ = ["ModelAgreement", "agreement_ref", "conditional", "share_ref", "tried_evidence", "update_ref"]


def conditional(surv: torch.Tensor, prev: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Per-token conditional acceptance ``c_j = S_j / S_{j-1}`` (``S_0 = 1``) of prefix survivals ``surv``, clamped
    to [0, 1], into ``out``; ``prev`` is scratch of the same shape."""
    prev[:, :1].fill_(1.0)
    prev[:, 1:].copy_(surv[:, :-1])
    torch.div(surv, prev.clamp_(min=1e-12), out=out)
    return out.clamp_(0.0, 1.0)


def tried_evidence(tok: torch.Tensor, p: torch.Tensor, mask: torch.Tensor, committed: torch.Tensor,
                   counts: torch.Tensor, ev: torch.Tensor, v: SimpleNamespace, col: torch.Tensor,
                   one: torch.Tensor) -> None:
    """Per-token evidence of a traffic-level odds record into ``ev [2, bs, cols]``: ``p (1 - y)`` and ``(1 - p) y``
    on the tokens of ``tok [bs, cols]`` where ``mask`` that the target tried (``committed[b, :counts[b]]`` reaches
    them and every token before matched; ``y`` = 1 if the token matched), 0 elsewhere. The agreement's shared
    tokens and the echo's lifted ones (``echo.py``) are scored by it. ``v``: ``[bs, cols]`` scratch views (``cmt``,
    ``eqi`` int32; ``eq``, ``inn``, ``first`` bool; ``up``, ``c`` float32; ``pref`` / ``prev``: columns 1.. / ..-1
    of one int32 ``[bs, cols + 1]`` buffer whose column 0 is 1); ``col [1, cols]``: 0..cols-1; ``one``: 1.0."""
    g = p.shape[1]
    k = min(g, committed.shape[1])
    if k < g:  # host-known shape
        v.cmt[:, k:].fill_(-1)
    v.cmt[:, :k].copy_(committed[:, :k])  # copy_ converts the dtype in place
    torch.eq(tok, v.cmt, out=v.eq)
    torch.lt(col, counts.view(-1, 1), out=v.inn)
    v.eq.logical_and_(v.inn)  # y_j
    v.eqi.copy_(v.eq)  # a bool cumprod would cast into a new tensor
    torch.cumprod(v.eqi, 1, out=v.pref)  # prev[:, j] = 1 iff tokens 0..j-1 all matched
    v.first.copy_(v.prev)
    v.first.logical_and_(v.inn)
    v.first.logical_and_(mask)  # tried tokens of the mask
    e, o = ev[0], ev[1]
    v.up.copy_(v.eq)  # y as float
    torch.sub(one, v.up, out=e)
    e.mul_(p)
    torch.sub(one, p, out=o)
    o.mul_(v.up)
    v.c.copy_(v.first)  # as float (a bool operand would be cast into a new tensor)
    e.mul_(v.c)
    o.mul_(v.c)


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


def share_ref(tokens: torch.Tensor, length: torch.Tensor, survival: torch.Tensor, model_tokens: torch.Tensor,
              model_cond: torch.Tensor, model_survival: torch.Tensor, r: torch.Tensor, gamma: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Plain definition of ``ModelAgreement.share``, row by row in float32 scalars, with the odds ratio ``r``
    (0-d): returns ``(survival', model_survival', p, shared)``: ``p [bs, g]`` the pre-lift estimate on the shared
    tokens (0 elsewhere), ``shared[b]`` how many leading tokens row b shares, ``g = min(L, gamma)``."""
    bs, L = survival.shape
    g = min(L, gamma)
    surv, msurv = survival.clone(), model_survival.clone()
    p_out = torch.zeros(bs, g, dtype=torch.float32)
    one = torch.ones((), dtype=torch.float32)
    counts = []
    for b in range(bs):
        shared = 0
        while shared < min(g, int(length[b])) and int(tokens[b, shared]) == int(model_tokens[b, shared]):
            shared += 1
        counts.append(shared)
        qn, mc = [], []
        for j in range(g):
            prev = one if j == 0 else survival[b, j - 1].clamp(min=1e-12)
            q = (survival[b, j] / prev).clamp(0.0, 1.0)
            c = model_cond[b, j].to(torch.float32).clamp(0.0, 1.0)
            if j == shared and j < int(length[b]):  # the parting token: c (1 - q0) / (1 - q0 c), q0 = q / (1 - c + q c)
                q0 = q / (q * c - c + one).clamp(min=1e-12)
                c = (one - q0) * c / (one - q0 * c).clamp(min=1e-12)
            if j < shared:
                p = torch.maximum(q, c)
                p_out[b, j] = p
                lifted = p * r / (p * (r - one) + one)
                q, c = lifted, lifted
            qn.append(q)
            mc.append(c)
        for conds, old, out in ((qn, survival, surv), (mc, model_survival, msurv)):
            out[b, :g] = torch.cumprod(torch.stack(conds), 0)  # torch's product order (CPU: a double accumulator)
            if old.shape[1] > g:
                out[b, g:] = old[b, g:] * (out[b, g - 1] / old[b, g - 1].clamp(min=1e-30))
    return surv, msurv, p_out, counts


def update_ref(record: torch.Tensor, p: torch.Tensor, shared: list[int], model_tokens: torch.Tensor,
               committed: torch.Tensor, counts: torch.Tensor, decay: float) -> torch.Tensor:
    """Plain definition of ``ModelAgreement.update`` (in float64): the record ``[E, O]`` after one step whose
    first ``shared[b]`` tokens of row b were shared, with estimates ``p [bs, g]``, on the model chain
    ``model_tokens [bs, >= g]``; scored against ``committed[b, :counts[b]]``."""
    bs = p.shape[0]
    e = o = 0.0
    for b in range(bs):
        for j in range(min(shared[b], int(counts[b]), committed.shape[1])):
            y = int(model_tokens[b, j]) == int(committed[b, j])
            pj = float(p[b, j])
            e += pj * (1 - y)
            o += (1 - pj) * y
            if not y:
                break
    rec = record.double() * decay ** bs
    return rec + torch.tensor([e, o], dtype=torch.float64)


class ModelAgreement:
    """Buffers for ``apply`` on up to ``max_bs`` n-gram chains of ``width`` tokens beside model chains of ``gamma``."""

    def __init__(self, max_bs: int, width: int, gamma: int, device: torch.device | str, *,
                 strength: float = DEFAULT_STRENGTH, decay: float = DEFAULT_GLOBAL_DECAY,
                 backend: str = "auto") -> None:
        if max_bs < 1 or width < 1 or gamma < 1:
            raise ValueError(f"ModelAgreement: max_bs, width and gamma must be >= 1, got {max_bs}, {width}, {gamma}")
        if not strength > 0 or not 0.0 <= decay <= 1.0:
            raise ValueError(f"ModelAgreement: strength must be > 0 and decay in [0, 1], got {strength}, {decay}")
        dev = torch.device(device)
        # The elementwise work of apply / share / update: the torch ops below (the reference, what the CPU runs)
        # or one Triton launch each (agreement_kernel.py; "auto" on CUDA), equal bit for bit.
        self.backend = resolve_backend(backend, dev)
        self._apply_elems = self._apply_elems_torch
        self._share_elems = self._share_elems_torch
        self._update_elems = self._update_elems_torch
        if self.backend == "triton":
            from .agreement_kernel import agreement_apply_triton, agreement_share_triton, agreement_update_triton

            self._apply_elems = agreement_apply_triton
            self._share_elems = agreement_share_triton
            self._update_elems = agreement_update_triton
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
        self._zero = torch.zeros((), **f32)
        # The shared tokens (``share`` / ``update``): the traffic's record [E, O] of what agreement is worth, and
        # this step's shared tokens, their estimate p and the model's tokens there, kept for ``update``.
        self.record = torch.zeros(2, **f32)
        self._s = torch.tensor(float(strength), **f32)
        self._decay_by_bs = torch.tensor([float(decay) ** b for b in range(max_bs + 1)], **f32)
        self._r = torch.zeros((), **f32)
        self._rm1 = torch.zeros((), **f32)
        self._es = torch.zeros((), **f32)
        self._sum = torch.zeros(2, **f32)
        self._shared = torch.zeros(max_bs, g, dtype=torch.bool, device=dev)
        self._p = torch.zeros(max_bs, g, **f32)
        self._tok = torch.zeros(max_bs, g, dtype=torch.int32, device=dev)
        self._cmt = torch.zeros(max_bs, g, dtype=torch.int32, device=dev)
        self._prev_s = torch.zeros(max_bs, g, **f32)
        self._ratio = torch.zeros(max_bs, 1, **f32)
        self._ev = torch.zeros(2, max_bs, g, **f32)  # E and O terms of one update
        self._views: dict[int, SimpleNamespace] = {}

    def _rows(self, bs: int) -> SimpleNamespace:
        v = self._views.get(bs)
        if v is None:
            v = SimpleNamespace(eq=self._eq[:bs], eqi=self._eqi[:bs], pref=self._pref[:bs, 1:],
                                prev=self._pref[:bs, :-1], first=self._first[:bs], agree=self._agree[:bs],
                                inn=self._in[:bs], c=self._c[:bs], up=self._up[:bs], dis=self._dis[:bs],
                                den=self._den[:bs], shared=self._shared[:bs], p=self._p[:bs], tok=self._tok[:bs],
                                cmt=self._cmt[:bs], prev_s=self._prev_s[:bs], ratio=self._ratio[:bs],
                                ev=self._ev[:, :bs])
            self._views[bs] = v
        return v

    def _prefix(self, v: SimpleNamespace, tokens: torch.Tensor, length: torch.Tensor,
                model_tokens: torch.Tensor) -> None:
        """``v.pref``: 1 while every token of the chain so far equals the model's (within ``length``); ``v.first``:
        the first token where they part; ``v.inn``: the columns within ``length``."""
        g = self.cols
        torch.eq(tokens[:, :g], model_tokens[:, :g], out=v.eq)
        torch.lt(self._col, length.view(-1, 1), out=v.inn)
        v.eq.logical_and_(v.inn)
        v.eqi.copy_(v.eq)  # a bool cumprod would cast into a new tensor
        torch.cumprod(v.eqi, 1, out=v.pref)
        torch.gt(v.prev, v.pref, out=v.first)
        v.first.logical_and_(v.inn)

    def _one_of_two(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
        """``a (1 - b) / (1 - a b)`` into ``out`` (``den`` scratch): the chance that the token estimated at ``a`` is
        the right one when the other drafter's different token is estimated at ``b`` (two independent experts).
        ``out`` may be ``b``: ``b`` is read before ``out`` is written."""
        torch.mul(a, b, out=den)
        torch.sub(self._one, den, out=den)
        den.clamp_(min=1e-12)
        torch.sub(self._one, b, out=out)
        out.mul_(a)
        return out.div_(den)

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
        self._apply_elems(tokens, length, q, model_tokens, model_cond, self.cols)
        torch.cumprod(q, 1, out=survival)

    def _apply_elems_torch(self, tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor,
                           model_tokens: torch.Tensor, model_cond: torch.Tensor, cols: int) -> None:
        """``apply``'s rules on ``q[:, :cols]``, in place (the torch reference of ``agreement_apply_triton``)."""
        v = self._rows(q.shape[0])
        qg = q[:, :cols]
        self._prefix(v, tokens, length, model_tokens)
        torch.clamp(model_cond[:, :cols], 0.0, 1.0, out=v.c)
        torch.maximum(qg, v.c, out=v.up)
        self._one_of_two(qg, v.c, v.dis, v.den)  # q (1 - c) / (1 - q c)
        v.agree.copy_(v.pref)
        torch.where(v.agree, v.up, qg, out=qg)
        torch.where(v.first, v.dis, qg, out=qg)

    # ---- the shared tokens: one price on both chains, learnt from the traffic ------------------------------
    def ratio(self) -> torch.Tensor:
        """``R = (O + s) / (E + s)`` into a 0-d buffer: the traffic's observed / predicted odds on shared tokens."""
        return self._ratio_of(self.record, self._s)

    def _ratio_of(self, record: torch.Tensor, strength: torch.Tensor) -> torch.Tensor:
        torch.add(record[1], strength, out=self._r)
        torch.add(record[0], strength, out=self._es)
        return self._r.div_(self._es)

    def share(self, tokens: torch.Tensor, length: torch.Tensor, survival: torch.Tensor, model_tokens: torch.Tensor,
              model_cond: torch.Tensor, model_survival: torch.Tensor) -> None:
        """Price the leading tokens the chosen n-gram chain shares with the model chain the same on both chains.

        ``tokens [bs, L]`` / ``length [bs]`` / ``survival [bs, L]``: the chain the choice kept (after ``apply``);
        ``model_tokens`` / ``model_cond [bs, >= gamma]``: the model chain; ``model_survival [bs, M]`` (M >= the
        shared columns): its prefix survivals, rewritten in place like ``survival``. On a shared token both
        conditionals become ``p' = p R / (1 + p (R - 1))`` (odds times ``R``), ``p = max(q, c)``, ``R`` from
        ``ratio``; at the parting token the model's conditional becomes ``c (1 - q) / (1 - q c)``; the columns
        after it keep their conditionals (their survivals are rescaled)."""
        bs, L = survival.shape
        g = self.cols
        v = self._rows(bs)
        self._share_elems(tokens, length, survival, model_tokens, model_cond, self.record, self._s,
                          v.up, v.c, v.p, v.shared, v.tok)
        for conds, surv in ((v.up, survival), (v.c, model_survival)):
            # columns >= g keep their conditionals: scale them by new S_{g-1} / old S_{g-1}
            torch.cumprod(conds, 1, out=v.den)
            if surv.shape[1] > g:
                torch.clamp(surv[:, g - 1 : g], min=1e-30, out=v.ratio)
                torch.div(v.den[:, g - 1 : g], v.ratio, out=v.ratio)
                surv[:, g:].mul_(v.ratio)
            surv[:, :g].copy_(v.den)

    def _share_elems_torch(self, tokens: torch.Tensor, length: torch.Tensor, survival: torch.Tensor,
                           model_tokens: torch.Tensor, model_cond: torch.Tensor, record: torch.Tensor,
                           strength: torch.Tensor, up: torch.Tensor, c: torch.Tensor, p: torch.Tensor,
                           shared: torch.Tensor, tok: torch.Tensor) -> None:
        """``share``'s conditionals on the model's columns (the torch reference of ``agreement_share_triton``):
        ``up`` / ``c [bs, cols]`` the n-gram's and the model's after the rules, ``p`` the pre-lift estimate on the
        shared tokens (0 elsewhere), ``shared`` their flags, ``tok`` the model's tokens (``p`` / ``shared`` /
        ``tok`` are kept for ``update``). ``record [2]`` / ``strength`` (0-d): the odds ratio's (``ratio``)."""
        g = self.cols
        v = self._rows(survival.shape[0])
        self._prefix(v, tokens, length, model_tokens)
        shared.copy_(v.pref)
        conditional(survival[:, :g], v.prev_s, up)  # the chain's q_j = S_j / S_{j-1}
        torch.clamp(model_cond[:, :g], 0.0, 1.0, out=c)
        # The model's token where the chains part: at most one of the two is right, as ``apply`` priced the
        # n-gram's. Its q before that rule: q = q' / (1 - c + q' c); then c' = c (1 - q) / (1 - q c).
        torch.mul(up, c, out=v.den)
        v.den.sub_(c)
        v.den.add_(self._one)
        v.den.clamp_(min=1e-12)
        torch.div(up, v.den, out=v.dis)  # q
        self._one_of_two(c, v.dis, v.dis, v.den)
        torch.where(v.first, v.dis, c, out=c)
        torch.maximum(up, c, out=v.dis)
        torch.where(shared, v.dis, self._zero, out=p)  # p, kept for update (0 off the shared tokens)
        r = self._ratio_of(record, strength)
        torch.sub(r, self._one, out=self._rm1)
        torch.mul(p, self._rm1, out=v.den)
        v.den.add_(self._one)  # 1 + p (R - 1) >= min(1, R) > 0
        torch.mul(p, r, out=v.dis)
        v.dis.div_(v.den)  # p'
        torch.where(shared, v.dis, up, out=up)
        torch.where(shared, v.dis, c, out=c)
        tok.copy_(model_tokens[:, :g])

    def update(self, committed: torch.Tensor, counts: torch.Tensor) -> None:
        """After verify: score this step's shared tokens (``share``) against what the target committed
        (``committed [bs, K]``: accepted drafts, then the bonus; ``counts [bs]`` of them) into the traffic's
        record, decayed per request-step: ``E += p (1 - y)``, ``O += (1 - p) y`` over the shared tokens tried
        (the committed row reaches them and every token before matched)."""
        bs = committed.shape[0]
        v = self._rows(bs)
        self._update_elems(v.tok, v.p, v.shared, committed, counts, v.ev)
        torch.sum(v.ev, (1, 2), out=self._sum)
        self.record.mul_(self._decay_by_bs[bs])
        self.record.add_(self._sum)

    def _update_elems_torch(self, tok: torch.Tensor, p: torch.Tensor, shared: torch.Tensor, committed: torch.Tensor,
                            counts: torch.Tensor, ev: torch.Tensor) -> None:
        """``update``'s per-token evidence into ``ev [2, bs, cols]`` (the torch reference of
        ``agreement_update_triton``): ``tried_evidence`` on the shared tokens."""
        tried_evidence(tok, p, shared, committed, counts, ev, self._rows(p.shape[0]), self._col, self._one)
