"""Plain-torch references for the n-gram drafter's device operations.

Each function here has a Triton twin in ``kernels.py`` with the *same signature*; the tests compare them
exactly, and both against the brute-force loops in ``tests/oracles/ngram_oracle.py``. The references are
vectorized over requests and positions (only loops over ``k < n_max`` and over batch chunks), use no host
synchronisation and have shapes that depend only on the inputs' shapes and the configuration, so they also
serve CPU users, the simulator and a ``backend="torch"`` table on a GPU. They define the semantics:

History table layout
    ``tokens [num_slots, W] int32`` is a ring buffer per request-pool slot: the token at logical position ``p``
    of a slot lives at column ``p % W``. ``lens [num_slots] int32`` is the logical length (every token ever
    written since the last reset), ``prompt_lens [num_slots] int32`` how many of them are the prompt. A slot
    whose history is longer than ``W`` keeps its newest ``W`` tokens: valid positions are
    ``[max(0, len - W), len)``.

Lookup (prompt lookup / n-gram drafting)
    For a slot with length ``T`` and oldest valid position ``lo``, every earlier end position
    ``e`` in ``[max(lo, T - 1 - window), T - 2]`` (``window == 0`` scans the whole valid row) gets a match
    length ``m(e)``: the number of consecutive ``k = 0, 1, ...`` (at most ``n_max``) with
    ``e - k >= lo`` and ``h[e - k] == h[T - 1 - k]``. The best end is the one with the largest ``m(e)``,
    ties going to the largest ``e`` (the most recent occurrence). If that ``m`` is below ``n_min`` there is
    no draft. Otherwise the draft is the up to ``max_draft`` tokens that followed it,
    ``h[e + 1 : min(e + 1 + max_draft, T)]``, and the features are:
    ``match_len = m(e)``, ``match_count = #{e' in the scanned range : m(e') >= m(e)}`` (how often the
    matched suffix occurred, the chosen occurrence included) and ``in_prompt = (e + 1 < prompt_len)``.
    Draft columns past ``draft_len`` are 0.

Probe (the echo's match test after a chain that is not committed yet)
    For each point ``k`` of ``points``, the sequence ``h' = history ++ extra[:k]`` (length ``T' = T + k``, oldest
    valid position ``lo' = max(0, T' - W)``, as if ``extra[:k]`` had been appended to the ring) is tested:
    ``matched = 1`` where some end ``e`` in ``[max(lo', T' - 1 - window), T' - 2]`` (``window == 0``: the whole
    valid row) has ``h'[e - j] == h'[T' - 1 - j]`` and ``e - j >= lo'`` for every ``j < n``. That is the lookup's
    "a draft exists" (``length > 0``) for ``history ++ extra[:k]`` at ``n_min = n``, for all points in one pass
    and without touching the table. Points are clamped to ``[0, G]``; an out-of-range slot matches nothing.

Invalid device data (never checked on the device; these rules only keep every access in bounds)
    A slot outside ``[0, num_slots)`` is ignored: nothing is written for it and its lookup outputs are 0.
    ``prompt_len`` is clamped to ``[0, prompt.shape[1]]`` and ``counts`` to ``[0, new_tokens.shape[1]]``.
    Within one write or append call the slots must be distinct (duplicates give an undefined row);
    duplicates are fine for ``reset`` and ``lookup``. Tokens are vocabulary ids in ``[0, 2**31)``.
"""

from __future__ import annotations

import torch

from ..hostsync import host_reads_allowed

__all__ = [
    "history_write_prompt_ref",
    "history_append_ref",
    "history_reset_ref",
    "history_stash_ref",
    "history_restore_ref",
    "ngram_lookup_ref",
    "ngram_probe_ref",
]

# The lookup works on [chunk, ~2-3 x width] temporaries; a batch is processed in row chunks of about this many
# elements (bounds peak memory; on CPU chunks of ~1M elements stayed in cache and ran 2-3x faster than 4M).
_LOOKUP_CHUNK_ELEMS = 1 << 20
# On CPU, scan only as far back as the longest history in the batch needs (reads `lens`; same result).
_TRIM_ON_CPU = True


