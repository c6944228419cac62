"""``TokenHistory``: request lifecycles on both backends, slot reuse, argument checks, overflow logging.

The lifecycle tests run on ``kernel_device`` (``$HYBRID_TEST_DEVICE``: CPU with the Triton interpreter by
default, CUDA from ``scripts/gpu_check.sh``); the argument checks that only a CPU table makes (slot ranges and
distinctness read on the host) run on CPU always.
"""

from __future__ import annotations

import logging
import os
import random

if (os.environ.get("HYBRID_TEST_DEVICE", "cpu") or "cpu").startswith("cpu"):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/conftest.py does it too)

import pytest
import torch

from sglang_hybrid.hostsync import sync_guard
from sglang_hybrid.ngram import NgramConfig, NgramDraft, TokenHistory
from tests.oracles.ngram_oracle import lookup_from_list

BACKENDS = ["torch", "triton"]


def _i32(x, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32, device=device)


def _i64(x, device: torch.device | str) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int64, device=device)


def _expect(draft: NgramDraft, b: int, want: tuple[list[int], int, int, int, int]) -> None:
    tokens, n, m, cnt, inp = want
    assert draft.tokens[b, :n].tolist() == tokens
    assert int(draft.tokens[b, n:].count_nonzero()) == 0
    got = [int(draft.length[b]), int(draft.match_len[b]), int(draft.match_count[b]), int(draft.in_prompt[b])]
    assert got == [n, m, cnt, inp]


@pytest.mark.parametrize("backend", BACKENDS)
def test_request_lifecycle_matches_list_model(backend: str, kernel_device: torch.device) -> None:
    """Prompts, variable-count appends (past several ring wraps), lookups, resets and slot reuse."""
    rng = random.Random(0)
    width, num_slots, dev = 16, 5, kernel_device
    h = TokenHistory(num_slots, width, dev, backend=backend, max_batch_size=4)
    cfg = NgramConfig(n_min=2, n_max=4, max_draft=6, window=0)
    live: dict[int, tuple[list[int], int]] = {}  # slot -> (history, prompt_len)
    longest = 0
    for step in range(30):
        free = [s for s in range(num_slots) if s not in live]
        if free and (len(live) < 2 or rng.random() < 0.3):
            new = rng.sample(free, min(len(free), rng.randint(1, 2)))
            prompts = [[rng.randrange(4) for _ in range(rng.randint(0, 30))] for _ in new]
            width_p = max(len(p) for p in prompts) + 1
            padded = _i32([p + [99] * (width_p - len(p)) for p in prompts], dev)
            h.write_prompt(_i64(new, dev), padded, _i64([len(p) for p in prompts], dev))
            for s, p in zip(new, prompts):
                live[s] = (list(p), len(p))
        slots = sorted(live)[:4]
        counts = [rng.randint(1, 5) for _ in slots]
        toks = [[rng.randrange(4) for _ in range(5)] for _ in slots]
        h.append(_i32(slots, dev), _i32(toks, dev), _i32(counts, dev))
        for s, c, t in zip(slots, counts, toks):
            live[s][0].extend(t[:c])
        draft = h.lookup(_i32(slots, dev), cfg)
        for b, s in enumerate(slots):
            hist, plen = live[s]
            _expect(draft, b, lookup_from_list(hist, plen, width, cfg.n_min, cfg.n_max, cfg.window, cfg.max_draft))
            longest = max(longest, len(hist))
        if rng.random() < 0.4:
            gone = rng.choice(slots)
            h.reset(_i64([gone], dev))
            del live[gone]
    assert longest > 2 * width  # some row went around the ring at least twice


