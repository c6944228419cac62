"""Plain-torch references for the cross-request n-gram corpus (``corpus.py``); Triton twins in ``corpus_kernels.py``.

Each function has a Triton twin with the *same signature*; the tests compare them exactly and both against
the brute-force loops in ``tests/oracles/corpus_oracle.py``. These references define the semantics.

Table layout (fixed size, shared by all requests of a tenant key)
    ``tag, tok, cnt [NB, C] int32``: ``NB`` buckets (a power of two) of ``C`` entries (a power of two). An entry
    is one (context, next token) pair: ``tag`` is a 31-bit hash of the context (0 = empty), ``tok`` the next
    token, ``cnt`` how often it followed the context (aged, see below). ``claim [NB * C] int32`` is scratch,
    ``INT32_MAX`` between calls. A context of order ``n`` (its last ``n`` tokens, ``1 <= n <= n_max``) and a
    tenant id hash to a bucket and a tag; its continuation ``t`` lives in entry ``slot(t) = h(t) mod C`` of
    that bucket. Contexts share buckets; the tag tells them apart (a false match needs a 31-bit collision).

Hashing (exact int64 arithmetic, every product below 2**62, ``P = 2**31 - 1``)
    ``coef [5, L] int64``: rows ``R1, R2`` (per context distance ``k``), ``Q1, Q2`` (per order ``n``) and
    ``[S1, S2, M1, M2, RS]``. For the context ``x_1 .. x_n`` (``x_1`` the newest) of tenant ``g``:
    ``h_i = (S_i * (g + 1) % P + Q_i[n] + sum_k ((x_k + 1) * R_i[k] % P)) % P`` and ``H_i = h_i * M_i % P``;
    bucket ``= H_1 & (NB - 1)``, tag ``= H_2 + 1``; ``slot(t) = ((t + 1) * RS % P) & (C - 1)``.

Insert (after verify: the newest accepted tokens; or a prompt)
    For each batch row ``b`` (slot ``s``, history length ``T``, oldest kept position ``lo = max(0, T - W)``),
    positions ``p = p0 + i`` for ``i < min(counts[b], max_pos)`` with ``p0 = T - c`` (``from_end``) or
    ``start[b]``, kept if ``lo <= p < T``; each order ``n`` with ``p - n >= lo`` gives one update
    ``u = ((b * max_pos + i) * n_max + n - 1)``: (entry ``e``, tag ``g``, token ``t = h[p]``). Three phases,
    each independent of the order in which updates run (so the GPU result is deterministic):
      1. an update whose entry holds another (tag, token), or its own with ``cnt >= CAP``, claims the entry:
         ``claim[e] = min(claim[e], u)``;
      2. the winning claimant of each entry ages it: ``cnt >>= 1``; a foreign entry whose count reaches 0 is
         taken over (``tag, tok = g, t``; ``cnt = 0``). ``claim[e]`` returns to ``INT32_MAX``;
      3. every update whose entry now holds its (tag, token) adds 1 to ``cnt``.
    A full table never grows and never blocks: a contested entry loses half its count per contesting call
    (bounded, deterministic LFU-with-ageing eviction).

Lookup (a draft walk per request)
    The context is the request's history (the newest ``n_max`` kept tokens) followed by the tokens drafted so
    far. At draft position ``j`` every order ``n`` (at most the context available) is probed: ``tot_n`` = the
    summed counts of its bucket's entries with its tag, ``best_n`` = the entry with the highest count (ties:
    the lowest entry index). The longest order with ``tot_n > 0`` is used: ``q = (best << 16) // (tot + alpha)``
    (16-bit fixed point, ``alpha >= 1`` shrinks thin evidence), survival ``s = s * q >> 16`` (``s`` starts at
    ``1 << 16``). The token is drafted while ``s >= tau`` (``tau`` in the same fixed point): the draft length
    is set by confidence, up to ``max_draft`` (the output width). Outputs: ``tokens [bs, D]`` (0 past the
    length), ``length``, ``match_len`` (order used at the first position), ``match_count`` (``tot`` there),
    ``score`` (sum of the survivals: the expected accepted length times ``2**16``) and ``q [bs, D]``.

Invalid device data: a slot outside ``[0, num_slots)`` inserts nothing and looks up nothing (outputs 0);
negative tenant ids act as ``tenant & 0x7fffffff``; ``counts`` are clamped to ``[0, max_pos]``.
"""

from __future__ import annotations

import torch

from ..hostsync import host_reads_allowed

__all__ = ["P", "CAP", "INT32_MAX", "corpus_insert_ref", "corpus_lookup_ref", "context_hashes"]

P = 2**31 - 1
CAP = 1 << 30
INT32_MAX = 2**31 - 1
ONE = 1 << 16


