"""Calibration samples: replay token sequences through the n-gram drafter and record each draft's outcome.

A *document* is a token sequence ``x[0..D)`` with a prompt length ``P`` (``1 <= P < D``). The replay mirrors a
decode: the history starts as the prompt plus the first generated token, and at every history length
``T = P+1 .. D-1`` the drafter looks up a chain from ``x[0..T)``; draft token ``j`` (1-based) is *accepted* iff it
equals ``x[T-1+j]`` and tokens ``1..j-1`` were accepted. The text after ``T`` plays the target model (source
"text itself"), or is a model's own greedy continuation (source "model"). Only positions inside the document
have an outcome: ``observed = min(draft_len, D - T)``.

Two replays give identical samples (tested):

* :func:`samples_via_history`: the production path, literally: many documents as parallel slots of a
  ``TokenHistory``, a batched ``lookup`` per step, ``append`` of the next token. Exact for any ``NgramConfig``
  but slow on CPU (the torch backend loops in Python).
* :func:`samples_from_docs`: a vectorised numpy replay of the same semantics (``ngram/reference.py``) for
  ``window == 0`` and a history that holds the whole document (no ring-buffer wrap): n-gram identities by
  iterated ranking, "most recent earlier occurrence" and "occurrences so far" by a stable sort. This is what
  fits the shipped table.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Sequence

import numpy as np

__all__ = ["Samples", "samples_from_docs", "samples_via_history", "check_docs"]


@dataclass
class Samples:
    """One row per draft (a lookup that found a match). All arrays int32 of length ``S`` (``agree`` int8 or None).

    ``doc``: document index; ``pos``: history length ``T`` at the lookup; ``match_len``/``match_count``/
    ``in_prompt``: the drafter's features; ``draft_len``: tokens drafted; ``observed``: how many of them have a
    known outcome; ``accepted``: leading tokens accepted (``<= observed``); ``agree``: first n-gram token equals
    the model drafter's first token (only when a model drafter was replayed).
    """

    doc: np.ndarray
    pos: np.ndarray
    match_len: np.ndarray
    match_count: np.ndarray
    in_prompt: np.ndarray
    draft_len: np.ndarray
    observed: np.ndarray
    accepted: np.ndarray
    agree: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return int(self.doc.shape[0])

    def subset(self, mask: np.ndarray) -> "Samples":
        """Rows where ``mask`` (bool array or index array) selects."""
        return Samples(**{f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[mask])
                          for f in fields(self)})

    def sorted(self) -> "Samples":
        """Rows ordered by (doc, pos)."""
        return self.subset(np.lexsort((self.pos, self.doc)))

    @staticmethod
    def concat(parts: Sequence["Samples"]) -> "Samples":
        """Concatenate sample sets (all with or all without ``agree``)."""
        has_agree = {p.agree is not None for p in parts}
        if len(has_agree) > 1:
            raise ValueError("cannot concatenate samples with and without 'agree'")
        out = {}
        for f in fields(Samples):
            vals = [getattr(p, f.name) for p in parts]
            out[f.name] = None if vals and vals[0] is None else np.concatenate(vals) if vals else np.zeros(0, np.int32)
        return Samples(**out)


def check_docs(docs: Sequence[np.ndarray], prompt_lens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Validate documents and prompt lengths (``1 <= P <= D``); returns prompt lengths as int64."""
    p = np.asarray(prompt_lens, dtype=np.int64)
    if p.shape != (len(docs),):
        raise ValueError(f"prompt_lens has shape {p.shape}, expected ({len(docs)},)")
    for i, (d, pl) in enumerate(zip(docs, p)):
        if np.asarray(d).ndim != 1:
            raise ValueError(f"docs[{i}] must be 1-D")
        if not 1 <= pl <= len(d):
            raise ValueError(f"prompt_lens[{i}]={pl} must be in [1, len(docs[{i}])={len(d)}]")
    return p


def _rank(keys: np.ndarray) -> np.ndarray:
    return np.unique(keys, return_inverse=True)[1].astype(np.int64)