@pytest.mark.parametrize("backend", BACKENDS)
def test_slot_reuse_leaks_nothing(backend: str, kernel_device: torch.device) -> None:
    cfg = NgramConfig(n_min=1, n_max=8, max_draft=8)
    dev = kernel_device
    two = _i64([2], dev)
    h = TokenHistory(3, 32, dev, backend=backend)
    old = [1, 2, 3, 4, 5, 6, 7, 8] * 4  # a highly repetitive previous request in slot 2
    h.write_prompt(two, _i32([old], dev), _i64([32], dev))
    assert int(h.lookup(two, cfg).length[0]) > 0
    h.reset(two)
    assert int(h.lookup(two, cfg).length[0]) == 0  # empty after reset
    h.write_prompt(two, _i32([[5, 6]], dev), _i64([2], dev))
    h.append(two, _i32([[7, 9]], dev), _i64([1], dev))  # history 5 6 7: "7" occurred in `old` only
    d = h.lookup(two, cfg)
    fresh = TokenHistory(3, 32, dev, backend=backend)
    fresh.write_prompt(two, _i32([[5, 6, 7]], dev), _i64([3], dev))
    f = fresh.lookup(two, cfg)
    assert int(d.length[0]) == 0
    assert all(torch.equal(x, y) for x, y in zip(d.as_tuple(), f.as_tuple()))
    assert int(h.lens[2]) == 3 and int(h.prompt_lens[2]) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_lookup_uses_preallocated_buffers(backend: str, kernel_device: torch.device) -> None:
    dev = kernel_device
    h = TokenHistory(4, 16, dev, backend=backend, max_batch_size=3, max_draft=8)
    h.write_prompt(_i32([0, 1], dev), _i32([[1, 2, 3, 1, 2], [4, 4, 4, 4, 4]], dev), _i32([5, 5], dev))
    a = h.lookup(_i32([0, 1], dev), NgramConfig(max_draft=4))
    ptrs = [t.data_ptr() for t in a.as_tuple()]
    b = h.lookup(_i32([1, 0], dev), NgramConfig(max_draft=4))
    assert [t.data_ptr() for t in b.as_tuple()] == ptrs
    assert b.tokens.shape == (2, 4) and b.length.shape == (2,)
    assert b.tokens[1].tolist() == [3, 1, 2, 0] and b.tokens[0].tolist() == [4, 0, 0, 0]
    out = NgramDraft(*(torch.full(s, 5, dtype=torch.int32, device=dev) for s in [(2, 4), (2,), (2,), (2,), (2,)]))
    h.write_prompt(_i32([3, 2, 1, 0], dev), _i32([[1, 2, 3, 1, 2]] * 4, dev),
                   _i32([0, 0, 5, 5], dev))  # 4 > max_batch_size: ok
    b = h.lookup(_i32([1, 0], dev), NgramConfig(max_draft=4))
    assert h.lookup(_i32([1, 0], dev), NgramConfig(max_draft=4), out=out) is out
    assert all(torch.equal(x, y) for x, y in zip(out.as_tuple(), b.as_tuple()))


def test_backend_choice(kernel_device: torch.device) -> None:
    assert TokenHistory(2, 8, "cpu").backend == "torch"
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert TokenHistory(2, 8, "cpu", backend="triton").backend == "triton"
    else:  # a CUDA run (TRITON_INTERPRET=0): a CPU Triton table is refused
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            TokenHistory(2, 8, "cpu", backend="triton")
    auto = TokenHistory(2, 8, kernel_device)
    assert auto.backend == ("triton" if kernel_device.type == "cuda" else "torch")
    assert auto.tokens.device.type == kernel_device.type


def test_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        TokenHistory(2, 8, "cpu", backend="triton")


def test_128k_history_through_the_table(kernel_device: torch.device) -> None:
    """The torch backend on CPU (the interpreter would be slow); the Triton kernels on CUDA."""
    T, dev = 128 * 1024, kernel_device
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 50_000, (1, T - 5), generator=g, dtype=torch.int32)
    backend = "triton" if dev.type == "cuda" else "torch"
    h = TokenHistory(2, T, dev, backend=backend, max_context_len=T)
    one = _i64([1], dev)
    h.write_prompt(one, prompt.to(dev), _i64([T - 5], dev))
    h.append(one, prompt[:, 70_000:70_005].contiguous().to(dev), _i64([5], dev))
    d = h.lookup(one, NgramConfig())
    assert d.tokens[0].tolist() == prompt[0, 70_005:70_021].tolist() and int(d.match_len[0]) == 5
    assert int(h.lens[1]) == T and h.overflowed_slots() == []


