"""Brute-force oracle of the cross-request n-gram corpus: plain Python loops over the semantics written in
``sglang_hybrid/ngram/corpus_reference.py`` (hash by hash, update by update, position by position)."""

from __future__ import annotations

import torch

P = 2**31 - 1
CAP = 1 << 30
IMAX = 2**31 - 1


def _hash(ctx: list[int], g: int, coef: list[list[int]], i: int) -> int:
    """``H_i`` of the context ``ctx`` (``ctx[0]`` newest) for tenant ``g`` (already ``& 0x7fffffff``)."""
    n = len(ctx)
    h = (coef[4][i] * (g + 1)) % P + coef[2 + i][n]
    for k, x in enumerate(ctx, 1):
        h += ((x + 1) * coef[i][k]) % P
    return ((h % P) * coef[4][2 + i]) % P


def _entry(ctx: list[int], t: int, g: int, coef, NB: int, C: int) -> tuple[int, int]:
    b = _hash(ctx, g, coef, 0) & (NB - 1)
    return b * C + ((((t + 1) * coef[4][4]) % P) & (C - 1)), _hash(ctx, g, coef, 1) + 1


def corpus_insert_oracle(tag, tok, cnt, claim, coef, hist_tokens, hist_lens, slots, tenant, start, counts,
                         max_pos: int, n_max: int, from_end: bool) -> None:
    NB, C = tag.shape
    num_slots, W = hist_tokens.shape
    co = coef.tolist()
    ups = []  # (u, e, g, t)
    for b in range(slots.shape[0]):
        s = int(slots[b])
        if not 0 <= s < num_slots:
            continue
        T = int(hist_lens[s])
        lo = max(0, T - W)
        c = min(max(int(counts[b]), 0), max_pos)
        p0 = T - c if from_end else int(start[b])
        g = int(tenant[b]) & 0x7FFFFFFF
        for i in range(c):
            p = p0 + i
            if not lo <= p < T:
                continue
            t = int(hist_tokens[s, p % W])
            for n in range(1, n_max + 1):
                if p - n < lo:
                    break
                ctx = [int(hist_tokens[s, (p - k) % W]) for k in range(1, n + 1)]
                e, gg = _entry(ctx, t, g, co, NB, C)
                ups.append(((b * max_pos + i) * n_max + n - 1, e, gg, t))
    tg, tk, ct = tag.view(-1), tok.view(-1), cnt.view(-1)
    winner: dict[int, int] = {}
    for u, e, g, t in ups:
        match = int(tg[e]) == g and int(tk[e]) == t
        if not match or int(ct[e]) >= CAP:
            winner[e] = min(winner.get(e, IMAX), u)
    byu = {u: (e, g, t) for u, e, g, t in ups}
    for e, u in winner.items():
        _, g, t = byu[u]
        match = int(tg[e]) == g and int(tk[e]) == t
        half = int(ct[e]) >> 1
        if not match and half == 0:
            tg[e], tk[e], ct[e] = g, t, 0
        else:
            ct[e] = half
    for u, e, g, t in ups:
        if int(tg[e]) == g and int(tk[e]) == t:
            ct[e] += 1


def corpus_lookup_oracle(tag, tok, cnt, coef, hist_tokens, hist_lens, slots, tenant, out_tokens, out_len,
                         out_match_len, out_match_count, out_score, out_q, n_max: int, alpha: int,
                         tau: int) -> None:
    NB, C = tag.shape
    num_slots, W = hist_tokens.shape
    bs, D = out_tokens.shape
    co = coef.tolist()
    for t_ in (out_tokens, out_len, out_match_len, out_match_count, out_score, out_q):
        t_.zero_()
    for b in range(bs):
        s = int(slots[b])
        if not 0 <= s < num_slots:
            continue
        T = int(hist_lens[s])
        lo = max(0, T - W)
        seq = [int(hist_tokens[s, p % W]) for p in range(max(lo, T - n_max), T)]
        g = int(tenant[b]) & 0x7FFFFFFF
        surv, score = 1 << 16, 0
        for j in range(D):
            best_n = None
            for n in range(1, min(n_max, len(seq)) + 1):
                ctx = seq[::-1][:n]
                b1 = _hash(ctx, g, co, 0) & (NB - 1)
                gg = _hash(ctx, g, co, 1) + 1
                cands = [(int(cnt[b1, c]), -c) for c in range(C) if int(tag[b1, c]) == gg and int(cnt[b1, c]) > 0]
                if cands:
                    best_n = (n, sum(x for x, _ in cands), max(cands), b1)
            if best_n is None:
                break
            n, tot, (best, negc), b1 = best_n
            q = (best << 16) // (tot + alpha)
            ns = (surv * q) >> 16
            if ns < tau:
                break
            t = int(tok[b1, -negc])
            surv = ns
            score += ns
            out_tokens[b, j] = t
            out_q[b, j] = q
            if j == 0:
                out_match_len[b], out_match_count[b] = n, tot
            out_len[b] = j + 1
            seq.append(t)
        out_score[b] = score
