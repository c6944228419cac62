"""Triton kernels for the n-gram drafter's device operations.

Every launcher has the *same signature and semantics* as its twin in ``reference.py`` (read that module's
docstring). Launchers allocate nothing, never read device data back to the host and size their grids from
tensor shapes only, so they can be captured in a CUDA graph and replayed under the overlap scheduler.

All index arithmetic is int32 except pointer offsets, which are int64. Out-of-range slots are masked (no
write, zero lookup outputs), ``prompt_len`` / ``counts`` are clamped to the width of their token tensor, so
no kernel touches memory outside the tensors it is given whatever the device data holds.

On CPU tensors these kernels run only under the Triton interpreter (``TRITON_INTERPRET=1`` set before Triton
is imported).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import reference

__all__ = [
    "history_write_prompt_triton",
    "history_append_triton",
    "history_reset_triton",
    "history_stash_triton",
    "history_restore_triton",
    "ngram_lookup_triton",
    "ngram_probe_triton",
    "LOOKUP_BLOCK",
    "LOOKUP_NUM_WARPS",
]

# End positions a lookup program compares per loop iteration, and its warps (tunables; see bench_ngram.py).
LOOKUP_BLOCK = 2048
LOOKUP_NUM_WARPS = 8
_COPY_BLOCK = 1024
_RESET_BLOCK = 256


def _pow2(x: int, lo: int = 16, hi: int | None = None) -> int:
    v = max(lo, triton.next_power_of_2(max(int(x), 1)))
    return v if hi is None else min(v, hi)


@triton.jit
def _ring_col(pos, lo, lo_mod, width):
    """Column of logical position ``pos`` (``lo <= pos < lo + width``) without an integer division."""
    c = pos - lo + lo_mod
    return tl.where(c >= width, c - width, c)


@triton.jit
def _write_prompt_kernel(
    tokens_ptr, lens_ptr, prompt_lens_ptr, slots_ptr, prompt_ptr, prompt_len_ptr,
    num_slots, width, plen, stride_pb, stride_pp,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    blk = tl.program_id(1)
    s = tl.load(slots_ptr + b)  # int32 or int64: range-check before narrowing
    ok = (s >= 0) & (s < num_slots)
    s = tl.where(ok, s, 0).to(tl.int32)
    n = tl.load(prompt_len_ptr + b)
    n = tl.minimum(tl.maximum(n, 0), plen).to(tl.int32)
    start = tl.maximum(n - width, 0)
    p = start + blk * BLOCK + tl.arange(0, BLOCK)
    mask = ok & (p < n)
    src = prompt_ptr + b.to(tl.int64) * stride_pb + p.to(tl.int64) * stride_pp
    tok = tl.load(src, mask=mask, other=0)
    row = tokens_ptr + s.to(tl.int64) * width
    tl.store(row + _ring_col(p, start, start % width, width), tok, mask=mask)
    first = ok & (blk == 0)
    tl.store(lens_ptr + s, n, mask=first)
    tl.store(prompt_lens_ptr + s, n, mask=first)


@triton.jit
def _append_kernel(
    tokens_ptr, lens_ptr, slots_ptr, new_ptr, counts_ptr,
    num_slots, width, k, stride_nb, stride_nk,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    s = tl.load(slots_ptr + b)  # int32 or int64: range-check before narrowing
    ok = (s >= 0) & (s < num_slots)
    s = tl.where(ok, s, 0).to(tl.int32)
    t = tl.load(lens_ptr + s)
    c = tl.load(counts_ptr + b)
    c = tl.minimum(tl.maximum(c, 0), k).to(tl.int32)
    i_lo = tl.maximum(c - width, 0)  # only the newest `width` of an oversized append survive
    row = tokens_ptr + s.to(tl.int64) * width
    t_mod = t % width
    for i0 in range(0, k, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        mask = ok & (i < c) & (i >= i_lo)
        tok = tl.load(new_ptr + b.to(tl.int64) * stride_nb + i.to(tl.int64) * stride_nk, mask=mask, other=0)
        col = (t_mod + i) % width
        tl.store(row + col, tok, mask=mask)
    tl.store(lens_ptr + s, t + c, mask=ok)


@triton.jit
def _reset_kernel(lens_ptr, prompt_lens_ptr, slots_ptr, bs, num_slots, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s = tl.load(slots_ptr + i, mask=i < bs, other=-1)
    ok = (i < bs) & (s >= 0) & (s < num_slots)
    s = tl.where(ok, s, 0).to(tl.int32)
    zero = tl.zeros([BLOCK], dtype=tl.int32)
    tl.store(lens_ptr + s, zero, mask=ok)
    tl.store(prompt_lens_ptr + s, zero, mask=ok)


@triton.jit
def _stash_kernel(
    tokens_ptr, lens_ptr, slots_ptr, idx_ptr, saved_ptr, slot64_ptr, lens0_ptr,
    num_slots, width, g, stride_ib, stride_sb,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    s = tl.load(slots_ptr + b).to(tl.int64)
    s = tl.minimum(tl.maximum(s, 0), num_slots - 1)
    l0 = tl.load(lens_ptr + s)
    tl.store(slot64_ptr + b, s)
    tl.store(lens0_ptr + b, l0)
    c = tl.arange(0, BLOCK)
    mask = c < g
    idx = s * width + (l0.to(tl.int64) + c) % width
    tok = tl.load(tokens_ptr + idx, mask=mask, other=0)
    tl.store(idx_ptr + b.to(tl.int64) * stride_ib + c, idx, mask=mask)
    tl.store(saved_ptr + b.to(tl.int64) * stride_sb + c, tok, mask=mask)


@triton.jit
def _restore_kernel(
    tokens_ptr, lens_ptr, idx_ptr, saved_ptr, slot64_ptr, lens0_ptr,
    g, stride_ib, stride_sb,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    mask = c < g
    idx = tl.load(idx_ptr + b.to(tl.int64) * stride_ib + c, mask=mask, other=0)
    tok = tl.load(saved_ptr + b.to(tl.int64) * stride_sb + c, mask=mask, other=0)
    tl.store(tokens_ptr + idx, tok, mask=mask)
    tl.store(lens_ptr + tl.load(slot64_ptr + b), tl.load(lens0_ptr + b))


@triton.jit
def _lookup_kernel(
    tokens_ptr, lens_ptr, prompt_lens_ptr, slots_ptr,
    out_tokens_ptr, out_len_ptr, out_match_len_ptr, out_match_count_ptr, out_in_prompt_ptr,
    num_slots, width, stride_ob, stride_od, n_min, window,
    N_MAX: tl.constexpr, MAX_DRAFT: tl.constexpr, DRAFT_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    s = tl.load(slots_ptr + b)  # int32 or int64: range-check before narrowing
    ok = (s >= 0) & (s < num_slots)
    s = tl.where(ok, s, 0).to(tl.int32)
    T = tl.where(ok, tl.load(lens_ptr + s), 0)
    P = tl.load(prompt_lens_ptr + s)
    row = tokens_ptr + s.to(tl.int64) * width
    lo = tl.maximum(T - width, 0)
    lo_mod = lo % width
    first = tl.maximum(lo, T - 1 - window)  # window is in [1, width]; width means "the whole row"

    # Per lane: best match length seen, how many ends reached it, and the latest such end. The per-request
    # result is then: best = max over lanes; count = sum of the counts of lanes at best (a lane below best
    # saw no end reaching it); end = the largest end among lanes at best. No reduction inside the loop.
    offs = tl.arange(0, BLOCK)
    lane_m = tl.zeros([BLOCK], dtype=tl.int32)
    lane_cnt = tl.zeros([BLOCK], dtype=tl.int32)
    lane_e = tl.full([BLOCK], -1, dtype=tl.int32)
    for start in range(first, T - 1, BLOCK):
        e = start + offs
        alive = e < T - 1
        m = tl.zeros([BLOCK], dtype=tl.int32)
        for k in tl.static_range(N_MAX):
            q = T - 1 - k  # suffix position; if q < lo then every e - k < lo too and nothing is alive
            sk = tl.load(row + _ring_col(q, lo, lo_mod, width), mask=q >= lo, other=0)
            pos = e - k
            alive = alive & (pos >= lo)
            tok = tl.load(row + _ring_col(pos, lo, lo_mod, width), mask=alive, other=0)
            alive = alive & (tok == sk)
            m += alive.to(tl.int32)
        gt = m > lane_m
        eq = (m == lane_m) & (m > 0)
        lane_cnt = tl.where(gt, 1, lane_cnt + eq.to(tl.int32))
        lane_e = tl.where(gt | eq, e, lane_e)
        lane_m = tl.maximum(lane_m, m)

    best_m = tl.max(lane_m, axis=0)
    at_best = lane_m == best_m
    count = tl.sum(tl.where(at_best, lane_cnt, 0), axis=0)
    best_e = tl.max(tl.where(at_best, lane_e, -1), axis=0)
    has = best_m >= n_min
    n = tl.where(has, tl.minimum(T - 1 - best_e, MAX_DRAFT), 0)

    i = tl.arange(0, DRAFT_BLOCK)
    dmask = i < n
    tok = tl.load(row + _ring_col(best_e + 1 + i, lo, lo_mod, width), mask=dmask, other=0)
    dst = out_tokens_ptr + b.to(tl.int64) * stride_ob + i.to(tl.int64) * stride_od
    tl.store(dst, tok, mask=i < MAX_DRAFT)
    tl.store(out_len_ptr + b, n)
    tl.store(out_match_len_ptr + b, tl.where(has, best_m, 0))
    tl.store(out_match_count_ptr + b, tl.where(has, count, 0))
    tl.store(out_in_prompt_ptr + b, (has & (best_e + 1 < P)).to(tl.int32))


@triton.jit
def _probe_tok(row, ext_row, stride_ed, pos, T, lo, lo_mod, width, g, mask):
    """``h'[pos]`` (history ++ extra): the ring below ``T``, the chain from ``T`` on; 0 where masked."""
    in_ring = pos < T
    r = tl.load(row + _ring_col(pos, lo, lo_mod, width), mask=mask & in_ring & (pos >= lo), other=0)
    c = pos - T
    x = tl.load(ext_row + c.to(tl.int64) * stride_ed, mask=mask & (pos >= T) & (c < g), other=0)
    return tl.where(in_ring, r, x)


