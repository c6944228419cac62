"""Deferred scoring of n-gram drafts: each draft is scored against the committed history as it arrives.

``OnlineCalibration.update`` scores a draft against one step's commit (accepted tokens + bonus): draft token j
counts as *tried* only if ``j < commit length``. When the step verified the model chain, the commit is long
exactly where the text is predictable, so the deep positions of an n-gram draft are tried mostly in easy
contexts: the record over-states their acceptance, and more so at large batches, where the commits are short
(in the simulator's chat replay the estimate came out 13% high at batch 32 and 19% at batch 128).

Here each slot keeps its last ``depth`` drafts in a small ring (tokens, the table's ``q``, the history position
of token 0, the length, how many leading tokens are scored). After every append the ring is compared with the
history, and each draft token is scored once, at the step the history reaches it, exactly as ``update`` scores
one (``q_j (1 - y_j)`` for the failed token, ``(1 - q_j) y_j`` for the accepted ones). A draft is dropped once a
token disagrees or the history covers it; after ``depth`` steps an open draft's entry goes to a new draft (the
tokens it had compared stay scored; the rest are never tried). Scoring each token as soon as it is known, rather
than when the draft settles, matters: failures settle at once and successes only later, so a record that waited
for the outcome would lag behind on successes and under-state acceptance. At small batch (long commits) a draft
is settled within its own step, and this gives the same evidence as ``update``.

Fixed shapes, no host reads, no allocation per step: every op writes into buffers made at construction for the
largest batch. ``DeferredScoringRef`` is the plain-Python definition the tests compare against. With the Triton
backend the per-token work of ``score`` is one launch (``deferred_kernel.py``), bit for bit the torch path's.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..backend import resolve_backend

DEFAULT_DEPTH = 8  # drafts kept per slot: at large batch ~1.5 tokens commit per step, so 8 steps cover ~12


class DeferredScoring:
    """Per-slot rings of pending n-gram drafts, scored against a ``TokenHistory``-layout ring buffer.

    Args:
        num_slots: request-pool slots. max_bs: largest batch of one ``score``. width: ``L``, the longest draft.
        depth: ``D`` >= 1, drafts kept open per slot.
    """

    def __init__(self, num_slots: int, max_bs: int, width: int, depth: int, device: torch.device | str,
                 bins: int = 0, backend: str = "auto") -> None:
        if depth < 1:
            raise ValueError(f"deferred scoring depth: must be >= 1, got {depth}")
        dev = torch.device(device)
        self.backend = resolve_backend(backend, dev)
        self.depth, self.width, self.bins = depth, width, int(bins)
        D, L, D1 = depth, width, depth + 1
        i32, i64, f32 = (dict(dtype=t, device=dev) for t in (torch.int32, torch.int64, torch.float32))
        self.tok = torch.zeros(num_slots, D, L, **i32)
        self.q = torch.zeros(num_slots, D, L, **f32)
        self.start = torch.zeros(num_slots, D, **i64)  # history position of token 0
        self.length = torch.zeros(num_slots, D, **i64)  # 0 = free
        # With bins: the first-stage estimates q' too (the online calibration's second stage bins by them).
        Dq = D if bins else 1
        self.q1 = torch.zeros(num_slots if bins else 1, Dq, L, **f32)
        self._q1 = torch.zeros(max_bs, D1 if bins else 1, L, **f32)
        self._rq1 = torch.zeros(max_bs, Dq, L, **f32)
        self._bidx = torch.zeros(max_bs, D1 if bins else 1, L, **i64)
        self._s1 = torch.zeros(max_bs, D1 if bins else 1, L, **f32)
        self._s2 = torch.zeros(max_bs, D1 if bins else 1, L, **f32)
        self._s3 = torch.zeros(max_bs, D1 if bins else 1, L, **f32)
        self._kf = torch.tensor(float(max(bins, 1)), **f32)
        self._kmax = torch.tensor(max(bins, 1) - 1, **i64)
        self._zero_i = torch.zeros((), **i64)
        self._coloff = torch.arange(L, **i64).view(1, 1, L) * max(bins, 1)
        self.done = torch.zeros(num_slots, D, **i64)  # leading tokens already scored (all of them matched)
        self.ptr = torch.zeros(num_slots, **i64)  # the entry the next draft takes
        self.rings = (self.tok, self.q, self.start, self.length, self.done, self.q1, self.ptr)
        # Each draft token's evidence (entries D + 1, positions L), reduced by ``_reduce``; with bins, its cell.
        self._fail_c = torch.zeros(max_bs, D1, L, **f32)
        self._ok_c = torch.zeros(max_bs, D1, L, **f32)
        self._bfail_c = torch.zeros(max_bs, D1 if bins else 1, L, **f32)
        self._bok_c = torch.zeros(max_bs, D1 if bins else 1, L, **f32)
        self._elems = self._elems_torch
        if self.backend == "triton":
            from .deferred_kernel import deferred_score_triton

            self._elems = deferred_score_triton
        # Scratch: the slot's ring plus this step's draft as column D.
        self._tok = torch.zeros(max_bs, D1, L, **i32)
        self._q = torch.zeros(max_bs, D1, L, **f32)
        self._start = torch.zeros(max_bs, D1, **i64)
        self._len = torch.zeros(max_bs, D1, **i64)
        self._ptr = torch.zeros(max_bs, **i64)
        self._rtok = torch.zeros(max_bs, D, L, **i32)
        self._rq = torch.zeros(max_bs, D, L, **f32)
        self._rst = torch.zeros(max_bs, D, **i64)
        self._rln = torch.zeros(max_bs, D, **i64)
        self._rdone = torch.zeros(max_bs, D, **i64)
        self._done = torch.zeros(max_bs, D1, **i64)
        self._new = torch.zeros(max_bs, D1, L, dtype=torch.bool, device=dev)
        self._newf = torch.zeros(max_bs, D1, L, **f32)
        self._hl32 = torch.zeros(max_bs, **i32)
        self._hl64 = torch.zeros(max_bs, **i64)
        self._slots = torch.zeros(max_bs, **i64)
        self._hlen = torch.zeros(max_bs, 1, **i64)
        self._known = torch.zeros(max_bs, D1, **i64)
        self._lim = torch.zeros(max_bs, D1, 1, **i64)
        self._pos = torch.zeros(max_bs, D1, L, **i64)
        self._htok = torch.zeros(max_bs, D1, L, **i32)
        self._valid = torch.zeros(max_bs, D1, L, dtype=torch.bool, device=dev)
        self._eq = torch.zeros(max_bs, D1, L, dtype=torch.bool, device=dev)
        self._match = torch.zeros(max_bs, D1, L, **f32)
        self._pref = torch.zeros(max_bs, D1, L + 1, **f32)
        self._tried = torch.zeros(max_bs, D1, L, **f32)
        self._ok = torch.zeros(max_bs, D1, L, **f32)
        self._tmp = torch.zeros(max_bs, D1, L, **f32)
        self._det = torch.zeros(max_bs, D1, dtype=torch.bool, device=dev)
        self._b1 = torch.zeros(max_bs, D1, dtype=torch.bool, device=dev)
        self._fail = torch.zeros(max_bs, D1, **f32)
        self._ix = torch.zeros(max_bs, 1, L, **i64)
        self._ix2 = torch.zeros(max_bs, 1, **i64)
        self._lo = torch.zeros(max_bs, 1, **i64)
        self._base = torch.zeros(max_bs, **i64)
        self._w: dict[int, torch.Tensor] = {}  # the history ring's width as a tensor (made once per width)
        self._dev = dev
        self._one = torch.ones((), **f32)
        self._one_i = torch.ones((), **i64)
        self._depth_t = torch.full((), depth, **i64)
        self._half = torch.full((), 0.5, **f32)
        self._col = torch.arange(L, **i64).view(1, 1, L)
        self._view_cache: dict[int, SimpleNamespace] = {}

    def _ring_width(self, w: int) -> torch.Tensor:
        t = self._w.get(w)
        if t is None:
            t = self._w[w] = torch.tensor(w, dtype=torch.int64, device=self._dev)
        return t

    def reset(self, slots: torch.Tensor) -> None:
        """Drop the pending drafts of ``slots`` (a new request)."""
        s = slots.to(torch.int64)
        self.length.index_fill_(0, s, 0)
        self.ptr.index_fill_(0, s, 0)

    def _views(self, bs: int) -> SimpleNamespace:
        """Every ``[:bs]`` slice (and sub-slice) :meth:`score` uses, made once per batch size: a slice is a
        Python-level op, and the step pays for each one on every call when it is launched eagerly."""
        v = self._view_cache.get(bs)
        if v is not None:
            return v
        D, L = self.depth, self.width
        v = SimpleNamespace()
        for name in ("slots", "tok", "q", "start", "len", "done", "ptr", "hlen", "known", "lim", "pos", "valid",
                     "eq", "match", "pref", "tried", "ok", "tmp", "fail", "det", "b1", "newf", "new", "ix2", "ix",
                     "lo", "base", "htok", "hl32", "hl64", "rtok", "rq", "rst", "rln", "rdone", "q1", "rq1", "bidx",
                     "s1", "s2", "s3", "fail_c", "ok_c", "bfail_c", "bok_c"):
            setattr(v, name, getattr(self, "_" + name)[:bs])
        v.rings = ((self.tok, v.rtok), (self.q, v.rq), (self.start, v.rst), (self.length, v.rln),
                   (self.done, v.rdone))  # each ring with its gather buffer
        v.head = tuple(t[:, :D] for t in (v.tok, v.q, v.start, v.len, v.done))  # the ring part of each
        v.tail = tuple(t[:, D] for t in (v.tok, v.q, v.start, v.len, v.done))  # this step's draft (column D)
        v.new_cols = tuple(t[:, D:] for t in (v.tok, v.q, v.start, v.len, v.done))
        v.q1_head, v.q1_tail, v.q1_new = v.q1[:, :D], v.q1[:, D] if self.bins else None, v.q1[:, D:]
        v.hlen0, v.lim0 = v.hlen[:, 0], v.lim[..., 0]
        v.pref0, v.pref_rest, v.pref_l = v.pref[..., :1], v.pref[..., 1:], v.pref[..., :L]
        v.ptr_col, v.ix2_x = v.ptr.view(-1, 1), v.ix2.unsqueeze(2).expand(bs, 1, L)
        v.st3, v.lo3, v.done3 = v.start.unsqueeze(2), v.lo.unsqueeze(2), v.done.unsqueeze(2)
        v.base3, v.pos_flat, v.htok_flat = v.base.view(-1, 1, 1), v.pos.view(-1), v.htok.view(-1)
        v.bidx_flat, v.bfail_flat, v.bok_flat = v.bidx.reshape(-1), v.bfail_c.reshape(-1), v.bok_c.reshape(-1)
        self._view_cache[bs] = v
        return v

    def score(self, slots: torch.Tensor, tokens: torch.Tensor, length: torch.Tensor, q: torch.Tensor,
              start: torch.Tensor, hist_tokens: torch.Tensor, hist_lens: torch.Tensor,
              tried_out: torch.Tensor, ok_out: torch.Tensor, q1: torch.Tensor | None = None,
              bin_tried_out: torch.Tensor | None = None, bin_ok_out: torch.Tensor | None = None) -> None:
        """Add this step's drafts and score every newly compared token; writes the evidence ``[bs, L]`` per slot.

        ``tokens / length / q / start``: this step's drafts (``[bs, L]`` int32, ``[bs]``, ``[bs, L]``, ``[bs]``
        history position of token 0). ``hist_tokens [num_slots, W]`` int32 ring (position p at column p % W) and
        ``hist_lens [num_slots]``: the history *after* this step's append. ``tried_out`` / ``ok_out [bs, L]``:
        ``q_j (1 - y_j)`` on a failed token and ``(1 - q_j) y_j`` on an accepted one, summed over the newly compared.
        With ``bins``: ``q1 [bs, L]`` this step's first-stage estimates, and ``bin_tried_out`` / ``bin_ok_out
        [bins]`` the same sums scored with ``q1`` and gathered by the bin of ``q1``.
        """
        bs = tokens.shape[0]
        if self.bins and (q1 is None or bin_tried_out is None or bin_ok_out is None):
            raise ValueError("deferred scoring with bins: score needs q1, bin_tried_out and bin_ok_out")
        v = self._views(bs)
        self._elems(self.rings, slots, tokens, length, q, start, q1, hist_tokens, hist_lens, v.fail_c, v.ok_c,
                    v.bfail_c, v.bok_c, v.bidx, self.bins)
        self._reduce(v, tried_out, ok_out, bin_tried_out, bin_ok_out)

    def _reduce(self, v: SimpleNamespace, tried_out: torch.Tensor, ok_out: torch.Tensor,
                bin_tried_out: torch.Tensor | None, bin_ok_out: torch.Tensor | None) -> None:
        """The sums of both paths (same ops, so the same float order): over the ring, and with bins by cell."""
        torch.sum(v.fail_c, 1, out=tried_out)
        torch.sum(v.ok_c, 1, out=ok_out)
        if self.bins:
            bin_sums(v.bidx_flat, v.bfail_flat, v.bok_flat, bin_tried_out, bin_ok_out)

    def _elems_torch(self, rings: tuple, slots: torch.Tensor, tokens: torch.Tensor, length: torch.Tensor,
                     q: torch.Tensor, start: torch.Tensor, q1: torch.Tensor | None, hist_tokens: torch.Tensor,
                     hist_lens: torch.Tensor, fail_c: torch.Tensor, ok_c: torch.Tensor, bfail_c: torch.Tensor,
                     bok_c: torch.Tensor, bidx: torch.Tensor, bins: int) -> None:
        """Plain-torch reference of ``deferred_kernel.deferred_score_triton`` (same signature, same writes):
        ``fail_c`` / ``ok_c [bs, D + 1, L]`` each draft token's ``q (1 - y)`` / ``(1 - q) y`` where compared for
        the first time, else 0; with ``bins``, ``bfail_c`` / ``bok_c`` the same with ``q1`` and ``bidx`` its cell
        ``j bins + bin(q1)``; ``rings`` (``self.rings``, read through the cached views) updated in place."""
        if rings is not self.rings or bins != self.bins:
            raise ValueError("deferred scoring: the torch path scores its own rings")
        bs, L = tokens.shape
        W = hist_tokens.shape[1]
        v = self._views(bs)
        s = v.slots
        s.copy_(slots)
        tok, qq, st, ln, done = v.tok, v.q, v.start, v.len, v.done
        for (ring, rs), full in zip(v.rings, v.head):
            torch.index_select(ring, 0, s, out=rs)  # contiguous out: no resize, no temporary
            full.copy_(rs)
        for col, x in zip(v.tail, (tokens, q, start, length)):
            col.copy_(x)
        v.tail[4].fill_(0)
        if self.bins:
            q1g = v.q1
            torch.index_select(self.q1, 0, s, out=v.rq1)
            v.q1_head.copy_(v.rq1)
            v.q1_tail.copy_(q1)
        ptr = v.ptr
        torch.index_select(self.ptr, 0, s, out=ptr)
        # known = tokens of the history past each draft's start; a token is compared iff j < min(len, known)
        # and its position is still in the ring.
        hlen = v.hlen
        hl = v.hl32 if hist_lens.dtype == torch.int32 else v.hl64
        torch.index_select(hist_lens, 0, s, out=hl)
        v.hlen0.copy_(hl)
        known = v.known
        torch.sub(hlen, st, out=known)
        lim = v.lim
        torch.minimum(ln, known, out=v.lim0)
        pos, valid = v.pos, v.valid
        torch.add(v.st3, self._col, out=pos)
        torch.lt(self._col, lim, out=valid)
        w_t = self._ring_width(W)
        lo, base = v.lo, v.base
        torch.sub(hlen, w_t, out=lo)  # the oldest position the ring still holds
        torch.ge(pos, v.lo3, out=v.eq)
        valid.logical_and_(v.eq)
        pos.remainder_(w_t)
        torch.mul(s, w_t, out=base)
        pos.add_(v.base3)  # flat index into hist_tokens
        htok = v.htok
        torch.index_select(hist_tokens.view(-1), 0, v.pos_flat, out=v.htok_flat)
        eq = v.eq
        torch.eq(tok, htok, out=eq)
        eq.logical_and_(valid)
        match, pref, tried, ok = v.match, v.pref, v.tried, v.ok
        match.copy_(eq)
        v.pref0.fill_(1.0)
        torch.cumprod(match, 2, out=v.pref_rest)
        tmp = v.tmp
        tmp.copy_(valid)  # copy_ converts in place (a mixed-dtype op would allocate)
        torch.mul(v.pref_l, tmp, out=tried)  # tokens 0..j-1 matched and j compared
        ok.copy_(v.pref_rest)  # tokens 0..j matched (implies compared)
        # Determined: a compared token failed, or the history covers the whole draft.
        fail, det, b1 = v.fail, v.det, v.b1
        torch.sub(tried, ok, out=tmp)  # 1 at the first failed token
        torch.sum(tmp, 2, out=fail)
        torch.gt(fail, self._half, out=det)
        torch.ge(known, ln, out=b1)
        det.logical_or_(b1)
        # Evidence of the tokens compared for the first time (j >= done): each position is scored once, when the
        # history reaches it. A free entry (length 0) compares nothing.
        newf = v.newf
        torch.ge(self._col, v.done3, out=v.new)
        newf.copy_(v.new)
        if self.bins:
            f1, o1 = v.s1, v.s2
            torch.mul(tmp, newf, out=f1)
            torch.mul(ok, newf, out=o1)
            bin_index(q1g, self._kf, self._zero_i, self._kmax, v.s3, bidx, self._coloff)
            torch.mul(f1, q1g, out=bfail_c)  # q1 on the failed token, (1 - q1) on the accepted ones
            torch.sub(self._one, q1g, out=bok_c)
            bok_c.mul_(o1)
        torch.mul(tmp, qq, out=fail_c)  # q (1 - y) on the failed token
        fail_c.mul_(newf)
        torch.sub(self._one, qq, out=ok_c)
        ok_c.mul_(ok)
        ok_c.mul_(newf)
        # Drop the determined drafts, note how far the open ones are scored; the new draft (if open) takes entry
        # ptr, replacing the oldest (whose compared tokens are already scored); ptr advances.
        done.copy_(v.lim0)
        ln.masked_fill_(det, 0)
        ix2 = v.ix2
        ix2.copy_(v.ptr_col)
        ix = v.ix
        ix.copy_(v.ix2_x)
        for i, (part, new) in enumerate(zip(v.head, v.new_cols)):
            part.scatter_(1, ix if i < 2 else ix2, new)
        if self.bins:
            v.q1_head.scatter_(1, ix, v.q1_new)
            v.rq1.copy_(v.q1_head)
            self.q1.index_copy_(0, s, v.rq1)
        ptr.add_(self._one_i)
        ptr.remainder_(self._depth_t)
        for (ring, rs), part in zip(v.rings, v.head):
            rs.copy_(part)
            ring.index_copy_(0, s, rs)
        self.ptr.index_copy_(0, s, ptr)


def bin_index(q: torch.Tensor, k_f: torch.Tensor, zero_i: torch.Tensor, kmax: torch.Tensor, scratch: torch.Tensor,
              out: torch.Tensor, col_offset: torch.Tensor) -> None:
    """The cell of each token: ``j K + clamp(floor(q K), 0, K - 1)`` (int64; ``col_offset`` = ``j K`` along the
    last dimension), with ``scratch`` a float buffer of q's shape."""
    torch.mul(q, k_f, out=scratch)
    scratch.floor_()
    out.copy_(scratch)
    torch.clamp(out, zero_i, kmax, out=out)
    out.add_(col_offset)


