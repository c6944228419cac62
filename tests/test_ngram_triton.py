"""The Triton kernels of the n-gram drafter against the torch reference, exactly.

The kernels run on ``kernel_device`` (``$HYBRID_TEST_DEVICE``: the interpreter on CPU by default, compiled on
CUDA from ``scripts/gpu_check.sh``); the torch reference always runs on CPU copies of the same inputs, and the
outputs must be identical.
"""

from __future__ import annotations

import os
import random

if (os.environ.get("HYBRID_TEST_DEVICE", "cpu") or "cpu").startswith("cpu"):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/conftest.py does it too)

import pytest
import torch

from sglang_hybrid.ngram import kernels as tk
from sglang_hybrid.ngram import reference as ref
from tests.oracles.ngram_oracle import lookup_from_list, new_outputs

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _table(rows: list[list[int]], width: int, prompt_lens: list[int] | None = None) -> State:
    """A table whose slot i holds the logical history ``rows[i]`` (ring layout, newest ``width`` kept)."""
    ns = len(rows)
    tokens = torch.full((ns, width), -5, dtype=torch.int32)  # stale garbage where nothing was written
    for i, h in enumerate(rows):
        for p in range(max(0, len(h) - width), len(h)):
            tokens[i, p % width] = h[p]
    lens = torch.tensor([len(h) for h in rows], dtype=torch.int32)
    plens = torch.tensor(prompt_lens if prompt_lens is not None else [len(h) // 2 for h in rows], dtype=torch.int32)
    return tokens, lens, plens


def _on(dev: torch.device, ts):
    """``ts`` (tensors) copied to ``dev`` (the same tensors when already there)."""
    return tuple(t.to(dev) for t in ts)


def _lookup(state: State, slots, n_min: int, n_max: int, window: int, max_draft: int,
            dev: torch.device) -> list[torch.Tensor]:
    """Run the reference on CPU and the kernel on ``dev``; assert identical outputs; return them (CPU)."""
    slots = torch.as_tensor(slots, dtype=torch.int64) if not isinstance(slots, torch.Tensor) else slots
    a, b = new_outputs(slots.shape[0], max_draft), _on(dev, new_outputs(slots.shape[0], max_draft))
    ref.ngram_lookup_ref(*state, slots, *a, n_min, n_max, window)
    tk.ngram_lookup_triton(*_on(dev, state), slots.to(dev), *b, n_min, n_max, window)
    b = [y.cpu() for y in b]
    for x, y in zip(a, b):
        assert torch.equal(x, y), (a, b)
    return a


@pytest.fixture(params=[16, "default"], ids=["block16", "block_default"])
def scan_block(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a test with the default scan block and with 16-end blocks (many loop iterations per program)."""
    if request.param != "default":
        monkeypatch.setattr(tk, "LOOKUP_BLOCK", request.param)


def _rand_hist(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_lookup_random_histories(seed: int, scan_block: None, kernel_device: torch.device) -> None:
    rng = random.Random(seed)
    for _ in range(10):
        width = rng.randint(2, 40)
        rows = [_rand_hist(rng, rng.randint(0, 3 * width), rng.randint(1, 4)) for _ in range(rng.randint(1, 4))]
        state = _table(rows, width, [rng.randint(0, len(h)) for h in rows])
        slots = [rng.randrange(-1, len(rows) + 1) for _ in range(rng.randint(1, 6))]
        n_min = rng.randint(1, 3)
        n_max, window, max_draft = rng.randint(n_min, 6), rng.choice([0, 1, 3, 8, 100]), rng.randint(1, 9)
        _lookup(state, slots, n_min, n_max, window, max_draft, kernel_device)


def test_lookup_planted_repeats_and_no_repeats(scan_block: None, kernel_device: torch.device) -> None:
    rng = random.Random(1)
    width = 300
    planted = _rand_hist(rng, 200, 1000)
    planted += planted[40:52]  # suffix repeats a span: copy of length 12 ending at 51
    distinct = list(range(1000, 1250))  # no token repeats: nothing can match
    short_copy = _rand_hist(rng, 120, 1000)
    short_copy += short_copy[10:13]  # m = 3 exactly (n_max 8), the continuation is long
    state = _table([planted, distinct, short_copy], width, [100, 250, 0])
    out = _lookup(state, [0, 1, 2], 2, 8, 0, 16, kernel_device)
    assert out[0][0].tolist() == planted[52:68] and int(out[1][0]) == 16 and int(out[2][0]) == 8
    assert int(out[4][0]) == 1  # continuation starts in the prompt
    assert int(out[1][1]) == 0 and int(out[0][1].count_nonzero()) == 0
    assert int(out[2][2]) == 3 and out[0][2].tolist() == short_copy[13:29] and int(out[4][2]) == 0


def test_lookup_short_histories(scan_block: None, kernel_device: torch.device) -> None:
    n_min = 3
    rows = [[], [4], [4, 4], [4, 4, 4], [4, 4, 4, 4], [1, 2, 1, 2]]  # lengths 0, 1, n_min-1, n_min, ...
    state = _table(rows, 16, [0, 1, 2, 3, 4, 2])
    out = _lookup(state, list(range(len(rows))), n_min, 8, 0, 4, kernel_device)
    assert out[1].tolist() == [0, 0, 0, 0, 1, 0]  # [4,4,4,4]: end 2 matches 3 -> draft "4"
    out = _lookup(state, list(range(len(rows))), 1, 8, 0, 4, kernel_device)
    assert out[1].tolist() == [0, 0, 1, 1, 1, 2]
    assert out[2].tolist() == [0, 0, 1, 2, 3, 2]


@pytest.mark.parametrize("wraps", [1, 2, 5])
def test_lookup_across_ring_wrap(wraps: int, scan_block: None, kernel_device: torch.device) -> None:
    rng = random.Random(wraps)
    width = 37
    rows = []
    for _ in range(3):
        h = _rand_hist(rng, wraps * width + rng.randint(0, width - 1), 6)
        h += h[-30:-24]  # plant a copy inside the visible part
        rows.append(h)
    rows.append(_rand_hist(rng, width + 1, 2))  # just past one wrap
    state = _table(rows, width, [len(h) - 3 for h in rows])
    for window, n_max, max_draft in [(0, 8, 16), (0, 3, 40), (5, 4, 8), (36, 8, 3), (1000, 2, 7)]:
        out = _lookup(state, [0, 1, 2, 3], 2, n_max, window, max_draft, kernel_device)
        for b, h in enumerate(rows):
            draft, n, m, cnt, inp = lookup_from_list(h, len(h) - 3, width, 2, n_max, window, max_draft)
            assert out[0][b, :n].tolist() == draft
            assert [int(out[1][b]), int(out[2][b]), int(out[3][b]), int(out[4][b])] == [n, m, cnt, inp]


def test_lookup_window_and_short_continuation(scan_block: None, kernel_device: torch.device) -> None:
    h = [9, 1, 2, 3, 8, 8, 8, 8, 8, 8, 8, 8, 5, 1, 2, 3]  # "1 2 3" recurs 12 positions back
    state = _table([h], 64, [4])
    full = _lookup(state, [0], 2, 8, 0, 16, kernel_device)
    assert full[0][0, :12].tolist() == h[4:16] and int(full[1][0]) == 12  # max_draft 16 > 12 remaining
    assert int(full[0][0, 12:].count_nonzero()) == 0
    assert int(full[4][0]) == 0  # continuation starts at 4, not < prompt_len 4
    # window 11: ends 4..14 only, the earlier "1 2 3" is out of reach
    near = _lookup(state, [0], 2, 8, 11, 16, kernel_device)
    assert int(near[1][0]) == 0 and int(near[0].count_nonzero()) == 0
    assert int(_lookup(state, [0], 2, 8, 12, 16, kernel_device)[2][0]) == 3  # window 12 reaches end 3


def test_lookup_ties_most_recent_wins(scan_block: None, kernel_device: torch.device) -> None:
    # Distinct filler; "1 2" ends at 10, 20, 26 and 42 (m = 2 each, preceded by filler, not 5); the suffix is
    # "5 1 2". Ends 10, 26, 42 share a lane of a 16-wide scan block, so ties also cross loop iterations.
    h = list(range(100, 160))
    for e in (10, 20, 26, 42):
        h[e - 1], h[e] = 1, 2
    h[-3:] = [5, 1, 2]
    state = _table([h], 64, [len(h)])
    out = _lookup(state, [0], 2, 8, 0, 3, kernel_device)
    assert out[0][0].tolist() == h[43:46] and out[3].tolist() == [4] and out[2].tolist() == [2]
    assert out[4].tolist() == [1]
    h[20 - 2] = 5  # end 20 now matches 3 tokens: the longer match beats the more recent ones
    out = _lookup(_table([h], 64, [0]), [0], 2, 8, 0, 3, kernel_device)
    assert out[0][0].tolist() == h[21:24] and out[3].tolist() == [1] and out[2].tolist() == [3]


def test_lookup_batches_and_slot_forms(kernel_device: torch.device) -> None:
    rng = random.Random(7)
    rows = [_rand_hist(rng, rng.randint(0, 90), 3) for _ in range(6)]
    state = _table(rows, 64)
    _lookup(state, [3], 2, 8, 0, 16, kernel_device)  # bs = 1
    mixed = [5, 0, 5, -1, 2, 6, 1, 1000]  # duplicates and out-of-range entries
    a = _lookup(state, torch.tensor(mixed, dtype=torch.int32), 2, 8, 0, 16, kernel_device)
    b = _lookup(state, torch.tensor(mixed, dtype=torch.int64), 2, 8, 0, 16, kernel_device)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    for i in (3, 5, 7):  # out-of-range slots give zero outputs
        assert all(int(t[i].count_nonzero()) == 0 for t in a)
    # Non-contiguous draft buffer (a column slice of a wider buffer), as TokenHistory.lookup passes it.
    dev = kernel_device
    wide = torch.full((8, 20), 9, dtype=torch.int32, device=dev)
    outs = [wide[:, :16]] + [torch.zeros(8, dtype=torch.int32, device=dev) for _ in range(4)]
    tk.ngram_lookup_triton(*_on(dev, state), torch.tensor(mixed, device=dev), *outs, 2, 8, 0)
    assert torch.equal(outs[0].cpu(), a[0]) and (wide[:, 16:] == 9).all()


def test_write_append_reset_state_matches_reference(kernel_device: torch.device) -> None:
    rng = random.Random(2)
    dev = kernel_device
    for _ in range(25):
        ns, width = rng.randint(1, 5), rng.randint(1, 24)
        rows = [_rand_hist(rng, rng.randint(0, 2 * width), 9) for _ in range(ns)]
        a = _table(rows, width)  # reference state (CPU); b: the kernels' state on the kernel device
        b = _on(dev, (t.clone() for t in a))
        slots = torch.tensor(rng.sample(range(-1, ns + 1), rng.randint(1, ns + 2)), dtype=torch.int64)
        bs = slots.shape[0]
        plen = rng.randint(0, 2 * width + 1)
        prompt = torch.randint(0, 9, (bs, plen), dtype=torch.int32)
        prompt_len = torch.randint(-1, plen + 2, (bs,), dtype=torch.int32)
        ref.history_write_prompt_ref(*a, slots, prompt, prompt_len)
        tk.history_write_prompt_triton(*b, *_on(dev, (slots, prompt, prompt_len)))
        assert all(torch.equal(x, y.cpu()) for x, y in zip(a, b))
        k = rng.randint(0, 2 * width)
        new = torch.randint(0, 9, (bs, k), dtype=torch.int32)
        counts = torch.randint(-1, k + 2, (bs,), dtype=torch.int32)
        ref.history_append_ref(a[0], a[1], slots, new, counts)
        tk.history_append_triton(b[0], b[1], *_on(dev, (slots, new, counts)))
        assert all(torch.equal(x, y.cpu()) for x, y in zip(a, b))
        dup = torch.cat([slots, slots[:1]])
        ref.history_reset_ref(a[1], a[2], dup)
        tk.history_reset_triton(b[1], b[2], dup.to(dev))
        assert all(torch.equal(x, y.cpu()) for x, y in zip(a, b))


def test_no_out_of_bounds_writes(kernel_device: torch.device) -> None:
    """Wild slots, counts and prompt lengths: the kernels write nothing outside the tables."""
    ns, width, guard, dev = 3, 8, -77, kernel_device
    tok_buf = torch.full(((ns + 2) * width,), guard, dtype=torch.int32, device=dev)
    len_buf = torch.full((ns + 2,), guard, dtype=torch.int32, device=dev)
    pl_buf = torch.full((ns + 2,), guard, dtype=torch.int32, device=dev)
    tokens = tok_buf[width : (ns + 1) * width].view(ns, width)
    lens, plens = len_buf[1 : ns + 1], pl_buf[1 : ns + 1]
    tokens.zero_(), lens.zero_(), plens.zero_()
    # would wrap into range as int32
    slots = torch.tensor([-1, 3, 1, 2**32 + 1, -(2**32) + 2], dtype=torch.int64, device=dev)
    prompt = torch.arange(50, dtype=torch.int32, device=dev).view(5, 10)
    tk.history_write_prompt_triton(tokens, lens, plens, slots, prompt, torch.tensor([10, 99, 9, 5, 5], device=dev))
    tk.history_append_triton(tokens, lens, slots, prompt[:, :6], torch.tensor([6, 40, 6, 6, 6], device=dev))
    out = _on(dev, new_outputs(5, 4))
    tk.ngram_lookup_triton(tokens, lens, plens, slots, *out, 1, 4, 0)
    tk.history_reset_triton(lens, plens, slots)
    for buf, inner in ((tok_buf, width), (len_buf, 1), (pl_buf, 1)):
        assert (buf[:inner] == guard).all() and (buf[-inner:] == guard).all()
    assert int(lens[1]) == 0 and int(lens[0]) == 0 and int(lens[2]) == 0
    assert all(int(t[i].count_nonzero()) == 0 for t in out for i in (0, 1, 3, 4))


def test_moderate_length_history(kernel_device: torch.device) -> None:
    """8k-token rows (several scan blocks per program) and a 4k ring wrapped three times."""
    g = torch.Generator().manual_seed(4)
    T = 8192
    row = torch.randint(0, 30_000, (T,), generator=g, dtype=torch.int32).tolist()
    row[-10:] = row[333:343]
    wrapped = torch.randint(0, 30_000, (3 * 4096 + 17,), generator=g, dtype=torch.int32).tolist()
    wrapped[-9:] = wrapped[-2000:-1991]
    a = _lookup(_table([row], T, [T]), [0], 2, 8, 0, 16, kernel_device)
    assert a[0][0].tolist() == row[343:359] and int(a[2][0]) == 8
    b = _lookup(_table([wrapped], 4096, [100]), [0], 2, 8, 0, 16, kernel_device)
    assert b[0][0].tolist() == wrapped[-1991:-1975] and int(b[2][0]) == 8 and int(b[4][0]) == 0


def _stash_oracle(tokens: torch.Tensor, lens: torch.Tensor, slots: list[int], g: int) -> tuple[list, ...]:
    """Brute force: per entry the clamped slot, its length, the flat ring index of each of ``g`` appended
    columns and the token there."""
    ns, width = tokens.shape
    flat = tokens.reshape(-1).tolist()
    s64 = [min(max(s, 0), ns - 1) for s in slots]
    l0 = [int(lens[s]) for s in s64]
    idx = [[s * width + (n + c) % width for c in range(g)] for s, n in zip(s64, l0)]
    return s64, l0, idx, [[flat[i] for i in row] for row in idx]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stash_append_restore_matches_reference_and_oracle(seed: int, kernel_device: torch.device) -> None:
    """``history_stash`` / ``history_restore`` (``TokenHistory.run_after``'s save and put-back): the kernels equal
    the references bit for bit and both equal a brute-force oracle, on rings that wrap, padded (-1) and wild
    slots, duplicates, and an append in between; restoring gives back the table exactly."""
    rng = random.Random(seed)
    dev = kernel_device
    for trial in range(20):
        ns, width = rng.randint(1, 6), rng.randint(1, 20)
        rows = [_rand_hist(rng, rng.randint(0, 3 * width), 9) for _ in range(ns)]
        a = _table(rows, width)
        b = _on(dev, (t.clone() for t in a))
        before = tuple(t.clone() for t in a)
        real = rng.sample(range(ns), rng.randint(1, ns))
        pads = rng.sample([-1, ns, -(2**40), 2**33], rng.randint(0, 2))
        slots = real + pads
        if trial % 4 == 3:  # a duplicate: it saves the same values (not appended to: appends need distinct slots)
            slots.append(real[0])
        rng.shuffle(slots)
        g = rng.randint(1, width)
        bs = len(slots)
        sl = torch.tensor(slots, dtype=torch.int64)
        outs_a = (torch.full((bs, g), -3, dtype=torch.int64), torch.full((bs, g), -3, dtype=torch.int32),
                  torch.full((bs,), -3, dtype=torch.int64), torch.full((bs,), -3, dtype=torch.int32))
        outs_b = _on(dev, (t.clone() for t in outs_a))
        ref.history_stash_ref(a[0], a[1], sl, *outs_a)
        tk.history_stash_triton(b[0], b[1], sl.to(dev), *outs_b)
        for x, y in zip(outs_a, outs_b):
            assert torch.equal(x, y.cpu()), (x, y)
        s64, l0, idx, saved = _stash_oracle(a[0], a[1], slots, g)
        assert outs_a[2].tolist() == s64 and outs_a[3].tolist() == l0
        assert outs_a[0].tolist() == idx and outs_a[1].tolist() == saved
        assert all(torch.equal(x, y) for x, y in zip(a, before))  # the stash writes nothing in the table
        if trial % 4 != 3:
            new = torch.randint(0, 9, (bs, g), dtype=torch.int32)
            counts = torch.full((bs,), g, dtype=torch.int32)
            ref.history_append_ref(a[0], a[1], sl, new, counts)
            tk.history_append_triton(b[0], b[1], *_on(dev, (sl, new, counts)))
        ref.history_restore_ref(a[0], a[1], *outs_a)
        tk.history_restore_triton(b[0], b[1], *outs_b)
        for x, y, z in zip(a, b, before):
            assert torch.equal(x, z) and torch.equal(y.cpu(), z)


def test_stash_restore_on_row_views_empty_batches_and_bad_scratch(kernel_device: torch.device) -> None:
    """The scratch is the ``[:bs]`` rows of ``[max_bs, G]`` buffers (``reserve_after``): the rows past ``bs`` are
    not touched; a batch of 0 is a no-op; a non-contiguous scratch is refused by both backends."""
    dev = kernel_device
    a = _table([[1, 2, 3, 4, 5], [6, 7]], 4)
    b = _on(dev, (t.clone() for t in a))
    buf = (torch.full((3, 3), -3, dtype=torch.int64), torch.full((3, 3), -3, dtype=torch.int32),
           torch.full((3,), -3, dtype=torch.int64), torch.full((3,), -3, dtype=torch.int32))
    buf_b = _on(dev, (t.clone() for t in buf))
    sl = torch.tensor([1, 0], dtype=torch.int64)
    ref.history_stash_ref(a[0], a[1], sl, *(t[:2] for t in buf))
    tk.history_stash_triton(b[0], b[1], sl.to(dev), *(t[:2] for t in buf_b))
    for x, y in zip(buf, buf_b):
        assert torch.equal(x, y.cpu()) and (x[2] == -3).all()
    assert buf[1][:2].tolist() == [[-5, -5, 6], [2, 3, 4]]  # slot 1 (len 2): columns 2, 3, 0 of its ring
    empty = (torch.zeros(0, 3, dtype=torch.int64), torch.zeros(0, 3, dtype=torch.int32),
             torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int32))
    tk.history_stash_triton(b[0], b[1], torch.zeros(0, dtype=torch.int64, device=dev), *_on(dev, empty))
    tk.history_restore_triton(b[0], b[1], *_on(dev, empty))
    assert all(torch.equal(x, y.cpu()) for x, y in zip(a, b))
    cols = (buf_b[0][:2, :2], buf_b[1][:2, :2], buf_b[2][:2], buf_b[3][:2])  # every row 3 apart: not contiguous
    for fn in (ref.history_stash_ref, tk.history_stash_triton):
        with pytest.raises(ValueError, match="must be contiguous"):
            fn(b[0], b[1], sl.to(dev), *cols)
    for fn in (ref.history_restore_ref, tk.history_restore_triton):
        with pytest.raises(ValueError, match="must be contiguous"):
            fn(b[0], b[1], *cols)
