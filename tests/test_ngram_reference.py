"""The vectorized torch reference of the n-gram drafter against the brute-force oracle."""

from __future__ import annotations

import random

import pytest
import torch

from sglang_hybrid.ngram import reference as ref
from tests.oracles.ngram_oracle import (
    history_append_oracle,
    history_reset_oracle,
    history_write_prompt_oracle,
    lookup_from_list,
    new_outputs,
    ngram_lookup_oracle,
)


def _random_table(rng: random.Random, ns: int, width: int, vocab: int):
    tokens = torch.tensor([[rng.randrange(vocab) for _ in range(width)] for _ in range(ns)], dtype=torch.int32)
    lens = torch.tensor([rng.randrange(3 * width + 2) for _ in range(ns)], dtype=torch.int32)
    plens = torch.tensor([rng.randrange(int(t) + 1) for t in lens], dtype=torch.int32)
    return tokens, lens, plens


def _lookup_both(state, slots, n_min, n_max, window, max_draft):
    bs = slots.shape[0]
    a, b = new_outputs(bs, max_draft), new_outputs(bs, max_draft)
    ref.ngram_lookup_ref(*state, slots, *a, n_min, n_max, window)
    ngram_lookup_oracle(*state, slots, *b, n_min, n_max, window)
    return a, b


@pytest.mark.parametrize("trim", [True, False], ids=["cpu_trim", "static_shapes"])
@pytest.mark.parametrize("seed", range(4))
def test_lookup_matches_oracle_random(seed: int, trim: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ref, "_TRIM_ON_CPU", trim)
    rng = random.Random(seed)
    for _ in range(40):
        ns, width = rng.randint(1, 5), rng.randint(1, 30)
        state = _random_table(rng, ns, width, vocab=rng.randint(1, 4))
        slots = torch.tensor([rng.randrange(-1, ns + 1) for _ in range(rng.randint(1, 7))], dtype=torch.int64)
        n_min = rng.randint(1, 3)
        n_max = rng.randint(n_min, 6)
        window = rng.choice([0, 0, 1, 2, 3, 7, 100])
        a, b = _lookup_both(state, slots, n_min, n_max, window, rng.randint(1, 8))
        for x, y in zip(a, b):
            assert torch.equal(x, y), (seed, width, state, slots, n_min, n_max, window, a, b)


@pytest.mark.parametrize("trim", [True, False], ids=["cpu_trim", "static_shapes"])
def test_lookup_matches_oracle_in_several_chunks(monkeypatch: pytest.MonkeyPatch, trim: bool) -> None:
    monkeypatch.setattr(ref, "_LOOKUP_CHUNK_ELEMS", 400)  # 3 rows per chunk, ragged last chunk
    monkeypatch.setattr(ref, "_TRIM_ON_CPU", trim)  # False: the static-shape path a GPU table runs
    rng = random.Random(11)
    state = _random_table(rng, 9, 24, vocab=3)
    slots = torch.tensor([8, 0, 3, 3, 5, 1, 2, 7, 6, 4, -1], dtype=torch.int32)
    a, b = _lookup_both(state, slots, 2, 5, 0, 6)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert int(a[1].count_nonzero()) > 0  # some row drafted: the comparison is not vacuous


def test_lookup_planted_repeat_and_ties() -> None:
    # "5 6 7" occurs ending at 3, 7 and 11 and is also the suffix: the most recent earlier occurrence wins.
    hist = [1, 5, 6, 7, 2, 5, 6, 7, 3, 5, 6, 7, 4, 9, 5, 6, 7]
    tokens = torch.tensor([hist + [0] * 3], dtype=torch.int32)
    lens = torch.tensor([len(hist)], dtype=torch.int32)
    plens = torch.tensor([6], dtype=torch.int32)
    out = new_outputs(1, 4)
    ref.ngram_lookup_ref(tokens, lens, plens, torch.tensor([0]), *out, 2, 8, 0)
    # ends 3, 7, 11 all match "5 6 7" with m = 3 ("x 5 6 7" differs before); latest is end 11 -> "4 9 5 6".
    assert out[0].tolist() == [[4, 9, 5, 6]]
    assert [int(t) for t in out[1:]] == [4, 3, 3, 0]
    assert lookup_from_list(hist, 6, 20, 2, 8, 0, 4) == ([4, 9, 5, 6], 4, 3, 3, 0)