def bin_sums(bidx: torch.Tensor, fail: torch.Tensor, ok: torch.Tensor, bin_e: torch.Tensor,
             bin_o: torch.Tensor) -> None:
    """This step's evidence by cell (flat ``bidx``, from ``bin_index``): ``bin_e[k]`` / ``bin_o[k]`` the sums of
    ``fail`` / ``ok`` over the tokens in cell ``k``. Both paths of the deferred scoring and of ``update`` share it,
    so the sums are taken in one order."""
    for out, c in ((bin_e, fail), (bin_o, ok)):
        out.zero_()
        out.index_add_(0, bidx, c)


class DeferredScoringRef:
    """Plain-Python definition of :class:`DeferredScoring` (lists; for the tests)."""

    def __init__(self, num_slots: int, width: int, depth: int) -> None:
        self.width, self.depth = width, depth
        self.ring = [[None] * depth for _ in range(num_slots)]  # [tokens, q, start, length, done] or None
        self.ptr = [0] * num_slots

    def reset(self, slot: int) -> None:
        self.ring[slot] = [None] * self.depth
        self.ptr[slot] = 0

    def score(self, slot: int, tokens: list[int], length: int, q: list[float], start: int, history: list[int],
              ring_width: int, q1: list[float] | None = None, bins: int = 0):
        """``history``: the slot's whole logical history after the append (the last ``ring_width`` readable).
        Returns ``(tried, ok)``, and with ``bins`` also the sums scored with ``q1`` by its bin."""
        L, hlen = self.width, len(history)
        tried, ok = [0.0] * L, [0.0] * L
        bt, bo = [0.0] * (max(bins, 1) * L), [0.0] * (max(bins, 1) * L)
        entries = self.ring[slot] + [[list(tokens), list(q), int(start), int(length), 0,
                                      list(q1) if q1 is not None else [0.0] * L]]
        for d, e in enumerate(entries):
            if e is None:
                continue
            tok, qe, st, ln, done, q1e = e
            kb = [j * bins + min(max(int(x * bins // 1), 0), bins - 1) if bins else 0 for j, x in enumerate(q1e)]
            known = hlen - st
            failed = False
            for j in range(min(ln, known)):
                p = st + j
                if p < hlen - ring_width:  # no longer in the ring: nothing from here is compared
                    break
                if history[p] != tok[j]:
                    if j >= done:
                        tried[j] += qe[j]
                        bt[kb[j]] += q1e[j]
                    failed = True
                    break
                if j >= done:
                    ok[j] += 1.0 - qe[j]
                    bo[kb[j]] += 1.0 - q1e[j]
            e[4] = max(0, min(ln, known))
            if failed or known >= ln:
                e[3] = 0
            if d < self.depth and e[3] == 0:
                self.ring[slot][d] = None
        p = self.ptr[slot]
        self.ring[slot][p] = entries[-1] if entries[-1][3] > 0 else None
        self.ptr[slot] = (p + 1) % self.depth
        return (tried, ok, bt, bo) if bins else (tried, ok)