def _slot_index(slots: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slot as int64 with out-of-range entries redirected to 0, in-range mask)``."""
    s = slots.to(torch.int64)
    ok = (s >= 0) & (s < num_slots)
    return torch.where(ok, s, torch.zeros_like(s)), ok


def _scatter_exact(flat: torch.Tensor, idx: torch.Tensor, new: torch.Tensor, valid: torch.Tensor) -> None:
    """``flat[idx[valid]] = new[valid]`` without a data-dependent shape or a host sync.

    Every entry is scattered as an integer delta (``new - old`` where valid, ``0`` elsewhere), so entries that
    are masked out may point anywhere in ``flat`` (even at a location a valid entry writes) without effect.
    Valid entries must target distinct locations.
    """
    idx = idx.reshape(-1)
    old = flat[idx]
    delta = torch.where(valid.reshape(-1), new.reshape(-1).to(flat.dtype) - old, torch.zeros_like(old))
    flat.scatter_add_(0, idx, delta)


def history_write_prompt_ref(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    prompt_lens: torch.Tensor,
    slots: torch.Tensor,
    prompt: torch.Tensor,
    prompt_len: torch.Tensor,
) -> None:
    """Start each slot afresh with a prompt: ``prompt [bs, P]`` (row b valid up to ``prompt_len[b]``).

    Rows longer than the table width keep their newest ``W`` tokens.
    """
    num_slots, width = tokens.shape
    bs, plen = prompt.shape
    if bs == 0:
        return
    s, ok = _slot_index(slots, num_slots)
    n = prompt_len.to(torch.int64).clamp(0, plen)
    p = torch.arange(plen, device=tokens.device, dtype=torch.int64)
    valid = ok[:, None] & (p[None, :] < n[:, None]) & (p[None, :] >= n[:, None] - width)
    idx = s[:, None] * width + p[None, :] % width
    _scatter_exact(tokens.view(-1), idx, prompt, valid)
    _scatter_exact(lens, s, n, ok)
    _scatter_exact(prompt_lens, s, n, ok)


def history_append_ref(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    slots: torch.Tensor,
    new_tokens: torch.Tensor,
    counts: torch.Tensor,
) -> None:
    """Append ``new_tokens[b, :counts[b]]`` to each slot (accepted draft tokens plus the bonus token)."""
    num_slots, width = tokens.shape
    bs, k = new_tokens.shape
    if bs == 0:
        return
    s, ok = _slot_index(slots, num_slots)
    t = lens[s].to(torch.int64)
    c = counts.to(torch.int64).clamp(0, k)
    i = torch.arange(k, device=tokens.device, dtype=torch.int64)
    # Only the newest `width` of an oversized append survive; they land in distinct columns.
    valid = ok[:, None] & (i[None, :] < c[:, None]) & (i[None, :] >= c[:, None] - width)
    idx = s[:, None] * width + (t[:, None] + i[None, :]) % width
    _scatter_exact(tokens.view(-1), idx, new_tokens, valid)
    _scatter_exact(lens, s, t + c, ok)


def history_reset_ref(lens: torch.Tensor, prompt_lens: torch.Tensor, slots: torch.Tensor) -> None:
    """Forget the history of finished, aborted or retracted requests."""
    if slots.shape[0] == 0:
        return
    s, ok = _slot_index(slots, lens.shape[0])
    # min(len, 0) for real slots, min(len, INT_MAX) (no change) for out-of-range ones: exact with duplicates.
    keep = torch.full_like(s, torch.iinfo(torch.int32).max, dtype=lens.dtype)
    zero = torch.where(ok, torch.zeros_like(keep), keep)
    lens.scatter_reduce_(0, s, zero, reduce="amin")
    prompt_lens.scatter_reduce_(0, s, zero.to(prompt_lens.dtype), reduce="amin")


_COLS: dict = {}


def _cols(g: int, device: torch.device) -> torch.Tensor:
    """``arange(g)`` as a ``[1, g]`` int64 row, made once per (g, device): no decode step allocates it."""
    key = (g, str(device))
    c = _COLS.get(key)
    if c is None:
        c = _COLS[key] = torch.arange(g, dtype=torch.int64, device=device).view(1, -1)
    return c


def _check_scratch(idx: torch.Tensor, saved: torch.Tensor) -> None:
    """Host-only shape check of the stash's scratch (shared by both backends)."""
    if not (idx.is_contiguous() and saved.is_contiguous()) or idx.shape != saved.shape:
        raise ValueError(f"idx {tuple(idx.shape)} and saved {tuple(saved.shape)} must be contiguous and of one shape")


