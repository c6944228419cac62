"""The history's echo of the model chain: its first tokens priced by what the request's own text says of them.

A lookup on ``history ++ model[:k]`` that finds a match (the n-gram tail's, ``k = gamma``, ``tail.py``; each splice
point's, ``splice.py``; each probe's, ``ModelEcho.probe``) says that the model chain's first ``k`` tokens end in an
n-gram the request has already read or written. A wrong draft token rarely does: the echo is evidence that the
prefix is right. The echo's *reach* is, per request, the largest ``k`` whose lookup matched (0: none). Before the
reach, the chain's conditionals become ``c' = c R / (1 + c (R - 1))`` (odds times ``R``; the survivals after the
reach are rescaled, their conditionals kept), where ``R = (O + s) / (E + s)`` is what an echo has been worth on this
traffic: ``E`` sums ``c (1 - y)`` and ``O`` sums ``(1 - c) y`` over the echoed tokens the target tried (``y`` = 1 if
accepted; tried = the committed row reaches the token and every token before it matched;
``agreement.tried_evidence``), decayed per request-step as the online calibration's traffic level (``online.py``),
``s`` its prior strength. The same estimator as the agreement's shared tokens (``agreement.py``). With no evidence
``R`` is 1 and every survival is unchanged bit for bit; where a drafter's wrong tokens echo the history as often as
its right ones (a drafter that copies the wrong passage), ``R`` stays near 1 and nothing moves.

Why: the selection and DSpark's planner verify a model chain only as far as its survival pays for the slots.
In the simulator's chat workload at batch 32, the rows where a splice lookup matched accepted the model chain up
to the splice point 95% of the time, where the drafter's own survival said 41% (``README``: "The history's echo
of the model chain"), so those chains were verified short. The simulator's wrong draft tokens never echo the
history (a real drafter's wrong token is a plausible one, and sometimes does), so the figure there is an upper
end; ``R`` is learnt from the traffic, not assumed.

Probes (option ``echo_probes``): for ``k = gamma - N .. gamma - 1``, the lookup's match test on ``history ++
model[:k]`` (``n_min`` tokens; ``TokenHistory.probe_after``, one kernel for every point), which only extends the
reach: no draft, no price, no choice.
In the simulator's chat at batch 32 the tail's lookup alone gave 1.026x over DSpark, four probes 1.041x, the same
as four splices with the echo (README: "Probes of the echo"): the gain of splices was their reach, not their
drafts.

Decode-step rules: ``lift``, ``update`` and ``probe`` write only into buffers made at construction for the largest
batch, never read the device and never branch on device data. ``lift_ref`` and ``update_ref`` below are the plain
definitions the tests compare against.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from ..ngram.config import NgramConfig
from .agreement import conditional, tried_evidence
from .online import DEFAULT_GLOBAL_DECAY, DEFAULT_STRENGTH

# The lift's running factor is capped: it exceeds 1 / S only where S has underflowed or is 0, and 0 * inf is NaN.
_MAX_FACTOR = 1e30

__all__ = ["ModelEcho", "PrefixEcho", "lift_ref", "make_step_echo", "probe_points", "update_ref"]


def lift_ref(survival: torch.Tensor, reach: torch.Tensor, r: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain definition of ``PrefixEcho.lift`` (row by row, float64): ``(survival', cond)``, where ``cond`` are the
    conditionals of ``survival`` (``S_j / S_{j-1}``, clamped to [0, 1]) and row b's first ``reach[b]`` of them are
    lifted to odds times ``r`` (the survivals after them rescaled)."""
    bs, w = survival.shape
    out = survival.double().clone()
    cond = torch.zeros(bs, w, dtype=torch.float64)
    for b in range(bs):
        factor = 1.0
        for j in range(w):
            prev = 1.0 if j == 0 else max(float(survival[b, j - 1]), 1e-12)
            c = min(max(float(survival[b, j]) / prev, 0.0), 1.0)
            cond[b, j] = c
            if j < int(reach[b]):
                factor *= r / (1.0 + c * (r - 1.0))
            out[b, j] = min(float(survival[b, j]) * min(factor, _MAX_FACTOR), 1.0)
    return out, cond