# ---------------------------------------------------------------------------------------- bad input


@pytest.fixture
def table() -> TokenHistory:
    return TokenHistory(4, 8, "cpu", max_batch_size=3, max_draft=6)


@pytest.mark.parametrize(
    "call, exc, name",
    [
        (lambda h: h.append(torch.tensor([0.0]), _i32([[1]]), _i32([1])), TypeError, "slots"),
        (lambda h: h.append(_i32([0]), torch.tensor([[1]]), _i32([1])), TypeError, "new_tokens"),
        (lambda h: h.append(_i32([0]), _i32([[1]]), torch.tensor([1.0])), TypeError, "counts"),
        (lambda h: h.write_prompt(_i32([0]), torch.tensor([[1]]), _i32([1])), TypeError, "prompt"),
        (lambda h: h.write_prompt(_i32([0]), _i32([[1]]), torch.tensor([True])), TypeError, "prompt_len"),
        (lambda h: h.write_prompt([0], _i32([[1]]), _i32([1])), TypeError, "slots"),
        (lambda h: h.lookup(torch.zeros(1, dtype=torch.int32, device="meta"), NgramConfig()), ValueError, "slots"),
        (lambda h: h.append(_i32([0]), torch.zeros((1, 1), dtype=torch.int32, device="meta"), _i32([1])),
         ValueError, "new_tokens"),
        (lambda h: h.reset(_i32([[0]])), ValueError, "slots"),
        (lambda h: h.write_prompt(_i32([0, 1]), _i32([[1]]), _i32([1, 1])), ValueError, "prompt"),
        (lambda h: h.write_prompt(_i32([0]), _i32([[1]]), _i32([1, 1])), ValueError, "prompt_len"),
        (lambda h: h.append(_i32([0]), _i32([[1]]), _i32([[1]])), ValueError, "counts"),
        (lambda h: h.lookup(_i32([0, 1, 2, 3]), NgramConfig()), ValueError, "max_batch_size"),
        (lambda h: h.reset(_i32([4])), ValueError, "slots"),
        (lambda h: h.write_prompt(_i32([0, 1, 2, 3, 0]), _i32([[1]] * 5), _i32([1] * 5)), ValueError, "slots"),
        (lambda h: h.lookup(_i32([-1]), NgramConfig()), ValueError, "slots"),
        (lambda h: h.append(_i32([1, 1]), _i32([[1], [2]]), _i32([1, 1])), ValueError, "slots"),
        (lambda h: h.append(_i32([0]), _i32([[1] * 9]), _i32([1])), ValueError, "new_tokens"),
        (lambda h: h.lookup(_i32([0]), NgramConfig(n_min=0)), ValueError, "n_min"),
        (lambda h: h.lookup(_i32([0]), NgramConfig(n_min=3, n_max=2)), ValueError, "n_max"),
        (lambda h: h.lookup(_i32([0]), NgramConfig(n_max=1000)), ValueError, "n_max"),
        (lambda h: h.lookup(_i32([0]), NgramConfig(max_draft=0)), ValueError, "max_draft"),
        (lambda h: h.lookup(_i32([0]), NgramConfig(window=-1)), ValueError, "window"),
        (lambda h: h.lookup(_i32([0]), NgramConfig(n_min=2.0)), TypeError, "n_min"),
        (lambda h: h.lookup(_i32([0]), NgramConfig(max_draft=7)), ValueError, "max_draft"),
        (lambda h: h.lookup(_i32([0]), {"n_min": 2}), TypeError, "cfg"),
        (lambda h: h.lookup(_i32([0, 1]), NgramConfig(max_draft=6),
                            out=NgramDraft(*([torch.zeros((2, 5), dtype=torch.int32)]
                                             + [torch.zeros(2, dtype=torch.int32)] * 4))), ValueError, "out.tokens"),
        (lambda h: h.lookup(_i32([0, 1]), NgramConfig(max_draft=6),
                            out=NgramDraft(*([torch.zeros((2, 6), dtype=torch.int32)]
                                             + [torch.zeros(2, dtype=torch.int64)] * 4))), TypeError, "out.length"),
    ],
)
def test_bad_input_names_the_argument(table: TokenHistory, call, exc, name: str) -> None:
    before = [t.clone() for t in (table.tokens, table.lens, table.prompt_lens)]
    with pytest.raises(exc, match=name):
        call(table)
    assert all(torch.equal(a, b) for a, b in zip(before, (table.tokens, table.lens, table.prompt_lens)))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_slots=0, width=8), "num_slots"),
        (dict(num_slots=2, width=0), "width"),
        (dict(num_slots=2, width=8, backend="cuda"), "backend"),
        (dict(num_slots=2, width=8, max_batch_size=0), "max_batch_size"),
        (dict(num_slots=2, width=8, max_draft=0), "max_draft"),
    ],
)
def test_bad_construction_names_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        TokenHistory(device="cpu", **kwargs)