def history_stash_ref(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    slots: torch.Tensor,
    idx: torch.Tensor,
    saved: torch.Tensor,
    slot64: torch.Tensor,
    lens0: torch.Tensor,
) -> None:
    """Save what an append of ``G = idx.shape[1]`` tokens to each slot will overwrite, for ``history_restore_ref``.

    Writes ``slot64 [bs]`` int64 (the slot clamped to ``[0, num_slots)``: a padded entry reads a real row, and
    restores that row's own values), ``lens0 [bs]`` int32 (its length), ``idx [bs, G]`` int64 (the flat ring
    index ``slot * W + (len + c) % W`` of appended column ``c``) and ``saved [bs, G]`` int32 (the tokens there).
    Duplicate slots are fine (they save the same values). ``idx`` and ``saved`` must be contiguous (the rows
    ``[:bs]`` of ``TokenHistory.reserve_after``'s buffers are).
    """
    num_slots, width = tokens.shape
    _check_scratch(idx, saved)
    if slots.shape[0] == 0:
        return
    slot64.copy_(slots)
    slot64.clamp_(0, num_slots - 1)
    torch.index_select(lens, 0, slot64, out=lens0)
    idx.copy_(lens0.view(-1, 1))
    idx.add_(_cols(idx.shape[1], idx.device)).remainder_(width).add_(slot64.view(-1, 1), alpha=width)
    torch.index_select(tokens.view(-1), 0, idx.view(-1), out=saved.view(-1))


def history_restore_ref(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    idx: torch.Tensor,
    saved: torch.Tensor,
    slot64: torch.Tensor,
    lens0: torch.Tensor,
) -> None:
    """Put back what ``history_stash_ref`` saved: ``tokens.flat[idx] = saved`` and ``lens[slot64] = lens0``."""
    _check_scratch(idx, saved)
    if slot64.shape[0] == 0:
        return
    tokens.view(-1).index_copy_(0, idx.view(-1), saved.view(-1))
    lens.index_copy_(0, slot64, lens0)


def scan_length(width: int, window: int) -> int:
    """Most end positions one lookup scans: ``W - 1``, or ``min(window, W - 1)`` with a window."""
    full = max(width - 1, 0)
    return full if window <= 0 else min(window, full)