def test_write_append_reset_match_oracle() -> None:
    rng = random.Random(5)
    for _ in range(60):
        ns, width = rng.randint(1, 5), rng.randint(1, 20)
        state = _random_table(rng, ns, width, vocab=9)
        other = tuple(t.clone() for t in state)
        slots = torch.tensor(rng.sample(range(-1, ns + 1), rng.randint(1, ns + 2)), dtype=torch.int64)
        bs = slots.shape[0]
        plen = rng.randint(0, 2 * width + 1)
        prompt = torch.randint(0, 9, (bs, plen), dtype=torch.int32)
        prompt_len = torch.randint(-1, plen + 2, (bs,), dtype=torch.int32)
        ref.history_write_prompt_ref(*state, slots, prompt, prompt_len)
        history_write_prompt_oracle(*other, slots, prompt, prompt_len)
        assert all(torch.equal(x, y) for x, y in zip(state, other))
        k = rng.randint(0, 2 * width)  # the raw functions accept K > width: the newest `width` survive
        new = torch.randint(0, 9, (bs, k), dtype=torch.int32)
        counts = torch.randint(-1, k + 2, (bs,), dtype=torch.int64)
        ref.history_append_ref(state[0], state[1], slots, new, counts)
        history_append_oracle(other[0], other[1], slots, new, counts)
        assert all(torch.equal(x, y) for x, y in zip(state, other))
        dup = torch.cat([slots, slots])  # duplicates are fine for reset
        ref.history_reset_ref(state[1], state[2], dup)
        history_reset_oracle(other[1], other[2], dup)
        assert all(torch.equal(x, y) for x, y in zip(state, other))


def test_ring_semantics_against_a_plain_list() -> None:
    """Ring layout, independent check: the table after many appends behaves as the last W tokens of a list."""
    rng = random.Random(3)
    width = 11
    tokens = torch.zeros((2, width), dtype=torch.int32)
    lens = torch.zeros(2, dtype=torch.int32)
    plens = torch.zeros(2, dtype=torch.int32)
    hist = [rng.randrange(3) for _ in range(7)]
    slot = torch.tensor([1])
    ref.history_write_prompt_ref(tokens, lens, plens, slot, torch.tensor([hist], dtype=torch.int32),
                                 torch.tensor([len(hist)]))
    for step in range(25):  # goes several times around the ring
        c = rng.randint(1, 4)
        new = [rng.randrange(3) for _ in range(c)]
        ref.history_append_ref(tokens, lens, slot, torch.tensor([new + [0]], dtype=torch.int32), torch.tensor([c]))
        hist += new
        for window in (0, 4):
            out = new_outputs(1, 5)
            ref.ngram_lookup_ref(tokens, lens, plens, slot, *out, 2, 4, window)
            draft, n, m, cnt, inp = lookup_from_list(hist, 7, width, 2, 4, window, 5)
            assert out[0][0, :n].tolist() == draft and int(out[0][0, n:].count_nonzero()) == 0
            assert [int(out[1]), int(out[2]), int(out[3]), int(out[4])] == [n, m, cnt, inp], step
    assert int(lens[1]) == len(hist) > 3 * width


def test_128k_history_single_row() -> None:
    """A 128k-token history: a long planted copy is found, far back, in one vectorized pass."""
    T = 128 * 1024
    g = torch.Generator().manual_seed(0)
    row = torch.randint(0, 50_000, (T,), generator=g, dtype=torch.int32)
    row[T - 12 :] = row[1000:1012]  # the suffix repeats a span near the start
    tokens = row[None, :].clone()
    lens = torch.tensor([T], dtype=torch.int32)
    plens = torch.tensor([T // 2], dtype=torch.int32)
    out = new_outputs(1, 16)
    ref.ngram_lookup_ref(tokens, lens, plens, torch.tensor([0]), *out, 2, 8, 0)
    assert out[0][0].tolist() == row[1012:1028].tolist()
    assert [int(out[1]), int(out[2]), int(out[3]), int(out[4])] == [16, 8, 1, 1]
    # A window that does not reach back to the copy finds nothing this long.
    ref.ngram_lookup_ref(tokens, lens, plens, torch.tensor([0]), *out, 8, 8, 4096)
    assert int(out[1]) == 0 and int(out[0].count_nonzero()) == 0