def test_config_validate_accepts_defaults() -> None:
    NgramConfig().validate()
    NgramConfig(n_min=1, n_max=1, max_draft=1, window=5).validate()


# ---------------------------------------------------------------------------------------- overflow logging


def _overflow_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sglang_hybrid.ngram" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("backend", BACKENDS)
def test_overflowing_row_keeps_newest_tokens_and_logs_once(backend: str, caplog, kernel_device: torch.device) -> None:
    caplog.set_level(logging.WARNING, logger="sglang_hybrid.ngram")
    dev = kernel_device
    h = TokenHistory(2, 8, dev, backend=backend)
    assert not _overflow_records(caplog)
    h.write_prompt(_i32([0], dev), _i32([[1, 2, 3, 4, 5, 6]], dev), _i32([6], dev))
    assert h.overflowed_slots() == [] and not _overflow_records(caplog)
    for _ in range(3):
        h.append(_i32([0], dev), _i32([[7, 8, 9]], dev), _i32([3], dev))
    assert sorted(h.tokens[0].tolist()) == sorted([7, 8, 9, 7, 8, 9, 7, 8, 9][-8:])
    assert h.overflowed_slots() == [0] and h.overflowed_slots() == [0]
    assert len(_overflow_records(caplog)) == 1 and "newest" in _overflow_records(caplog)[0].getMessage()
    d = h.lookup(_i32([0], dev), NgramConfig(max_draft=4))  # history ... 7 8 9 7 8 9 7 8 9, visible 8 9 7 8 9 7 8 9
    assert d.tokens[0].tolist() == [7, 8, 9, 0] and int(d.match_len[0]) == 5 and int(d.in_prompt[0]) == 0