def samples_from_docs(
    docs: Sequence[np.ndarray],
    prompt_lens: Sequence[int] | np.ndarray,
    n_min: int,
    n_max: int,
    max_draft: int,
    model_first: Optional[Sequence[np.ndarray]] = None,
    chunk: int = 1 << 18,
) -> Samples:
    """Vectorised replay (``window == 0``, unbounded history width); see the module docstring.

    ``model_first[d][i]``, if given, is the model drafter's first-token proposal after ``x[0..i]`` (a
    prediction of ``x[i+1]``); it yields the ``agree`` feature.
    """
    if not 1 <= n_min <= n_max or max_draft < 1:
        raise ValueError(f"need 1 <= n_min <= n_max and max_draft >= 1, got {n_min}, {n_max}, {max_draft}")
    plen = check_docs(docs, prompt_lens)
    ndoc = len(docs)
    lens = np.array([len(d) for d in docs], dtype=np.int64)
    if ndoc == 0 or lens.sum() == 0:
        return _empty(model_first is not None)
    tok = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs])
    if tok.min() < 0:
        raise ValueError("token ids must be non-negative")
    start = np.concatenate([[0], np.cumsum(lens)[:-1]])
    doc_of = np.repeat(np.arange(ndoc, dtype=np.int64), lens)
    local = np.arange(tok.shape[0], dtype=np.int64) - start[doc_of]
    vocab = int(tok.max()) + 1

    # The query positions: last history index i = T - 1 for T = P+1 .. D-1.
    q_doc = np.repeat(np.arange(ndoc), np.maximum(lens - 1 - plen, 0))
    q_i = np.concatenate([np.arange(s + p, s + d - 1, dtype=np.int64) for s, p, d in zip(start, plen, lens)])
    best = np.zeros(q_i.shape[0], dtype=np.int64)
    best_e = np.full(q_i.shape[0], -1, dtype=np.int64)
    best_cnt = np.zeros(q_i.shape[0], dtype=np.int64)

    gid = _rank(doc_of * vocab + tok)  # 1-gram identity, distinct across documents
    for n in range(1, n_max + 1):
        if n > 1:
            valid = local >= n - 1
            keys = np.full(tok.shape[0], -1, dtype=np.int64)
            idx = np.nonzero(valid)[0]
            keys[idx] = gid[idx - 1] * vocab + tok[idx]
            new = np.full(tok.shape[0], -1, dtype=np.int64)
            new[idx] = _rank(keys[idx])
            gid = new
        if n < n_min:
            continue
        idx = np.nonzero(gid >= 0)[0]
        order = idx[np.argsort(gid[idx], kind="stable")]  # grouped by n-gram, positions ascending
        g = gid[order]
        same = np.zeros(order.shape[0], dtype=bool)
        same[1:] = g[1:] == g[:-1]
        prev = np.full(tok.shape[0], -1, dtype=np.int64)
        prev[order[1:][same[1:]]] = order[:-1][same[1:]]
        k = np.arange(order.shape[0])
        group_start = np.maximum.accumulate(np.where(~same, k, 0))
        count = np.zeros(tok.shape[0], dtype=np.int64)
        count[order] = k - group_start  # earlier occurrences of the n-gram ending here
        c = count[q_i]
        hit = c > 0
        best[hit] = n
        best_e[hit] = prev[q_i[hit]]
        best_cnt[hit] = c[hit]

    keep = best >= n_min
    i = q_i[keep]
    e = best_e[keep]
    d = q_doc[keep]
    end = start[d] + lens[d]
    draft_len = np.minimum(max_draft, i - e)
    observed = np.minimum(draft_len, end - 1 - i)
    accepted = np.zeros(i.shape[0], dtype=np.int64)
    cols = np.arange(max_draft, dtype=np.int64)
    for s in range(0, i.shape[0], chunk):
        sl = slice(s, s + chunk)
        a = e[sl, None] + 1 + cols
        b = i[sl, None] + 1 + cols
        ok = cols < observed[sl, None]
        eq = (tok[np.minimum(a, tok.shape[0] - 1)] == tok[np.minimum(b, tok.shape[0] - 1)]) & ok
        accepted[sl] = np.cumprod(eq, axis=1).sum(axis=1)
    agree = None
    if model_first is not None:
        if len(model_first) != ndoc or any(len(m) != n for m, n in zip(model_first, lens)):
            raise ValueError("model_first must hold one array per document, as long as the document")
        mf = np.concatenate([np.asarray(m, dtype=np.int64) for m in model_first])
        agree = (tok[e + 1] == mf[i]).astype(np.int8)
    return Samples(
        doc=d.astype(np.int32),
        pos=(i - start[d] + 1).astype(np.int32),
        match_len=best[keep].astype(np.int32),
        match_count=best_cnt[keep].astype(np.int32),
        in_prompt=((e + 1 - start[d]) < plen[d]).astype(np.int32),
        draft_len=draft_len.astype(np.int32),
        observed=observed.astype(np.int32),
        accepted=accepted.astype(np.int32),
        agree=agree,
    )


