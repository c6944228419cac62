"""Online per-request recalibration of the n-gram drafts' acceptance estimates.

The shipped calibration table predicts, for each n-gram draft token j, the conditional acceptance ``q_j`` (token
j accepted given tokens 0..j-1 were) from features of the match. It is fit on other traffic; a given request
copies more (an edit that keeps most of the file) or less (an answer that only quotes a few names) than the
table's average. Each request therefore keeps its own record of how its n-gram drafts fared, by position j:

* ``E[slot, j]``: the sum of ``q_j (1 - y_j)`` over the drafts whose token j was *tried* (tokens 0..j-1
  matched what the target produced, and the target produced at least j + 1 tokens that step), ``y_j`` = 1 if
  token j matched: the probability the table put on the tokens that failed;
* ``O[slot, j]``: the sum of ``(1 - q_j) y_j``: the probability it denied the tokens that were accepted.

For a calibrated table both have the same expectation; ``O / E`` is the Mantel-Haenszel estimate of the odds
ratio between the request's outcomes and the table's predictions, and the correction is applied to the odds
(``odds(q') = odds(q) r``: a shift of the logit), which keeps the table's ranking of drafts. (Scaling ``q``
itself by observed / predicted does not: a request with many poor drafts would drag its good ones down with
them, and long chains were then never taken.)

Every n-gram draft is scored, chosen or not: after verify, the tokens the target committed (accepted drafts and
the bonus) are known, and an n-gram draft's token j is tried iff ``j < min(draft length, committed length)`` and
its tokens 0..j-1 equal the committed ones. So a request whose n-gram chains the selection never takes still
corrects an under-estimate.

Shrinkage (ratio estimates with a prior, three levels), with prior strength ``s`` (in units of the sums above):

* the traffic: ``g_j = (GO_j + s G) / (GE_j + s)`` with ``G = (sum_j GO_j + s) / (sum_j GE_j + s)``, from the
  same record summed over every request, decayed by ``global_decay`` per request-step (it follows the traffic: a
  chat-heavy hour, a code-heavy one). Positions rarely tried (at large batches a model-chain step scores only
  the first one or two tokens of an n-gram draft) borrow the ratio of the positions that were;
* the request: ``R = (sum_j O_j + s) / (sum_j E_j g_j + s)``, how this request deviates from the traffic;
* the position: ``r_j = (O_j + s R g_j) / (E_j + s)``.

The recalibrated estimate is ``q'_j = q_j r_j / (1 + q_j (r_j - 1))`` (odds times ``r_j``), and the survivals
are multiplied by the running product of ``q'_j / q_j``. With no evidence (``E = O = GE = GO = 0``) every ratio is exactly 1, so ``q'`` and
the survivals equal the table's bit for bit. As a request's evidence accumulates ``r_j -> O_j / E_j``, its own
observed/predicted ratio at position j; before it has any, ``r_j = g_j``.

Decode-step rules: ``apply`` and ``update`` never read the device, never allocate (every op writes into
buffers made at construction for the largest batch) and never branch on device data. ``reset`` runs at
prefill. ``OnlineCalibrationRef`` below is the plain-Python definition the tests compare against. With the
Triton backend (``"auto"`` on CUDA) ``apply`` and ``update`` each run as one launch (``online_kernel.py``) and the
deferred scoring as another (``deferred_kernel.py``), in place of the torch ops below.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..backend import resolve_backend
from .deferred import DEFAULT_DEPTH, DeferredScoring, bin_index, bin_sums

DEFAULT_STRENGTH = 2.0
# Per request-step (one request's draft scored in one decode step): the traffic-level records remember about the
# last 8192 request-steps whatever the batch size (a step of b requests decays them by DEFAULT_GLOBAL_DECAY ** b).
# Per decode step instead (0.999 before), a batch of 128 remembered 32 times more requests than a batch of 4 and
# trailed the traffic: chat at batch 128 was estimated 7% low. 4096 and 16384 request-steps gave +4% and -3%.
DEFAULT_GLOBAL_DECAY = 1.0 - 1.0 / 8192


class OnlineCalibration:
    """Per-slot accepted-vs-predicted records and the recalibration they drive (see the module docstring).

    Args:
        num_slots: request-pool slots (rows of the record).
        max_bs: largest batch of one ``apply`` / ``update``.
        width: ``L``, the longest n-gram chain (columns of ``q``).
        strength: prior strength ``s`` > 0 (larger: the table is trusted longer).
        defer: 0: ``update`` scores each draft against its own step's commit; ``D`` > 0: drafts are scored
            against the history as it arrives, kept open up to ``D`` steps (``deferred.py``), with
            ``apply(..., start=)`` and ``update_from_history`` in place of ``update``.
        backend: ``"triton"``: ``apply`` and the deferred scoring run as Triton kernels (``online_kernel.py``,
            ``deferred_kernel.py``); ``"torch"``: as torch ops; ``"auto"``: Triton on CUDA, torch elsewhere.
        bins: ``K`` > 0: a second, traffic-level stage by the recalibrated estimate's value (``K`` equal bins of
            ``q'`` in [0, 1]): ``q'' = odds(q') * (BO_k + s) / (BE_k + s)`` from the same sums as ``E`` / ``O``
            but scored with ``q'`` and kept per bin (decayed like the traffic level). The first stage fixes the
            level by position and request and keeps the table's spread; where the table is over-confident
            (its 0.9s are 0.82s and its 0.2s are 0.35s, as on chat) the bins correct the spread. 0 = off.
    """

    def __init__(self, num_slots: int, max_bs: int, width: int, device: torch.device | str,
                 strength: float = DEFAULT_STRENGTH, global_decay: float = DEFAULT_GLOBAL_DECAY,
                 defer: int = 0, bins: int = 0, backend: str = "auto") -> None:
        if not strength > 0:
            raise ValueError(f"online calibration strength: must be > 0, got {strength}")
        if not 0.0 <= global_decay <= 1.0:
            raise ValueError(f"online calibration global_decay: must be in [0, 1], got {global_decay}")
        if num_slots < 1 or max_bs < 1 or width < 1:
            raise ValueError(f"online calibration: num_slots, max_bs and width must be >= 1, "
                             f"got {num_slots}, {max_bs}, {width}")
        self.device = torch.device(device)
        self.backend = resolve_backend(backend, self.device)
        self._apply_kernel = None  # apply as one Triton launch (online_kernel.py); None: the torch ops below
        self._update_elems = self._update_elems_torch
        if self.backend == "triton":
            from .online_kernel import online_apply_triton, online_update_triton

            self._apply_kernel = online_apply_triton
            self._update_elems = online_update_triton
        self.strength = float(strength)
        self.width = width
        f32 = dict(dtype=torch.float32, device=self.device)
        self.expected = torch.zeros(num_slots, width, **f32)  # E: sum q (1 - y) over tried tokens
        self.observed = torch.zeros(num_slots, width, **f32)  # O: sum (1 - q) y
        self.global_expected = torch.zeros(width, **f32)  # GE
        self.global_observed = torch.zeros(width, **f32)  # GO
        self._g = torch.zeros(width, **f32)
        self._gtmp = torch.zeros(width, **f32)
        self._gsum = torch.zeros(2, **f32)
        # The decay of one step of b requests, global_decay ** b, for every batch size (indexed by the host-known b).
        self._decay_by_bs = torch.tensor([float(global_decay) ** b for b in range(max_bs + 1)], **f32)
        # This step's drafts as the table scored them (kept until ``update``).
        self._q = torch.zeros(max_bs, width, **f32)
        self._tok = torch.zeros(max_bs, width, dtype=torch.int32, device=self.device)
        self._len = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self._slots = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        # Scratch.
        self._e = torch.zeros(max_bs, width, **f32)
        self._o = torch.zeros(max_bs, width, **f32)
        self._r = torch.zeros(max_bs, width, **f32)
        self._f = torch.zeros(max_bs, width, **f32)
        self._es = torch.zeros(max_bs, 1, **f32)
        self._os = torch.zeros(max_bs, 1, **f32)
        self._match = torch.zeros(max_bs, width, **f32)
        self._pref = torch.zeros(max_bs, width + 1, **f32)
        self._lim = torch.zeros(max_bs, 1, dtype=torch.int64, device=self.device)
        self._in = torch.zeros(max_bs, width, dtype=torch.bool, device=self.device)
        self._inf = torch.zeros(max_bs, width, **f32)
        self._cmt = torch.zeros(max_bs, width, dtype=torch.int32, device=self.device)
        self._clen = torch.zeros(max_bs, 1, dtype=torch.int64, device=self.device)
        self._s = torch.tensor(self.strength, **f32)  # a Python scalar in an op would be wrapped each call
        self._one = torch.ones((), **f32)
        self._col = torch.arange(width, dtype=torch.int64, device=self.device).view(1, width)
        if defer < 0:
            raise ValueError(f"online calibration defer: must be >= 0, got {defer}")
        if bins < 0:
            raise ValueError(f"online calibration bins: must be >= 0, got {bins}")
        self.bins = int(bins)
        self.deferred = DeferredScoring(num_slots, max_bs, width, defer, self.device, bins=self.bins,
                                        backend=backend) \
            if defer else None
        K = max(self.bins, 1)
        KL = K * width  # cells: position j, bin k of q' (position-major), so the bins correct the spread within a
        # position and never pull one position's level towards another's
        self.bin_expected = torch.zeros(KL, **f32)  # BE: sum q' (1 - y) over tried tokens, by bin of q'
        self.bin_observed = torch.zeros(KL, **f32)  # BO: sum (1 - q') y
        self._bin_ratio = torch.zeros(KL, **f32)
        self._bin_tmp = torch.zeros(KL, **f32)
        self._bin_e = torch.zeros(KL, **f32)
        self._bin_o = torch.zeros(KL, **f32)
        self._coloff = torch.arange(width, dtype=torch.int64, device=self.device).view(1, width) * K
        self._q1 = torch.zeros(max_bs, width, **f32)  # this step's first-stage estimates q'
        self._fb = torch.zeros(max_bs, width, **f32)  # update's evidence scored with q' (bins)
        self._ob = torch.zeros(max_bs, width, **f32)
        self._bidx = torch.zeros(max_bs, width, dtype=torch.int64, device=self.device)
        self._rb = torch.zeros(max_bs, width, **f32)
        self._kf = torch.tensor(float(K), **f32)
        self._kmax = torch.tensor(K - 1, dtype=torch.int64, device=self.device)
        self._zero_i = torch.zeros((), dtype=torch.int64, device=self.device)
        self._start = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self._gs_o, self._gs_e = self._gsum[:1], self._gsum[1:]
        self._view_cache: dict[tuple[int, int], SimpleNamespace] = {}

    def _views(self, bs: int, k: int = 0) -> SimpleNamespace:
        """Every ``[:bs]`` slice (and ``[:, :k]`` sub-slice, ``k`` the committed width of ``update``) that
        ``apply`` / ``update`` use, made once per shape: each slice is a Python-level op, which an eagerly
        launched step pays on every call (``scripts/count_step_ops.py``)."""
        v = self._view_cache.get((bs, k))
        if v is not None:
            return v
        v = SimpleNamespace()
        for name in ("q", "tok", "len", "slots", "e", "o", "r", "f", "es", "os", "match", "pref", "lim", "inf",
                     "clen", "q1", "bidx", "rb", "start", "fb", "ob"):
            setattr(v, name, getattr(self, "_" + name)[:bs])
        v.inside = self._in[:bs]
        v.len_col = v.len.view(-1, 1)
        v.cmt, v.tok_k, v.inside_k, v.match_k = self._cmt[:bs, :k], v.tok[:, :k], v.inside[:, :k], v.match[:, :k]
        v.inside_rest = v.inside[:, k:]
        v.pref0, v.pref_rest, v.pref_l = v.pref[:, :1], v.pref[:, 1:], v.pref[:, : self.width]
        v.bidx_flat, v.rb_flat, v.fb_flat, v.ob_flat = v.bidx.view(-1), v.rb.view(-1), v.fb.view(-1), v.ob.view(-1)
        self._view_cache[(bs, k)] = v
        return v

    def reset(self, slots: torch.Tensor) -> None:
        """Forget the records of ``slots`` (at prefill: a new request starts with no evidence)."""
        s = slots.to(torch.int64)
        self.expected.index_fill_(0, s, 0.0)
        self.observed.index_fill_(0, s, 0.0)
        if self.deferred is not None:
            self.deferred.reset(s)

    def apply(self, slots: torch.Tensor, tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor,
              survival: torch.Tensor, start: torch.Tensor | None = None) -> None:
        """Recalibrate in place ``q [bs, L]`` and ``survival [bs, L]`` (the table's, from ``DeviceCalibration``).

        ``tokens [bs, L]`` / ``length [bs]``: the n-gram drafts (kept, with the table's ``q``, for ``update``).
        ``start [bs]``: with ``defer``, each slot's history length now (the position of draft token 0).
        """
        bs, L = q.shape
        if L != self.width:
            raise ValueError(f"online calibration: q has {L} columns, the record {self.width}")
        v = self._views(bs)
        if self.deferred is not None:
            if start is None:
                raise ValueError("online calibration with defer > 0: apply needs start= (history lengths)")
            v.start.copy_(start)
        if self._apply_kernel is not None:
            self._apply_kernel(self.expected, self.observed, self.global_expected, self.global_observed,
                               self.bin_expected, self.bin_observed, self.strength, slots, tokens, length, q,
                               survival, v.slots, v.tok, v.len, v.q, v.q1, v.bidx, self.bins)
            return
        s = v.slots
        s.copy_(slots)  # int32 or int64 slots, no allocation
        v.q.copy_(q)
        v.tok.copy_(tokens)
        v.len.copy_(length)
        e, o, r, f = v.e, v.o, v.r, v.f
        es, os_ = v.es, v.os
        torch.index_select(self.expected, 0, s, out=e)
        torch.index_select(self.observed, 0, s, out=o)
        sv, g, gs, gs_o, gs_e = self._s, self._g, self._gsum, self._gs_o, self._gs_e
        torch.sum(self.global_observed, 0, keepdim=True, out=gs_o)
        torch.sum(self.global_expected, 0, keepdim=True, out=gs_e)
        gs.add_(sv)
        gs_o.div_(gs_e)  # G = (sum GO + s) / (sum GE + s), the traffic's ratio over all positions
        gs_o.mul_(sv)
        torch.add(self.global_observed, gs_o, out=g)
        torch.add(self.global_expected, sv, out=self._gtmp)
        g.div_(self._gtmp)  # g_j = (GO_j + s G) / (GE_j + s), the traffic-level ratio at position j
        torch.sum(o, 1, keepdim=True, out=os_)
        os_.add_(sv)
        torch.mul(e, g, out=r)
        torch.sum(r, 1, keepdim=True, out=es)
        es.add_(sv)
        os_.div_(es)  # R = (sum O + s) / (sum E g + s), the request-level ratio
        os_.mul_(sv)
        torch.mul(os_, g, out=r)
        r.add_(o)
        e.add_(sv)
        r.div_(e)  # r_j = (O_j + s R g_j) / (E_j + s)
        torch.sub(r, self._one, out=f)  # q' = q r / (1 + q (r - 1)): the factor is r / (1 + q (r - 1))
        f.mul_(q)
        f.add_(self._one)
        torch.div(r, f, out=f)  # exactly 1 where r == 1
        q.mul_(f)
        if self.bins:  # second stage: the odds of q' times its bin's ratio
            bidx, rb, kb = v.bidx, v.rb, self._bin_ratio
            v.q1.copy_(q)
            bin_index(q, self._kf, self._zero_i, self._kmax, rb, bidx, self._coloff)
            torch.add(self.bin_observed, sv, out=kb)
            torch.add(self.bin_expected, sv, out=self._bin_tmp)
            kb.div_(self._bin_tmp)  # (BO_k + s) / (BE_k + s): exactly 1 with no evidence
            torch.index_select(kb, 0, v.bidx_flat, out=v.rb_flat)
            torch.sub(rb, self._one, out=r)
            r.mul_(q).add_(self._one)
            rb.div_(r)  # the second factor, exactly 1 where the ratio is 1
            q.mul_(rb)
            f.mul_(rb)
        torch.cumprod(f, 1, out=r)
        survival.mul_(r)

    def update(self, slots: torch.Tensor, committed: torch.Tensor, commit_len: torch.Tensor) -> None:
        """After verify: score this step's n-gram drafts against ``committed[b, :commit_len[b]]``.

        ``committed [bs, K]``: the tokens the target produced (accepted drafts, then the bonus token).
        """
        bs = committed.shape[0]
        v = self._views(bs, min(self.width, committed.shape[1]))
        self._update_elems(slots, v.tok, v.len, v.q, v.q1, committed, commit_len, v.slots, v.e, v.o, v.fb, v.ob,
                           self.bins)
        if self.bins:
            bin_sums(v.bidx_flat, v.fb_flat, v.ob_flat, self._bin_e, self._bin_o)
        self._add(v.slots, v.e, v.o)

    def _update_elems_torch(self, slots: torch.Tensor, tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor,
                            q1: torch.Tensor, committed: torch.Tensor, commit_len: torch.Tensor,
                            keep_slots: torch.Tensor, tried: torch.Tensor, ok: torch.Tensor, fb: torch.Tensor,
                            ob: torch.Tensor, bins: int) -> None:
        """Plain-torch reference of ``online_kernel.online_update_triton`` (same signature, same writes): each
        kept draft token's evidence, ``q`` on the failed token and ``1 - q`` on the accepted ones (``tried`` /
        ``ok``), with bins the same with ``q1`` (``fb`` / ``ob``). ``tokens`` / ``length`` / ``q`` / ``q1`` are this
        record's kept rows, read through the cached views."""
        bs = committed.shape[0]
        L = self.width
        k = min(L, committed.shape[1])
        v = self._views(bs, k)
        if tokens is not v.tok or q is not v.q:
            raise ValueError("online calibration: the torch update scores its own kept drafts")
        s = keep_slots
        s.copy_(slots)
        match, lim, inside = v.match, v.lim, v.inside
        match.zero_()
        cmt, clen, inside_f = v.cmt, v.clen, v.inf
        cmt.copy_(committed[:, :k])  # copy_ converts the dtype in place (an op on mixed dtypes would allocate)
        clen.copy_(commit_len.view(-1, 1))
        torch.eq(v.tok_k, cmt, out=v.inside_k)
        v.match_k.copy_(v.inside_k)
        # lim = min(draft length, committed length): token j is scored iff j < lim and tokens 0..j-1 matched.
        torch.minimum(v.len_col, clen, out=lim)
        torch.lt(self._col, lim, out=inside)
        if k < L:  # the committed row is shorter than the chain (host-known shape)
            v.inside_rest.fill_(False)
        inside_f.copy_(inside)
        v.pref0.copy_(self._one)
        torch.cumprod(match, 1, out=v.pref_rest)  # pref[:, j] = tokens 0..j-1 all matched
        torch.mul(v.pref_l, inside_f, out=tried)
        torch.mul(v.pref_rest, inside_f, out=ok)
        tried.sub_(ok)  # 1 at the failed token
        if bins:  # scored with q1 for the bins: q1 on the failed token, (1 - q1) on the accepted ones
            torch.mul(tried, q1, out=fb)
            torch.sub(self._one, q1, out=ob)
            ob.mul_(ok)
        tried.mul_(q)  # q (1 - y) over tried tokens
        torch.sub(self._one, q, out=v.r)
        ok.mul_(v.r)  # (1 - q) y

    def update_from_history(self, slots: torch.Tensor, hist_tokens: torch.Tensor, hist_lens: torch.Tensor) -> None:
        """After verify and the history append (``defer`` > 0): score every draft the history now settles.

        ``hist_tokens [num_slots, W]`` / ``hist_lens [num_slots]``: ``TokenHistory.tokens`` / ``.lens``."""
        if self.deferred is None:
            raise ValueError("online calibration: update_from_history needs defer > 0")
        v = self._views(slots.shape[0])
        s = v.slots
        s.copy_(slots)
        tried, ok = v.e, v.o
        self.deferred.score(s, v.tok, v.len, v.q, v.start, hist_tokens, hist_lens, tried, ok,
                            q1=v.q1 if self.bins else None, bin_tried_out=self._bin_e, bin_ok_out=self._bin_o)
        self._add(s, tried, ok)

    def _add(self, s: torch.Tensor, tried: torch.Tensor, ok: torch.Tensor) -> None:
        """Add one step's evidence ``[bs, L]`` to the slots' records and (decayed) to the traffic's."""
        decay = self._decay_by_bs[tried.shape[0]]  # a view: no allocation
        self.expected.index_add_(0, s, tried)
        self.observed.index_add_(0, s, ok)
        if self.bins:
            for glob, rec in ((self.bin_expected, self._bin_e), (self.bin_observed, self._bin_o)):
                glob.mul_(decay)
                glob.add_(rec)
        for glob, rec in ((self.global_expected, tried), (self.global_observed, ok)):
            glob.mul_(decay)
            torch.sum(rec, 0, out=self._gtmp)
            glob.add_(self._gtmp)


class OnlineCalibrationRef:
    """Plain-Python definition of :class:`OnlineCalibration` (lists of floats; for the tests)."""

    def __init__(self, num_slots: int, width: int, strength: float = DEFAULT_STRENGTH,
                 global_decay: float = DEFAULT_GLOBAL_DECAY, bins: int = 0) -> None:
        self.s = float(strength)
        self.decay = float(global_decay)
        self.width = width
        self.bins = bins
        self.E = [[0.0] * width for _ in range(num_slots)]
        self.O = [[0.0] * width for _ in range(num_slots)]
        self.GE = [0.0] * width
        self.GO = [0.0] * width
        self.BE = [0.0] * (max(bins, 1) * width)
        self.BO = [0.0] * (max(bins, 1) * width)
        self.pending: dict[int, tuple[list[int], int, list[float], list[float]]] = {}

    def reset(self, slot: int) -> None:
        self.E[slot] = [0.0] * self.width
        self.O[slot] = [0.0] * self.width

    def bin_of(self, j: int, x: float) -> int:
        return j * self.bins + min(max(int(x * self.bins // 1), 0), self.bins - 1)

    def apply(self, slot: int, tokens: list[int], length: int, q: list[float]) -> tuple[list[float], list[float]]:
        """(recalibrated q, survivals) for one request's draft; the survivals are the table's running product
        of ``q`` times the running product of the factors ``q'_j / q_j``. ``self.q1[slot]``: the first stage's."""
        E, O, s = self.E[slot], self.O[slot], self.s
        G = (sum(self.GO) + s) / (sum(self.GE) + s)
        g = [(go + s * G) / (ge + s) for go, ge in zip(self.GO, self.GE)]
        R = (sum(O) + s) / (sum(e * gj for e, gj in zip(E, g)) + s)
        q_new, q1, surv, base, fac = [], [], [], 1.0, 1.0
        for j, qj in enumerate(q):
            r = (O[j] + s * R * g[j]) / (E[j] + s)
            f = r / (1.0 + qj * (r - 1.0))
            q1j = qj * f
            q1.append(q1j)
            if self.bins:
                k = self.bin_of(j, q1j)
                rb = (self.BO[k] + s) / (self.BE[k] + s)
                f2 = rb / (1.0 + q1j * (rb - 1.0))
                f *= f2
            q_new.append(qj * f if not self.bins else q1j * f2)
            base *= qj
            fac *= f
            surv.append(base * fac)
        self.pending[slot] = (list(tokens), int(length), list(q), q1)
        return q_new, surv

    def update(self, committed_by_slot: dict[int, list[int]]) -> None:
        """One step's verify results: ``{slot: committed tokens}`` for every slot ``apply`` saw this step."""
        evidence = {}
        bt, bo = [0.0] * (max(self.bins, 1) * self.width), [0.0] * (max(self.bins, 1) * self.width)
        for slot, committed in committed_by_slot.items():
            tokens, length, q, q1 = self.pending.pop(slot)
            tried, ok = [0.0] * self.width, [0.0] * self.width
            for j in range(min(length, len(committed), self.width)):
                if tokens[j] != committed[j]:
                    tried[j] = q[j]
                    if self.bins:
                        bt[self.bin_of(j, q1[j])] += q1[j]
                    break
                ok[j] = 1.0 - q[j]
                if self.bins:
                    bo[self.bin_of(j, q1[j])] += 1.0 - q1[j]
            evidence[slot] = (tried, ok)
        self.add_evidence(evidence, (bt, bo) if self.bins else None)

    def add_evidence(self, evidence_by_slot: dict[int, tuple[list[float], list[float]]],
                     bin_evidence: tuple[list[float], list[float]] | None = None) -> None:
        """One step's evidence ``{slot: (q (1 - y) by position, (1 - q) y by position)}``, and with bins the
        step's ``(sum q' (1 - y), sum (1 - q') y)`` by bin."""
        tried_sum, ok_sum = [0.0] * self.width, [0.0] * self.width
        for slot, (tried, ok) in evidence_by_slot.items():
            self.pending.pop(slot, None)
            for j in range(self.width):
                self.E[slot][j] += tried[j]
                self.O[slot][j] += ok[j]
                tried_sum[j] += tried[j]
                ok_sum[j] += ok[j]
        decay = self.decay ** len(evidence_by_slot)  # per request-step
        self.GE = [decay * a + b for a, b in zip(self.GE, tried_sum)]
        self.GO = [decay * a + b for a, b in zip(self.GO, ok_sum)]
        if self.bins and bin_evidence is not None:
            self.BE = [decay * a + b for a, b in zip(self.BE, bin_evidence[0])]
            self.BO = [decay * a + b for a, b in zip(self.BO, bin_evidence[1])]