def update_ref(record: torch.Tensor, tokens: torch.Tensor, scored: torch.Tensor, p: torch.Tensor,
               committed: torch.Tensor, counts: torch.Tensor, decay: float) -> torch.Tensor:
    """Plain definition of ``PrefixEcho.update`` (float64): the record ``[E, O]`` after one step that priced the
    tokens ``scored[b, j]`` of the chains ``tokens`` at ``p[b, j]`` (their conditionals before the lift), scored
    against ``committed[b, :counts[b]]``."""
    e = o = 0.0
    for b in range(tokens.shape[0]):
        for j in range(min(tokens.shape[1], int(counts[b]), committed.shape[1])):
            y = int(tokens[b, j]) == int(committed[b, j])
            if bool(scored[b, j]):
                pj = float(p[b, j])
                e += pj * (1 - y)
                o += (1 - pj) * y
            if not y:
                break
    return record.double() * decay ** tokens.shape[0] + torch.tensor([e, o], dtype=torch.float64)


class PrefixEcho:
    """The traffic's record of what an echo is worth, and buffers for chains of up to ``width`` tokens."""

    def __init__(self, max_bs: int, width: int, device: torch.device | str, *, strength: float = DEFAULT_STRENGTH,
                 decay: float = DEFAULT_GLOBAL_DECAY) -> None:
        if max_bs < 1 or width < 1:
            raise ValueError(f"PrefixEcho: max_bs and width must be >= 1, got {max_bs}, {width}")
        if not strength > 0 or not 0.0 <= decay <= 1.0:
            raise ValueError(f"PrefixEcho: strength must be > 0 and decay in [0, 1], got {strength}, {decay}")
        dev = torch.device(device)
        f32 = dict(dtype=torch.float32, device=dev)
        self.width = width
        self.record = torch.zeros(2, **f32)  # [E, O]
        self._s = torch.tensor(float(strength), **f32)
        self._decay_by_bs = torch.tensor([float(decay) ** b for b in range(max_bs + 1)], **f32)
        self._r = torch.zeros((), **f32)
        self._rm1 = torch.zeros((), **f32)
        self._es = torch.zeros((), **f32)
        self._one = torch.ones((), **f32)
        self._sum = torch.zeros(2, **f32)
        self._cols = torch.arange(width, dtype=torch.int32, device=dev).view(1, -1)
        self._prev = torch.zeros(max_bs, width, **f32)
        self._lift = torch.zeros(max_bs, width, **f32)
        self._mask = torch.zeros(max_bs, width, dtype=torch.bool, device=dev)
        # update's scratch (agreement.tried_evidence)
        self._cmt = torch.zeros(max_bs, width, dtype=torch.int32, device=dev)
        self._eq = torch.zeros(max_bs, width, dtype=torch.bool, device=dev)
        self._inn = torch.zeros(max_bs, width, dtype=torch.bool, device=dev)
        self._eqi = torch.zeros(max_bs, width, dtype=torch.int32, device=dev)
        self._pref = torch.zeros(max_bs, width + 1, dtype=torch.int32, device=dev)  # column 0: 1
        self._pref[:, 0] = 1
        self._first = torch.zeros(max_bs, width, dtype=torch.bool, device=dev)
        self._up = torch.zeros(max_bs, width, **f32)
        self._c = torch.zeros(max_bs, width, **f32)
        self._ev = torch.zeros(2, max_bs, width, **f32)
        self._views: dict[tuple[int, int], SimpleNamespace] = {}

    def _rows(self, bs: int, w: int) -> SimpleNamespace:
        v = self._views.get((bs, w))
        if v is None:
            v = SimpleNamespace(surv_prev=self._prev[:bs, :w], lift=self._lift[:bs, :w], mask=self._mask[:bs, :w],
                                cols=self._cols[:, :w], ev=self._ev[:, :bs, :w],
                                scratch=SimpleNamespace(cmt=self._cmt[:bs, :w], eq=self._eq[:bs, :w],
                                                        inn=self._inn[:bs, :w], eqi=self._eqi[:bs, :w],
                                                        pref=self._pref[:bs, 1 : w + 1], prev=self._pref[:bs, :w],
                                                        first=self._first[:bs, :w], up=self._up[:bs, :w],
                                                        c=self._c[:bs, :w]))
            self._views[(bs, w)] = v
        return v

    def ratio(self) -> torch.Tensor:
        """``R = (O + s) / (E + s)`` into a 0-d buffer."""
        torch.add(self.record[1], self._s, out=self._r)
        torch.add(self.record[0], self._s, out=self._es)
        return self._r.div_(self._es)

    def lift(self, survival: torch.Tensor, reach: torch.Tensor, out: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """``out [bs, w]``: ``survival [bs, w]`` with each row's first ``reach[b]`` conditionals lifted to odds times
        ``R``; ``cond [bs, w]``: the conditionals before the lift (what ``update`` scores). ``out`` may be
        ``survival``."""
        bs, w = survival.shape
        if w > self.width:
            raise ValueError(f"PrefixEcho: {w} columns, built for {self.width}")
        v = self._rows(bs, w)
        conditional(survival, v.surv_prev, cond)
        r = self.ratio()
        torch.sub(r, self._one, out=self._rm1)
        torch.mul(cond, self._rm1, out=v.lift)  # l = R / (1 + c (R - 1)): c' / c, and R where c is 0
        v.lift.add_(self._one)
        torch.div(r, v.lift, out=v.lift)
        torch.lt(v.cols, reach.view(-1, 1), out=v.mask)
        v.lift.masked_fill_(v.mask.logical_not_(), 1.0)
        torch.cumprod(v.lift, 1, out=v.surv_prev)
        v.surv_prev.clamp_(max=_MAX_FACTOR)  # past a zero (or underflowed) survival the product may overflow: 0 * inf
        torch.mul(survival, v.surv_prev, out=out)
        return out.clamp_(max=1.0)

    def update(self, tokens: torch.Tensor, scored: torch.Tensor, p: torch.Tensor, committed: torch.Tensor,
               counts: torch.Tensor) -> None:
        """After verify: ``E += p (1 - y)``, ``O += (1 - p) y`` over the tokens ``scored [bs, w]`` of the chains
        ``tokens [bs, w]`` that the target tried (``committed[b, :counts[b]]`` reaches them and every token before
        matched), after decaying the record by one step of ``bs`` request-steps."""
        bs, w = tokens.shape
        v = self._rows(bs, w)
        tried_evidence(tokens, p, scored, committed, counts, v.ev, v.scratch, v.cols, self._one)
        torch.sum(v.ev, (1, 2), out=self._sum)
        self.record.mul_(self._decay_by_bs[bs])
        self.record.add_(self._sum)


class ModelEcho(PrefixEcho):
    """The echo in a decode step: the reach of each request's lookups after its model chain, the lifted chains and
    what ``update`` scores. ``gamma``: the model chain's tokens; ``width``: the chain as the selection sees it (the
    model's, then the tail's).

    Per step: ``start`` (the tail's lookup after the whole chain: reach ``gamma`` where it matched), ``probe``
    (``points``, each a lookup after ``model[:k]``), ``note`` for each splice point (``splice.py``), ``lift_model`` /
    ``lift_raw``, then ``finish`` with the kept chain; after verify, ``score``. ``HybridStep`` and the simulator's
    ``HybridPolicy`` build it with ``make_step_echo``. ``lookup_cfg``: the step's n-gram settings (the probes use
    its ``n_min`` and ``window``); needed with ``points``."""

    def __init__(self, max_bs: int, gamma: int, width: int, device: torch.device | str, *,
                 strength: float = DEFAULT_STRENGTH, decay: float = DEFAULT_GLOBAL_DECAY,
                 points: tuple[int, ...] = (), lookup_cfg: Optional[NgramConfig] = None) -> None:
        if not 1 <= gamma <= width:
            raise ValueError(f"ModelEcho: need 1 <= gamma <= width, got gamma={gamma}, width={width}")
        if any(not 1 <= k < gamma for k in points) or (points and lookup_cfg is None):
            raise ValueError(f"ModelEcho: probe points must be in [1, gamma - 1] with a lookup_cfg, got {points}")
        super().__init__(max_bs, width, device, strength=strength, decay=decay)
        dev = torch.device(device)
        i32, f32 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.float32, device=dev)
        self.gamma = gamma
        self.points = tuple(sorted(set(points)))
        if self.points:  # the probes: whether the last n_min tokens of history ++ model[:k] occurred before
            self._probe_n, self._probe_window = lookup_cfg.n_min, lookup_cfg.window
            npt = len(self.points)
            self._points = torch.tensor(self.points, **i32)
            self._pmatch = torch.zeros(max_bs, npt, **i32)  # TokenHistory.probe_after's output
            self._pat = torch.zeros(max_bs, npt, **i32)
        self.reach = torch.zeros(max_bs, **i32)  # per request: the model tokens the history echoes (0 = none)
        self.echoed = torch.zeros(max_bs, width, dtype=torch.bool, device=dev)  # the kept chain's lifted columns
        self.cond = torch.zeros(max_bs, width, **f32)  # the kept chain's conditionals, after the lift
        self.survival = torch.zeros(max_bs, width, **f32)  # the model chain's survivals, lifted
        self.raw = torch.zeros(max_bs, gamma, **f32)  # the drafter's own survivals, lifted
        self._pm, self._pr = torch.zeros(max_bs, width, **f32), torch.zeros(max_bs, gamma, **f32)  # before the lift
        self._p = torch.zeros(max_bs, gamma, **f32)
        self._tok = torch.zeros(max_bs, gamma, **i32)
        self._at = torch.zeros(max_bs, **i32)
        self._has = torch.zeros(max_bs, dtype=torch.bool, device=dev)
        self._zero = torch.zeros((), **i32)
        self._gamma = torch.full((), gamma, **i32)
        # R as of the last score, copied to the host asynchronously (the metric ``model_echo_ratio``).
        self._host_ratio = torch.ones(1, dtype=torch.float32, pin_memory=dev.type == "cuda")
        self._step_views: dict[int, SimpleNamespace] = {}

    def _step_rows(self, bs: int) -> SimpleNamespace:
        v = self._step_views.get(bs)
        if v is None:
            g = self.gamma
            v = SimpleNamespace(reach=self.reach[:bs], echoed=self.echoed[:bs], cond=self.cond[:bs],
                                sv=self.survival[:bs], raw=self.raw[:bs], pm=self._pm[:bs], pr=self._pr[:bs],
                                p=self._p[:bs], tok=self._tok[:bs], at=self._at[:bs], has=self._has[:bs],
                                cols=self._cols[:, :g], prev=self._prev[:bs], echoed_g=self.echoed[:bs, :g],
                                pm_g=self._pm[:bs, :g])
            if self.points:
                v.pmatch, v.pat = self._pmatch[:bs], self._pat[:bs]
            self._step_views[bs] = v
        return v

    def start(self, bs: int, tail_len: Optional[torch.Tensor] = None) -> None:
        """A step's reach starts at ``gamma`` where the tail's lookup after the whole model chain (``tail_len
        [bs]``, its draft lengths) matched, else 0."""
        v = self._step_rows(bs)
        if tail_len is None:
            v.reach.zero_()
            return
        torch.gt(tail_len, self._zero, out=v.has)
        torch.where(v.has, self._gamma, self._zero, out=v.reach)

    def note(self, matched: torch.Tensor, k: torch.Tensor) -> None:
        """A splice lookup after ``model[:k]`` (``k [bs]``) matched where ``matched [bs]``: the reach is at least k."""
        v = self._step_rows(matched.shape[0])
        torch.where(matched, k, self._zero, out=v.at)
        torch.maximum(v.reach, v.at, out=v.reach)

    def probe(self, history, slots: torch.Tensor, model: torch.Tensor) -> None:
        """The probes' test on ``history ++ model[:k]`` for every probe point at once (``history`` a
        ``TokenHistory``, unchanged; ``TokenHistory.probe_after``, one launch; ``model [bs, gamma]`` int32):
        where it matches, the reach is at least ``k``. Call after ``start``."""
        if not self.points:
            return
        v = self._step_rows(model.shape[0])
        history.probe_after(slots, model, self._points, v.pmatch, self._probe_n, self._probe_window)
        torch.mul(v.pmatch, self._points, out=v.pat)  # k where matched, else 0
        torch.amax(v.pat, 1, out=v.at)
        torch.maximum(v.reach, v.at, out=v.reach)

    def lift_model(self, survival: torch.Tensor) -> torch.Tensor:
        """The model chain's survivals ``[bs, width]`` as the selection sees them, lifted (``self.survival`` rows)."""
        v = self._step_rows(survival.shape[0])
        return self.lift(survival, v.reach, v.sv, v.pm)

    def lift_raw(self, model_surv: torch.Tensor) -> torch.Tensor:
        """The drafter's own survivals ``[bs, gamma]`` (a splice's prefix price), lifted (``self.raw`` rows)."""
        v = self._step_rows(model_surv.shape[0])
        return self.lift(model_surv, v.reach, v.raw, v.pr)

    def finish(self, tokens: torch.Tensor, survival: torch.Tensor, after: Optional[torch.Tensor] = None,
               spliced: Optional[torch.Tensor] = None) -> None:
        """The kept chain ``tokens`` / ``survival [bs, width]``: its lifted columns (``echoed``; before a splice
        point ``after [bs, width]`` where ``spliced [bs]``), their estimates before the lift (the drafter's own in
        a spliced row) for ``score``, and its conditionals after the lift (``cond``, what DSpark's planner reads
        on the echoed columns)."""
        bs, w = tokens.shape
        v = self._step_rows(bs)
        torch.lt(self._cols[:, :w], v.reach.view(-1, 1), out=v.echoed)
        if after is not None:  # after is flipped in place and back (a logical_not would allocate)
            v.echoed.logical_and_(after.logical_not_())
            after.logical_not_()
        v.tok.copy_(tokens[:, : self.gamma])
        if spliced is not None:
            torch.where(spliced.view(-1, 1), v.pr, v.pm_g, out=v.p)
        else:
            v.p.copy_(v.pm_g)
        conditional(survival, v.prev, v.cond)

    def score(self, committed: torch.Tensor, counts: torch.Tensor) -> None:
        """After verify: ``update`` with this step's lifted tokens of the kept chain; ``R`` is then copied to the
        host without a wait (``host_ratio``)."""
        v = self._step_rows(committed.shape[0])
        self.update(v.tok, v.echoed_g, v.p, committed, counts)
        self._host_ratio.copy_(self.ratio().view(1), non_blocking=True)

    def host_ratio(self) -> float:
        """``R`` as of a recent ``score`` (at most one step stale on a GPU), read on the host without a sync."""
        return float(self._host_ratio[0])


