"""Replays: the vectorised replay equals the literal TokenHistory replay, and a hand-worked example."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_hybrid.calibration import samples_from_docs, samples_via_history
from sglang_hybrid.calibration.samples import Samples
from sglang_hybrid.calibration.sources import text_token_docs
from sglang_hybrid.ngram import NgramConfig

FIELDS = ["doc", "pos", "match_len", "match_count", "in_prompt", "draft_len", "observed", "accepted", "agree"]


def _random_docs(rng: np.random.Generator, n: int) -> tuple[list[np.ndarray], list[int]]:
    docs, plens = [], []
    for _ in range(n):
        D = int(rng.integers(2, 70))
        x = rng.integers(0, int(rng.integers(2, 6)), size=D)
        if D > 24 and rng.random() < 0.5:  # a long copy, so that n_max-capped matches occur
            x[12:24] = x[0:12]
        docs.append(x)
        plens.append(int(rng.integers(1, D + 1)))
    return docs, plens


@pytest.mark.parametrize("cfg", [NgramConfig(2, 8, 16, 0), NgramConfig(1, 3, 5, 0), NgramConfig(3, 3, 1, 0)])
def test_fast_replay_equals_token_history_replay(cfg):
    rng = np.random.default_rng(cfg.n_min * 100 + cfg.n_max)
    docs, plens = _random_docs(rng, 14)
    model_first = [rng.integers(0, 3, size=len(d)) for d in docs]
    fast = samples_from_docs(docs, plens, cfg.n_min, cfg.n_max, cfg.max_draft, model_first=model_first).sorted()
    slow = samples_via_history(docs, plens, cfg, batch=5, model_first=model_first)
    assert len(fast) > 30
    for f in FIELDS:
        assert np.array_equal(getattr(fast, f), getattr(slow, f)), f
    assert np.all(fast.accepted <= fast.observed) and np.all(fast.observed <= fast.draft_len)
    assert np.all((fast.match_len >= cfg.n_min) & (fast.match_len <= cfg.n_max))


def test_hand_worked_example():
    doc = np.array([5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8])
    s = samples_from_docs([doc], [5], 2, 8, 4)
    rows = list(zip(s.pos, s.match_len, s.match_count, s.in_prompt, s.draft_len, s.observed, s.accepted))
    assert [tuple(int(v) for v in r) for r in rows] == [
        (6, 2, 1, 1, 4, 4, 1),  # "5 6" -> copies "7 8 5 6"; the text goes on "7 9": one accepted
        (7, 3, 1, 1, 4, 4, 0),  # "5 6 7" -> "8 ..." but the text says 9
        (10, 2, 2, 0, 4, 2, 1),  # "5 6" seen twice; the most recent (after the prompt) is copied: "7 9 ..."
        (11, 3, 2, 0, 4, 1, 0),  # only one token of text left to check
    ]
    assert s.agree is None


def test_input_validation():
    with pytest.raises(ValueError, match=r"prompt_lens\[0\]=0"):
        samples_from_docs([np.arange(5)], [0], 2, 8, 16)
    with pytest.raises(ValueError, match="prompt_lens has shape"):
        samples_from_docs([np.arange(5)], [1, 2], 2, 8, 16)
    with pytest.raises(ValueError, match="n_min <= n_max"):
        samples_from_docs([np.arange(5)], [1], 3, 2, 16)
    with pytest.raises(ValueError, match="model_first"):
        samples_from_docs([np.arange(5)], [1], 2, 8, 16, model_first=[np.arange(4)])
    assert len(samples_from_docs([], [], 2, 8, 16)) == 0


def test_text_docs_chunking_and_prompt_split_are_seeded():
    docs = [np.arange(100), np.arange(10), np.arange(2500)]
    a, pa = text_token_docs(docs, seed=3, max_doc_tokens=1000, min_doc_tokens=32)
    b, pb = text_token_docs(docs, seed=3, max_doc_tokens=1000, min_doc_tokens=32)
    assert [len(x) for x in a] == [100, 1000, 1000, 500]  # the 10-token document is too short
    assert np.array_equal(pa, pb) and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert np.all((pa >= 0.2 * np.array([len(x) for x in a]) - 1) & (pa <= 0.8 * np.array([len(x) for x in a])))
    _, pc = text_token_docs(docs, seed=4, max_doc_tokens=1000, min_doc_tokens=32)
    assert not np.array_equal(pa, pc)


def test_concat_and_subset():
    rng = np.random.default_rng(0)
    docs, plens = _random_docs(rng, 6)
    s = samples_from_docs(docs, plens, 2, 8, 16)
    half = len(s) // 2
    both = Samples.concat([s.subset(np.arange(half)), s.subset(np.arange(half, len(s)))])
    for f in FIELDS[:-1]:
        assert np.array_equal(getattr(both, f), getattr(s, f))