def _slot_index(slots: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    s = slots.to(torch.int64)
    ok = (s >= 0) & (s < num_slots)
    return torch.where(ok, s, torch.zeros_like(s)), ok


def context_hashes(ctx: torch.Tensor, tenant: torch.Tensor, coef: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(H1, H2)`` for every order: ``ctx [..., N]`` int64 tokens (``ctx[..., k-1]`` = distance ``k``),
    ``tenant [...]``; returns ``[..., N]`` int64 (entry ``n-1`` hashes the order-``n`` context)."""
    N = ctx.shape[-1]
    g = (tenant.to(torch.int64) & 0x7FFFFFFF) + 1
    out = []
    for i in range(2):
        R, Q = coef[i, 1 : N + 1], coef[2 + i, 1 : N + 1]
        S, M = coef[4, i], coef[4, 2 + i]
        terms = ((ctx + 1) * R) % P
        h = ((S * g) % P)[..., None] + Q + torch.cumsum(terms, dim=-1)
        out.append(((h % P) * M) % P)
    return out[0], out[1]


def _token_slot(t: torch.Tensor, coef: torch.Tensor, C: int) -> torch.Tensor:
    return (((t.to(torch.int64) + 1) * coef[4, 4]) % P) & (C - 1)


def corpus_insert_ref(
    tag: torch.Tensor,
    tok: torch.Tensor,
    cnt: torch.Tensor,
    claim: torch.Tensor,
    coef: torch.Tensor,
    hist_tokens: torch.Tensor,
    hist_lens: torch.Tensor,
    slots: torch.Tensor,
    tenant: torch.Tensor,
    start: torch.Tensor,
    counts: torch.Tensor,
    max_pos: int,
    n_max: int,
    from_end: bool,
    scratch: torch.Tensor | None = None,
) -> None:
    """Insert history positions of ``slots`` into the corpus (see the module docstring). ``scratch`` is the
    Triton twin's buffer between its launches; the reference does not need it and leaves it alone."""
    NB, C = tag.shape
    num_slots, W = hist_tokens.shape
    bs = slots.shape[0]
    if bs == 0 or max_pos <= 0:
        return
    dev = tag.device
    s, ok = _slot_index(slots, num_slots)
    T = torch.where(ok, hist_lens[s].to(torch.int64), 0)
    lo = (T - W).clamp(min=0)
    c = counts.to(torch.int64).clamp(0, max_pos)
    p0 = T - c if from_end else start.to(torch.int64)
    i = torch.arange(max_pos, device=dev, dtype=torch.int64)
    p = p0[:, None] + i[None, :]
    pv = ok[:, None] & (i[None, :] < c[:, None]) & (p >= lo[:, None]) & (p < T[:, None])
    rows = hist_tokens.index_select(0, s).to(torch.int64)
    pc = torch.where(pv, p, 0)
    t = torch.gather(rows, 1, pc % W)
    k = torch.arange(1, n_max + 1, device=dev, dtype=torch.int64)
    q = pc[:, :, None] - k  # [bs, mp, N]
    kv = pv[:, :, None] & (q >= lo[:, None, None])
    ctx = torch.gather(rows, 1, (torch.where(kv, q, 0) % W).reshape(bs, -1)).reshape(q.shape)
    H1, H2 = context_hashes(ctx, tenant[:, None].expand(bs, max_pos), coef)
    e = (H1 & (NB - 1)) * C + _token_slot(t, coef, C)[:, :, None]
    g = H2 + 1
    tt = t[:, :, None].expand_as(e)
    u = torch.arange(bs * max_pos * n_max, device=dev, dtype=torch.int64).reshape(e.shape)
    e, g, tt, u, kv = e.reshape(-1), g.reshape(-1), tt.reshape(-1), u.reshape(-1), kv.reshape(-1)
    tag_f, tok_f, cnt_f = tag.view(-1), tok.view(-1), cnt.view(-1)
    # Phase 1: claims.
    ctag, ctok, ccnt = tag_f[e].to(torch.int64), tok_f[e].to(torch.int64), cnt_f[e].to(torch.int64)
    match = (ctag == g) & (ctok == tt)
    contest = kv & (~match | (ccnt >= CAP))
    claim.scatter_reduce_(0, e, torch.where(contest, u, INT32_MAX).to(claim.dtype), reduce="amin")
    # Phase 2: the winner of each entry ages it or takes it over (winners hold distinct entries).
    win = contest & (claim[e].to(torch.int64) == u)
    half = ccnt >> 1
    take = win & ~match & (half == 0)
    new_tag = torch.where(take, g, ctag)
    new_tok = torch.where(take, tt, ctok)
    new_cnt = torch.where(take, 0, half)
    for flat, old, new in ((tag_f, ctag, new_tag), (tok_f, ctok, new_tok), (cnt_f, ccnt, new_cnt)):
        flat.scatter_add_(0, e, torch.where(win, new - old, 0).to(flat.dtype))
    claim.scatter_(0, e, torch.full_like(e, INT32_MAX).to(claim.dtype))
    # Phase 3: counts.
    hit = kv & (tag_f[e].to(torch.int64) == g) & (tok_f[e].to(torch.int64) == tt)
    cnt_f.scatter_add_(0, e, hit.to(cnt_f.dtype))


def corpus_lookup_ref(
    tag: torch.Tensor,
    tok: torch.Tensor,
    cnt: torch.Tensor,
    coef: torch.Tensor,
    hist_tokens: torch.Tensor,
    hist_lens: torch.Tensor,
    slots: torch.Tensor,
    tenant: torch.Tensor,
    out_tokens: torch.Tensor,
    out_len: torch.Tensor,
    out_match_len: torch.Tensor,
    out_match_count: torch.Tensor,
    out_score: torch.Tensor,
    out_q: torch.Tensor,
    n_max: int,
    alpha: int,
    tau: int,
) -> None:
    """Batched draft walk over the corpus; writes the ``out_*`` tensors in place (see the module docstring)."""
    NB, C = tag.shape
    num_slots, W = hist_tokens.shape
    bs, D = out_tokens.shape
    if bs == 0:
        return
    dev = tag.device
    s, ok = _slot_index(slots, num_slots)
    T = torch.where(ok, hist_lens[s].to(torch.int64), 0)
    lo = (T - W).clamp(min=0)
    rows = hist_tokens.index_select(0, s).to(torch.int64)
    k = torch.arange(1, n_max + 1, device=dev, dtype=torch.int64)
    hp = T[:, None] - k  # history position at distance k before any draft
    hv = hp >= lo[:, None]
    # seq = [history newest n_max (oldest first) | drafted]; distance k at step j is seq[n_max + j - k].
    seq = torch.zeros((bs, n_max + D), dtype=torch.int64, device=dev)
    seq[:, :n_max] = torch.gather(rows, 1, torch.where(hv, hp, 0) % W).flip(1)
    sv = torch.zeros((bs, n_max + D), dtype=torch.bool, device=dev)
    sv[:, :n_max] = hv.flip(1)
    sv[:, n_max:] = True
    alive = ok.clone()
    surv = torch.full((bs,), ONE, dtype=torch.int64, device=dev)
    score = torch.zeros(bs, dtype=torch.int64, device=dev)
    length = torch.zeros(bs, dtype=torch.int64, device=dev)
    toks = torch.zeros((bs, D), dtype=torch.int64, device=dev)
    qs = torch.zeros((bs, D), dtype=torch.int64, device=dev)
    m_len = torch.zeros(bs, dtype=torch.int64, device=dev)
    m_cnt = torch.zeros(bs, dtype=torch.int64, device=dev)
    ent = torch.arange(C, device=dev, dtype=torch.int64)
    cpu_trim = host_reads_allowed(tag)
    for j in range(D):
        if cpu_trim and not bool(alive.any()):
            break
        idx = n_max + j - k
        ctx = seq[:, idx]
        cv = sv[:, idx] & alive[:, None]  # a valid prefix of distances
        H1, H2 = context_hashes(ctx, tenant, coef)
        e = (H1 & (NB - 1))[:, :, None] * C + ent
        etag = tag.view(-1)[e].to(torch.int64)
        ecnt = cnt.view(-1)[e].to(torch.int64)
        m = (etag == (H2 + 1)[:, :, None]) & cv[:, :, None] & (ecnt > 0)
        tot = torch.where(m, ecnt, 0).sum(-1)
        key = torch.where(m, ecnt * C + (C - 1 - ent), -1).amax(-1)
        has_n = tot > 0
        nsel = torch.where(has_n, k, 0).amax(-1)  # longest order with evidence (0 = none)
        pick = (k == nsel[:, None]) & has_n
        tsel = torch.where(pick, tot, 0).sum(-1)
        ksel = torch.where(pick, key, 0).sum(-1)
        best = ksel // C
        eidx = torch.where(pick, (C - 1 - (key % C)), 0).sum(-1)
        esel = torch.where(pick[:, :, None] & (ent == eidx[:, None, None]), e, 0).sum((-1, -2))
        tnext = tok.view(-1)[esel].to(torch.int64)
        q = (best << 16) // (tsel + alpha)
        ns = (surv * q) >> 16
        take = alive & (nsel > 0) & (ns >= tau)
        surv = torch.where(take, ns, surv)
        score += torch.where(take, ns, 0)
        toks[:, j] = torch.where(take, tnext, 0)
        qs[:, j] = torch.where(take, q, 0)
        seq[:, n_max + j] = torch.where(take, tnext, 0)
        if j == 0:
            m_len = torch.where(take, nsel, 0)
            m_cnt = torch.where(take, tsel, 0)
        length += take.to(torch.int64)
        alive = take
    out_tokens.copy_(toks)
    out_len.copy_(length)
    out_match_len.copy_(m_len)
    out_match_count.copy_(m_cnt)
    out_score.copy_(score)
    out_q.copy_(qs)