def _lookup_chunk(
    rows: torch.Tensor,
    T: torch.Tensor,
    P: torch.Tensor,
    S: int,
    n_min: int,
    n_max: int,
    window: int,
    max_draft: int,
) -> tuple[torch.Tensor, ...]:
    """Lookup for a chunk of rows (``rows [c, W]`` int32; ``T``, ``P`` int64 ``[c]``) over ``S`` end positions.

    Works on the history read backwards, ``G[:, i] = h[T - 1 - i]`` for ``i < S + n_max``: the suffix is
    ``G[:, :n_max]``, candidate end ``e_j = T - 2 - j`` (``j < S``, most recent first) compares
    ``h[e_j - k] = G[:, j + 1 + k]`` with ``G[:, k]``, and position ``T - 1 - i`` is valid iff
    ``i <= T - 1 - lo``. Every valid end lies among the ``S`` candidates.
    """
    dev = rows.device
    c, width = rows.shape
    lo = (T - width).clamp(min=0)
    first = lo if window <= 0 else torch.maximum(lo, T - 1 - window)
    L = S + n_max
    # Gather G from the row repeated along its length (columns r + q*W - i stay >= 0: no modulo per element).
    q = -(-L // width)
    ext = torch.cat([rows] * (q + 1), dim=1) if q > 0 else rows
    i = torch.arange(L, device=dev, dtype=torch.int64)
    G = torch.gather(ext, 1, ((T - 1).remainder(width) + q * width)[:, None] - i[None, :])
    ii = i.to(torch.int32)
    valid = ii[None, :] <= (T - 1 - lo).to(torch.int32)[:, None]  # G[:, i] is inside the kept row
    alive = ii[None, :S] <= (T - 2 - first).to(torch.int32)[:, None]  # e_j >= first
    eq = torch.empty((c, S), dtype=torch.bool, device=dev)
    m = torch.zeros((c, S), dtype=torch.uint8, device=dev)
    for k in range(n_max):
        torch.eq(G[:, 1 + k : 1 + k + S], G[:, k : k + 1], out=eq)
        alive &= eq
        alive &= valid[:, 1 + k : 1 + k + S]
        m += alive
    if S > 0:
        best_m = m.amax(dim=1)
        at_best = m == best_m[:, None]
        best_j = at_best.view(torch.uint8).argmax(dim=1)  # first = most recent end at the best length
        count = torch.count_nonzero(at_best, dim=1)
    else:
        best_m = torch.zeros(c, dtype=torch.uint8, device=dev)
        best_j = torch.zeros_like(T)
        count = torch.zeros_like(T)
    return _finish(rows, T, P, best_m.to(torch.int64), best_j, count.to(torch.int64), n_min, max_draft)


def _lookup_chunk_sparse(
    rows: torch.Tensor,
    T: torch.Tensor,
    P: torch.Tensor,
    S: int,
    n_min: int,
    n_max: int,
    window: int,
    max_draft: int,
) -> tuple[torch.Tensor, ...]:
    """``_lookup_chunk`` for a CPU table (same results): only the ends whose last token matches are extended.

    The dense scan compares all ``S`` ends ``n_max`` times. Here one comparison finds the ends ``e`` with
    ``h[e] == h[T - 1]`` (few, for a real vocabulary; ``nonzero`` reads their number on the host), and only
    those are compared further, ``n_max`` tokens at once.
    """
    dev = rows.device
    c, width = rows.shape
    lo = (T - width).clamp(min=0)
    first = lo if window <= 0 else torch.maximum(lo, T - 1 - window)
    L = S + n_max
    i = torch.arange(L, device=dev, dtype=torch.int64)
    G = torch.gather(rows, 1, ((T - 1)[:, None] - i[None, :]).remainder(width))
    last_valid = T - 1 - lo  # G[:, i] is inside the kept row iff i <= last_valid
    j = i[:S]
    cand = (G[:, 1 : 1 + S] == G[:, :1]) & (j[None, :] <= (T - 2 - first)[:, None]) \
        & (j[None, :] + 1 <= last_valid[:, None])
    r, jj = torch.nonzero(cand, as_tuple=True)
    k = torch.arange(n_max, device=dev, dtype=torch.int64)
    col = jj[:, None] + 1 + k[None, :]  # G column compared with G[:, k]
    ok = (G[r[:, None], col] == G[r[:, None], k[None, :]]) & (col <= last_valid[r][:, None])
    m = torch.cumprod(ok.to(torch.int64), dim=1).sum(dim=1)  # >= 1: k = 0 matched
    best_m = torch.zeros(c, dtype=torch.int64, device=dev).scatter_reduce_(0, r, m, reduce="amax")
    at_best = m == best_m[r]
    best_j = torch.full((c,), S, dtype=torch.int64, device=dev).scatter_reduce_(
        0, r, torch.where(at_best, jj, S), reduce="amin")
    count = torch.zeros(c, dtype=torch.int64, device=dev).scatter_add_(0, r, at_best.to(torch.int64))
    best_j = torch.where(best_m > 0, best_j, 0)
    return _finish(rows, T, P, best_m, best_j, count, n_min, max_draft)


def _finish(rows, T, P, best_m, best_j, count, n_min, max_draft):
    """Draft tokens and features from the best end of each row (``best_m``, ``best_j``, ``count`` int64)."""
    dev = rows.device
    width = rows.shape[1]
    has = best_m >= n_min
    best_e = T - 2 - best_j
    n = torch.where(has, torch.clamp(T - 1 - best_e, max=max_draft), torch.zeros_like(T))
    d = torch.arange(max_draft, device=dev, dtype=torch.int64)
    dmask = d[None, :] < n[:, None]
    dpos = torch.where(dmask, best_e[:, None] + 1 + d[None, :], 0).remainder(width)
    draft = torch.where(dmask, torch.gather(rows, 1, dpos), 0)
    zero = torch.zeros_like(T)
    return (
        draft,
        n,
        torch.where(has, best_m, zero),
        torch.where(has, count, zero),
        (has & (best_e + 1 < P)).to(torch.int64),
    )


def ngram_lookup_ref(
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
    """Batched prompt lookup; writes the ``out_*`` tensors in place (see the module docstring).

    ``out_tokens [bs, max_draft]`` sets ``max_draft``; the other outputs are ``[bs]`` int32.
    """
    num_slots, width = tokens.shape
    bs, max_draft = out_tokens.shape
    if bs == 0:
        return
    s, ok = _slot_index(slots, num_slots)
    T = torch.where(ok, lens[s].to(torch.int64), 0)
    P = prompt_lens[s].to(torch.int64)
    S = scan_length(width, window)
    if host_reads_allowed(tokens) and _TRIM_ON_CPU:
        # Reading lengths costs nothing on a CPU: scan no further back than the longest history needs. Every
        # valid end of a row of length T lies in [0, T - 2], so the result is unchanged. (On a GPU the
        # shapes stay static: no host sync, CUDA-graph capturable.)
        S = min(S, max(int(T.max()) - 1, 0))
    sparse = host_reads_allowed(tokens) and _TRIM_ON_CPU
    chunk = _lookup_chunk_sparse if sparse else _lookup_chunk
    step = max(1, _LOOKUP_CHUNK_ELEMS // (2 * width + 2 * (S + n_max)))
    for b0 in range(0, bs, step):
        b1 = min(bs, b0 + step)
        rows = tokens.index_select(0, s[b0:b1])
        res = chunk(rows, T[b0:b1], P[b0:b1], S, n_min, n_max, window, max_draft)
        for out, val in zip((out_tokens, out_len, out_match_len, out_match_count, out_in_prompt), res):
            out[b0:b1].copy_(val)


def ngram_probe_ref(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    slots: torch.Tensor,
    extra: torch.Tensor,
    points: torch.Tensor,
    out_matched: torch.Tensor,
    n: int,
    window: int,
) -> None:
    """Batched probe (see the module docstring); writes ``out_matched [bs, P]`` int32 (1 = matched) in place.

    ``extra [bs, G]`` int32: the chain after each history; ``points [P]`` int32: the ``k`` tested. Each row's
    newest ``Sh`` history tokens and its chain are laid end-aligned in one ``[rows, Sh + G]`` sequence, so the
    query of a point is one column for every row and each comparison is a slice (only the loop over points and
    ``j < n`` is in Python)."""
    num_slots, width = tokens.shape
    bs, g = extra.shape
    npt = points.shape[0]
    if bs == 0 or npt == 0:
        return
    s, ok = _slot_index(slots, num_slots)
    T = torch.where(ok, lens[s].to(torch.int64), 0)
    win = width if window <= 0 or window > width else window
    sh = width  # history columns laid out: the newest min(T, W) positions of each row fit in W
    if host_reads_allowed(tokens) and _TRIM_ON_CPU:  # as the lookup: no further back than the longest row needs
        sh = min(sh, int(T.max()))
    k_all = points.to(torch.int64).clamp(0, g)  # [P]
    dev = tokens.device
    step = max(1, _LOOKUP_CHUNK_ELEMS // (2 * (sh + g) + 1))
    x = torch.arange(sh, device=dev, dtype=torch.int64).view(1, -1)
    top = sh + g - 2  # the ends any point can reach (each row's own bound, Sh + k - 2, is a mask below)
    m = max(top - (n - 1) + 1, 0)  # ends x_e in [n - 1, top]
    if m == 0:
        out_matched.zero_()
        return
    ends = torch.arange(n - 1, top + 1, device=dev, dtype=torch.int64).view(1, -1)  # [1, m]
    for b0 in range(0, bs, step):
        b1 = min(bs, b0 + step)
        t = T[b0:b1].view(-1, 1)  # [c, 1]
        pos = t - sh + x  # [c, Sh]: the logical position of each history column (invalid ones are never read)
        hist = torch.gather(tokens.index_select(0, s[b0:b1]), 1, pos.clamp(min=0) % width)
        ext = torch.cat([hist, extra[b0:b1].to(hist.dtype)], 1)  # [c, Sh + G]
        out = out_matched[b0:b1]
        for i in range(npt):
            k = k_all[i : i + 1]  # [1] (a device value; no host read)
            # x-coordinates: logical p = T - Sh + x. Oldest valid x after appending k tokens: max(Sh - T, Sh + k - W).
            lo_x = torch.maximum(sh - t, sh + k - width)  # [c, 1]
            low = torch.maximum(lo_x + (n - 1), sh + k - 1 - win)  # the lowest end whose n-gram is all valid
            alive = (ends >= low) & (ends <= sh + k - 2)
            qcol = sh + k - 1  # [1]: the query's last column, the same for every row
            for j in range(n):
                q = torch.gather(ext, 1, (qcol - j).clamp(min=0).expand(ext.shape[0], 1))  # [c, 1]
                alive &= ext[:, n - 1 - j : n - 1 - j + m] == q
            alive &= ok[b0:b1].view(-1, 1)  # an out-of-range slot matches nothing (as its lookup outputs 0)
            out[:, i].copy_(alive.any(1))
