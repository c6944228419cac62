"""Samples of the cross-request corpus's drafts, for fitting its calibration (``corpus_table.py``).

Documents are replayed through a real ``NgramCorpus`` (torch backend) as a server would see them: ``batch``
documents decode side by side, one token a step (every output position is a draft point, as in
``samples.py``), the corpus learns each document's output tokens as they are produced (not its prompt, as the
worker), and a finished document's slot takes the next one, in order. So a draft can draw on earlier documents
and on the ones decoding beside it, and on the running one's own output, which is what the worker's corpus does.

At each point the corpus's draft is scored against the document's next tokens: its token ``j`` is *tried* if
tokens ``0 .. j-1`` matched and the document still has a token there, and *accepted* if it matched too. Kept per
draft: the lookup's features (match length, context count), the corpus's own per-token estimate ``q`` and the
tried / accepted flags. Offline code: it reads the device freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["CorpusSamples", "corpus_samples"]


@dataclass
class CorpusSamples:
    """One row per corpus draft (drafts of length 0 are not kept): ``doc``, ``match_len``, ``match_count``
    ``[N]`` int32, the corpus's ``q [N, D]`` float64 (0 past the draft) and ``tried`` / ``accepted [N, D]`` bool."""

    doc: np.ndarray
    match_len: np.ndarray
    match_count: np.ndarray
    q: np.ndarray
    tried: np.ndarray
    accepted: np.ndarray

    def __len__(self) -> int:
        return int(self.doc.shape[0])

    def subset(self, mask: np.ndarray) -> "CorpusSamples":
        return CorpusSamples(self.doc[mask], self.match_len[mask], self.match_count[mask], self.q[mask],
                             self.tried[mask], self.accepted[mask])


def _score(tokens: np.ndarray, length: np.ndarray, truth: np.ndarray, known: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(tried, accepted) [n, D]`` of drafts ``tokens [n, D]`` (``length``) against ``truth [n, D]``, of which
    the first ``known[n]`` tokens exist."""
    D = tokens.shape[1]
    col = np.arange(D)[None, :]
    valid = (col < length[:, None]) & (col < known[:, None])
    eq = (tokens == truth) & valid
    before = np.cumprod(np.concatenate([np.ones((len(tokens), 1), bool), eq[:, :-1]], 1), 1).astype(bool)
    tried = valid & before
    return tried, tried & eq


def corpus_samples(docs: Sequence[np.ndarray], prompt_lens: Sequence[int] | np.ndarray, corpus_cfg, max_draft: int,
                   *, batch: int = 32) -> CorpusSamples:
    """Replay ``docs`` (token arrays; the first ``prompt_lens[k]`` tokens are the prompt) through a fresh
    ``NgramCorpus(corpus_cfg)`` drafting up to ``max_draft`` tokens, ``batch`` documents at a time (see the
    module docstring)."""
    import torch

    from ..ngram import TokenHistory
    from ..ngram.corpus import NgramCorpus
    from .samples import check_docs

    plen = check_docs(docs, prompt_lens)
    if max_draft < 1 or batch < 1:
        raise ValueError(f"max_draft and batch must be >= 1, got {max_draft}, {batch}")
    lens = np.array([len(d) for d in docs], dtype=np.int64)
    D = int(max_draft)
    cols: dict[str, list] = {k: [] for k in ("doc", "match_len", "match_count", "q", "tried", "accepted")}
    if len(docs):
        W = int(lens.max()) + 1
        hist = TokenHistory(batch, W, "cpu", backend="torch", max_batch_size=batch, max_draft=D)
        corpus = NgramCorpus(corpus_cfg, "cpu", backend="torch", max_batch_size=batch, max_draft=D)
        padded = [np.concatenate([np.asarray(d, np.int64), np.full(D, -1, np.int64)]) for d in docs]
        slot_doc = np.full(batch, -1, np.int64)  # the document each slot decodes (-1: idle)
        pos = np.zeros(batch, np.int64)  # its history length
        nxt = 0
        one = torch.ones(batch, dtype=torch.int32)
        while True:
            for s in range(batch):  # idle or finished slots take the next document
                while (slot_doc[s] < 0 or pos[s] >= lens[slot_doc[s]]) and nxt < len(docs):
                    k, nxt = nxt, nxt + 1
                    if plen[k] >= lens[k]:
                        continue  # nothing to draft
                    p = torch.as_tensor(np.asarray(docs[k][: max(plen[k], 1)], np.int32)).view(1, -1)
                    hist.write_prompt(torch.tensor([s]), p, torch.tensor([plen[k]], dtype=torch.int32))
                    slot_doc[s], pos[s] = k, plen[k]
                if slot_doc[s] >= 0 and pos[s] >= lens[slot_doc[s]]:
                    slot_doc[s] = -1
            act = np.nonzero(slot_doc >= 0)[0]
            if len(act) == 0:
                break
            slots = torch.as_tensor(act, dtype=torch.int64)
            d = corpus.lookup(hist, slots)
            length = d.length.numpy().astype(np.int64)
            tok = d.tokens.numpy().astype(np.int64)
            truth = np.stack([padded[slot_doc[s]][pos[s]: pos[s] + D] for s in act])
            known = np.array([lens[slot_doc[s]] - pos[s] for s in act])
            tried, acc = _score(tok, length, truth, known)
            keep = length > 0
            if keep.any():
                cols["doc"].append(slot_doc[act][keep])
                cols["match_len"].append(d.match_len.numpy()[keep])
                cols["match_count"].append(d.match_count.numpy()[keep])
                cols["q"].append(d.q.numpy()[keep] / 65536.0)
                cols["tried"].append(tried[keep])
                cols["accepted"].append(acc[keep])
            new = torch.as_tensor(truth[:, :1].astype(np.int32))  # the next token of each document
            hist.append(slots, new, one[: len(act)])
            corpus.insert(hist, slots, one[: len(act)])
            pos[act] += 1
    if not cols["doc"]:
        z = np.zeros(0, np.int32)
        return CorpusSamples(z, z, z, np.zeros((0, D)), np.zeros((0, D), bool), np.zeros((0, D), bool))
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    return CorpusSamples(cat["doc"].astype(np.int32), cat["match_len"].astype(np.int32),
                         cat["match_count"].astype(np.int32), cat["q"].astype(np.float64), cat["tried"],
                         cat["accepted"])