@triton.jit
def _probe_kernel(
    tokens_ptr, lens_ptr, slots_ptr, extra_ptr, points_ptr, out_ptr,
    num_slots, width, g, stride_eb, stride_ed, stride_ob, stride_op, window,
    NPT: tl.constexpr, N: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    s = tl.load(slots_ptr + b)
    ok = (s >= 0) & (s < num_slots)
    s = tl.where(ok, s, 0).to(tl.int32)
    T = tl.where(ok, tl.load(lens_ptr + s), 0)
    row = tokens_ptr + s.to(tl.int64) * width
    ext_row = extra_ptr + b.to(tl.int64) * stride_eb
    T_lo = tl.maximum(T - width, 0)
    T_lo_mod = T_lo % width  # the ring's layout is the history's: positions below T keep their columns
    offs = tl.arange(0, BLOCK)
    for p in tl.static_range(NPT):
        k = tl.minimum(tl.maximum(tl.load(points_ptr + p), 0), g)
        tp = T + k
        lo = tl.maximum(tp - width, 0)  # the appended chain pushes the oldest positions out of the ring
        first = tl.maximum(lo, tp - 1 - window)
        hit = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(first, tp - 1, BLOCK):
            e = start + offs
            alive = (e < tp - 1) & ok
            for j in tl.static_range(N):
                q = tp - 1 - j
                pos = e - j
                alive = alive & (pos >= lo) & (q >= lo)
                sq = _probe_tok(row, ext_row, stride_ed, q, T, T_lo, T_lo_mod, width, g, q >= lo)
                tok = _probe_tok(row, ext_row, stride_ed, pos, T, T_lo, T_lo_mod, width, g, alive)
                alive = alive & (tok == sq)
            hit = tl.maximum(hit, alive.to(tl.int32))
        tl.store(out_ptr + b.to(tl.int64) * stride_ob + p * stride_op, tl.max(hit, axis=0))


def history_write_prompt_triton(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    prompt_lens: torch.Tensor,
    slots: torch.Tensor,
    prompt: torch.Tensor,
    prompt_len: torch.Tensor,
) -> None:
    """Triton twin of :func:`reference.history_write_prompt_ref`."""
    num_slots, width = tokens.shape
    bs, plen = prompt.shape
    if bs == 0:
        return
    span = max(min(plen, width), 1)
    block = _pow2(span, hi=_COPY_BLOCK)
    grid = (bs, triton.cdiv(span, block))
    _write_prompt_kernel[grid](
        tokens, lens, prompt_lens, slots, prompt, prompt_len,
        num_slots, width, plen, prompt.stride(0), prompt.stride(1),
        BLOCK=block,
    )


def history_append_triton(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    slots: torch.Tensor,
    new_tokens: torch.Tensor,
    counts: torch.Tensor,
) -> None:
    """Triton twin of :func:`reference.history_append_ref`."""
    num_slots, width = tokens.shape
    bs, k = new_tokens.shape
    if bs == 0:
        return
    _append_kernel[(bs,)](
        tokens, lens, slots, new_tokens, counts,
        num_slots, width, k, new_tokens.stride(0), new_tokens.stride(1),
        BLOCK=_pow2(k, hi=_COPY_BLOCK),
    )


def history_reset_triton(lens: torch.Tensor, prompt_lens: torch.Tensor, slots: torch.Tensor) -> None:
    """Triton twin of :func:`reference.history_reset_ref`."""
    bs = slots.shape[0]
    if bs == 0:
        return
    block = _pow2(bs, hi=_RESET_BLOCK)
    _reset_kernel[(triton.cdiv(bs, block),)](lens, prompt_lens, slots, bs, lens.shape[0], BLOCK=block)


def history_stash_triton(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    slots: torch.Tensor,
    idx: torch.Tensor,
    saved: torch.Tensor,
    slot64: torch.Tensor,
    lens0: torch.Tensor,
) -> None:
    """Triton twin of :func:`reference.history_stash_ref`: one program per request."""
    reference._check_scratch(idx, saved)
    num_slots, width = tokens.shape
    bs, g = idx.shape
    if bs == 0:
        return
    _stash_kernel[(bs,)](
        tokens, lens, slots, idx, saved, slot64, lens0,
        num_slots, width, g, idx.stride(0), saved.stride(0),
        BLOCK=_pow2(g, hi=None),
    )


def history_restore_triton(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    idx: torch.Tensor,
    saved: torch.Tensor,
    slot64: torch.Tensor,
    lens0: torch.Tensor,
) -> None:
    """Triton twin of :func:`reference.history_restore_ref`: one program per request."""
    reference._check_scratch(idx, saved)
    bs, g = idx.shape
    if bs == 0:
        return
    _restore_kernel[(bs,)](
        tokens, lens, idx, saved, slot64, lens0,
        g, idx.stride(0), saved.stride(0),
        BLOCK=_pow2(g, hi=None),
    )


def ngram_lookup_triton(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    prompt_lens: torch.Tensor,
    slots: torch.Tensor,
    out_tokens: torch.Tensor,
    out_len: torch.Tensor,
    out_match_len: torch.Tensor,
    out_match_count: torch.Tensor,
    out_in_prompt: torch.Tensor,
    n_min: int,
    n_max: int,
    window: int,
) -> None:
    """Triton twin of :func:`reference.ngram_lookup_ref`: one program per request scans its window."""
    num_slots, width = tokens.shape
    bs, max_draft = out_tokens.shape
    if bs == 0:
        return
    win = width if window <= 0 or window > width else window  # T - 1 - width < lo: no extra bound
    block = _pow2(max(min(win, width - 1), 1), hi=LOOKUP_BLOCK)
    _lookup_kernel[(bs,)](
        tokens, lens, prompt_lens, slots,
        out_tokens, out_len, out_match_len, out_match_count, out_in_prompt,
        num_slots, width, out_tokens.stride(0), out_tokens.stride(1), n_min, win,
        N_MAX=n_max, MAX_DRAFT=max_draft, DRAFT_BLOCK=_pow2(max_draft), BLOCK=block,
        num_warps=LOOKUP_NUM_WARPS if block >= 1024 else 4,
    )


def ngram_probe_triton(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    slots: torch.Tensor,
    extra: torch.Tensor,
    points: torch.Tensor,
    out_matched: torch.Tensor,
    n: int,
    window: int,
) -> None:
    """Triton twin of :func:`reference.ngram_probe_ref`: one program per request scans its window once per point."""
    num_slots, width = tokens.shape
    bs, g = extra.shape
    npt = points.shape[0]
    if bs == 0 or npt == 0:
        return
    win = width if window <= 0 or window > width else window
    block = _pow2(max(min(win, width - 1 + g), 1), hi=LOOKUP_BLOCK)
    _probe_kernel[(bs,)](
        tokens, lens, slots, extra, points, out_matched,
        num_slots, width, g, extra.stride(0), extra.stride(1), out_matched.stride(0), out_matched.stride(1), win,
        NPT=npt, N=n, BLOCK=block, num_warps=LOOKUP_NUM_WARPS if block >= 1024 else 4,
    )