def probe_points(gamma: int, count: int, taken: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The ``count`` probe points just before the model chain's end (``k = gamma - count .. gamma - 1``, at least
    1), less those in ``taken`` (the splices' points, whose own lookups extend the reach)."""
    if count < 0:
        raise ValueError(f"echo_probes: must be >= 0 (0 = off), got {count}")
    return tuple(k for k in range(max(1, gamma - count), gamma) if k not in taken)


def make_step_echo(on: bool, *, tail: bool, splice_points: tuple[int, ...] = (), probes: int = 0,
                   lookup_cfg: Optional[NgramConfig] = None, max_bs: int, gamma: int, width: int, device,
                   strength: float = DEFAULT_STRENGTH) -> Optional[ModelEcho]:
    """The step's ``ModelEcho`` (``None`` when off, or with no lookup after the model chain to echo it: neither
    the tail, nor splices (``splice_points``), nor probes). ``probes``: option ``echo_probes``, the probe points
    just before the chain's end less the splices' (``probe_points``). Shared by ``HybridStep`` and the
    simulator's ``HybridPolicy``."""
    points = probe_points(gamma, probes, splice_points)
    if not on or not (tail or splice_points or points):
        return None
    return ModelEcho(max_bs, gamma, width, device, strength=strength, points=points, lookup_cfg=lookup_cfg)