def test_context_longer_than_width_logs_once_at_construction(caplog, kernel_device: torch.device) -> None:
    caplog.set_level(logging.WARNING, logger="sglang_hybrid.ngram")
    dev = kernel_device  # backend "auto": torch on CPU, Triton on CUDA
    h = TokenHistory(2, 8, dev, max_context_len=100)
    assert len(_overflow_records(caplog)) == 1
    h.write_prompt(_i32([0], dev), _i32([list(range(20))], dev), _i32([20], dev))  # prompt wider than the row
    assert h.overflowed_slots() == [0]
    assert len(_overflow_records(caplog)) == 1
    assert h.tokens[0].tolist() == [16, 17, 18, 19, 12, 13, 14, 15]  # newest 8 at columns p % 8
    TokenHistory(2, 8, "cpu", max_context_len=8)
    assert len(_overflow_records(caplog)) == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lookup_after_equals_lookup_on_extended_history_and_leaves_table_unchanged(
        backend: str, seed: int, kernel_device: torch.device) -> None:
    """``lookup_after(extra)`` drafts what a lookup on ``history ++ extra`` drafts (brute-force oracle, rows that
    wrap the ring included), then the table is bit-identical to before; padded slots (-1) are ignored."""
    rng = random.Random(seed)
    width, num_slots, g, dev = 24, 6, 5, kernel_device
    h = TokenHistory(num_slots, width, dev, backend=backend, max_batch_size=4, max_draft=8)
    cfg = NgramConfig(n_min=1, n_max=4, max_draft=7, window=0)
    hist = {}
    for s in range(num_slots):
        p = [rng.randrange(3) for _ in range(rng.randint(1, 12))]
        h.write_prompt(_i64([s], dev), _i32([p], dev), _i64([len(p)], dev))
        more = [rng.randrange(3) for _ in range(rng.choice([0, 3, 20, 40]))]  # 20 and 40 wrap a 24-wide ring
        for i in range(0, len(more), 8):
            chunk = more[i : i + 8]
            h.append(_i64([s], dev), _i32([chunk + [0] * (8 - len(chunk))], dev), _i64([len(chunk)], dev))
        hist[s] = (p + more, len(p))
    for trial in range(6):
        slots = rng.sample(range(num_slots), 3) + ([-1] if trial % 2 else [])
        extra = [[rng.randrange(3) for _ in range(g)] for _ in slots]
        before = (h.tokens.clone(), h.lens.clone(), h.prompt_lens.clone())
        sl, ex = _i64(slots, dev), _i32(extra, dev)
        with sync_guard(True):  # no host read (the range check of -1 is one), so the padded slot gets through
            d = h.lookup_after(sl, cfg, ex)
        for b, s in enumerate(slots):
            if s < 0:
                assert int(d.length[b]) == 0
                continue
            toks, plen = hist[s]
            _expect(d, b, lookup_from_list(toks + extra[b], plen, width, cfg.n_min, cfg.n_max, cfg.window,
                                           cfg.max_draft))
        assert torch.equal(h.tokens, before[0]) and torch.equal(h.lens, before[1])
        assert torch.equal(h.prompt_lens, before[2])
    # The plain lookup afterwards still sees the untouched histories.
    slots = list(range(4))
    d = h.lookup(_i64(slots, dev), cfg)
    for b, s in enumerate(slots):
        toks, plen = hist[s]
        _expect(d, b, lookup_from_list(toks, plen, width, cfg.n_min, cfg.n_max, cfg.window, cfg.max_draft))


def test_lookup_after_argument_checks() -> None:
    h = TokenHistory(3, 8, "cpu", backend="torch", max_batch_size=2)
    cfg = NgramConfig(n_min=1, n_max=2, max_draft=4)
    with pytest.raises(ValueError, match="extra has 9 columns, more than the row width 8"):
        h.lookup_after(_i64([0], "cpu"), cfg, torch.zeros(1, 9, dtype=torch.int32))
    with pytest.raises(TypeError, match="extra must have dtype int32"):
        h.lookup_after(_i64([0], "cpu"), cfg, torch.zeros(1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="extra has 2 rows, slots has 1"):
        h.lookup_after(_i64([0], "cpu"), cfg, torch.zeros(2, 2, dtype=torch.int32))


def test_run_after_restores_the_history_when_the_callback_fails() -> None:
    h = TokenHistory(2, 8, "cpu", max_batch_size=2, max_draft=4)
    s = torch.tensor([0, 1])
    h.write_prompt(s, torch.tensor([[1, 2, 3, 4, 5, 6, 7], [8, 9, 0, 0, 0, 0, 0]], dtype=torch.int32),
                   torch.tensor([7, 2], dtype=torch.int32))
    before = (h.tokens.clone(), h.lens.clone())
    seen = []

    def fail():
        seen.append(h.lens.tolist())
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        h.run_after(s, torch.tensor([[50, 51, 52], [60, 61, 62]], dtype=torch.int32), fail)
    assert seen == [[10, 5]]  # the callback saw the chain appended (slot 0's ring wrapped)
    assert torch.equal(h.tokens, before[0]) and torch.equal(h.lens, before[1])