def _empty(with_agree: bool) -> Samples:
    z = np.zeros(0, dtype=np.int32)
    return Samples(z, z, z, z, z, z, z, z, np.zeros(0, dtype=np.int8) if with_agree else None)


def samples_via_history(
    docs: Sequence[np.ndarray],
    prompt_lens: Sequence[int] | np.ndarray,
    cfg,
    *,
    batch: int = 64,
    width: Optional[int] = None,
    backend: str = "torch",
    model_first: Optional[Sequence[np.ndarray]] = None,
) -> Samples:
    """Replay through the real ``TokenHistory`` (``batch`` documents as parallel slots, one batched lookup per
    step). ``width`` defaults to the longest document (no wrap); a smaller one exercises the ring buffer."""
    import torch

    from sglang_hybrid.ngram import TokenHistory

    plen = check_docs(docs, prompt_lens)
    lens = np.array([len(d) for d in docs], dtype=np.int64)
    if len(docs) == 0:
        return _empty(model_first is not None)
    W = int(width if width is not None else max(1, lens.max()))
    parts: list[Samples] = []
    for b0 in range(0, len(docs), batch):
        ids = list(range(b0, min(b0 + batch, len(docs))))
        bs = len(ids)
        hist = TokenHistory(bs, W, "cpu", backend=backend, max_draft=cfg.max_draft)
        P = int(max(plen[k] for k in ids))
        prompt = torch.zeros((bs, P), dtype=torch.int32)
        for r, k in enumerate(ids):
            prompt[r, : plen[k]] = torch.as_tensor(np.asarray(docs[k][: plen[k]], dtype=np.int32))
        slots = torch.arange(bs, dtype=torch.int32)
        hist.write_prompt(slots, prompt, torch.as_tensor(plen[ids], dtype=torch.int32))
        T = plen[ids].copy()  # current history length per slot
        rows: dict[str, list[int]] = {f.name: [] for f in fields(Samples) if f.name != "agree"}
        agree_rows: list[int] = []
        while True:
            # Append the next token to every slot that still has one (the first step appends x[P]).
            grow = [r for r, k in enumerate(ids) if T[r] < lens[k]]
            if not grow:
                break
            new = torch.tensor([[int(docs[ids[r]][T[r]])] for r in grow], dtype=torch.int32)
            sl = torch.tensor(grow, dtype=torch.int32)
            hist.append(sl, new, torch.ones(len(grow), dtype=torch.int32))
            for r in grow:
                T[r] += 1
            active = [r for r in grow if T[r] <= lens[ids[r]] - 1]
            if not active:
                continue
            dr = hist.lookup(torch.tensor(active, dtype=torch.int32), cfg)
            toks = dr.tokens.numpy()
            for a, r in enumerate(active):
                L = int(dr.length[a])
                if L == 0:
                    continue
                k = ids[r]
                t = int(T[r])
                x = docs[k]
                obs = min(L, int(lens[k]) - t)
                acc = 0
                while acc < obs and int(toks[a, acc]) == int(x[t + acc]):
                    acc += 1
                for name, v in (("doc", k), ("pos", t), ("match_len", int(dr.match_len[a])),
                                ("match_count", int(dr.match_count[a])), ("in_prompt", int(dr.in_prompt[a])),
                                ("draft_len", L), ("observed", obs), ("accepted", acc)):
                    rows[name].append(v)
                if model_first is not None:
                    agree_rows.append(int(int(toks[a, 0]) == int(model_first[k][t - 1])))
        parts.append(Samples(**{n: np.asarray(v, dtype=np.int32) for n, v in rows.items()},
                             agree=np.asarray(agree_rows, dtype=np.int8) if model_first is not None else None))
    return Samples.concat(parts).sorted()
