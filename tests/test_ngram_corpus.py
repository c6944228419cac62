"""The cross-request n-gram corpus: torch reference == Triton kernels (interpreter on CPU) == brute-force oracle,
exactly, and the behaviour an operator relies on (frequency choice, confidence-capped drafts, tenant isolation,
bounded eviction, clear option errors)."""

from __future__ import annotations

import os
import random

if (os.environ.get("HYBRID_TEST_DEVICE", "cpu") or "cpu").startswith("cpu"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from sglang_hybrid.ngram import TokenHistory
from sglang_hybrid.ngram import corpus_reference as ref
from sglang_hybrid.ngram.corpus import CorpusConfig, NgramCorpus, make_coef, make_corpus
from tests.oracles.corpus_oracle import corpus_insert_oracle, corpus_lookup_oracle

DEV = torch.device(os.environ.get("HYBRID_TEST_DEVICE", "cpu") or "cpu")


def _kernels():
    from sglang_hybrid.ngram import corpus_kernels

    return corpus_kernels


def _history(rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    toks = torch.full((len(rows), width), -3, dtype=torch.int32)
    for i, h in enumerate(rows):
        for p in range(max(0, len(h) - width), len(h)):
            toks[i, p % width] = h[p]
    return toks, torch.tensor([len(h) for h in rows], dtype=torch.int32)


def _table(nb: int, C: int):
    return (torch.zeros((nb, C), dtype=torch.int32), torch.zeros((nb, C), dtype=torch.int32),
            torch.zeros((nb, C), dtype=torch.int32), torch.full((nb * C,), ref.INT32_MAX, dtype=torch.int32))


def _clone(ts):
    return tuple(t.clone() for t in ts)


def _run_insert(tables, coef, hist, slots, tenant, start, counts, max_pos, n_max, from_end):
    """Insert with the reference, the oracle and the kernel; assert equal tables; return the reference's."""
    a, o, k = tables, _clone(tables), tuple(t.clone().to(DEV) for t in tables)
    args = (slots, tenant, start, counts)
    ref.corpus_insert_ref(*a, coef, *hist, *args, max_pos, n_max, from_end)
    corpus_insert_oracle(*o, coef, *hist, *args, max_pos, n_max, from_end)
    scratch = torch.full((_kernels().scratch_size(len(slots), max_pos, n_max),), 7, dtype=torch.int64, device=DEV)
    _kernels().corpus_insert_triton(*k, coef.to(DEV), *(h.to(DEV) for h in hist), *(x.to(DEV) for x in args),
                                    max_pos, n_max, from_end, scratch)
    for x, y, z, name in zip(a, o, k, ("tag", "tok", "cnt", "claim")):
        assert torch.equal(x, y), f"reference != oracle ({name})"
        assert torch.equal(x, z.cpu()), f"reference != triton ({name})"
    return a


def _outs(bs: int, D: int):
    return [torch.full((bs, D), 9, dtype=torch.int32)] + [torch.full((bs,), 9, dtype=torch.int32)
                                                          for _ in range(4)] + [torch.full((bs, D), 9, dtype=torch.int32)]


def _run_lookup(tables, coef, hist, slots, tenant, D, n_max, alpha, tau):
    a, o, k = _outs(len(slots), D), _outs(len(slots), D), [t.to(DEV) for t in _outs(len(slots), D)]
    ref.corpus_lookup_ref(*tables[:3], coef, *hist, slots, tenant, *a, n_max, alpha, tau)
    corpus_lookup_oracle(*tables[:3], coef, *hist, slots, tenant, *o, n_max, alpha, tau)
    _kernels().corpus_lookup_triton(*(t.clone().to(DEV) for t in tables[:3]), coef.to(DEV), *(h.to(DEV) for h in hist),
                                    slots.to(DEV), tenant.to(DEV), *k, n_max, alpha, tau)
    for i, (x, y, z) in enumerate(zip(a, o, k)):
        assert torch.equal(x, y), f"lookup output {i}: reference != oracle\n{x}\n{y}"
        assert torch.equal(x, z.cpu()), f"lookup output {i}: reference != triton\n{x}\n{z}"
    return a


@pytest.mark.parametrize("seed", [0, 1])
def test_insert_and_lookup_agree_exactly(seed: int) -> None:
    """Random histories over a small vocabulary (many repeats), a small table (contests, ageing, takeovers),
    ring wrap-around, out-of-range slots, tenants and both insert modes: three implementations agree."""
    rng = random.Random(seed)
    n_max, C, nb, W = rng.choice([3, 4, 5]), rng.choice([2, 4]), rng.choice([4, 16]), rng.choice([12, 40])
    coef = make_coef(n_max, "cpu", seed=seed)
    tables = _table(nb, C)
    rows = [[rng.randrange(6) for _ in range(rng.randrange(0, 50))] for _ in range(5)]
    hist = _history(rows, W)
    slots = torch.tensor([0, 1, 2, 3, 4, -1, 7], dtype=torch.int64)
    tenant = torch.tensor([rng.randrange(3) for _ in range(7)], dtype=torch.int32)
    for rnd in range(4):
        counts = torch.tensor([rng.randrange(-1, 10) for _ in range(7)], dtype=torch.int32)
        start = torch.tensor([rng.randrange(0, 40) for _ in range(7)], dtype=torch.int32)
        tables = _run_insert(tables, coef, hist, slots, tenant, start, counts, 8, n_max, rnd % 2 == 0)
    assert int(tables[2].sum()) > 0
    for tau in (1, 1 << 14):
        out = _run_lookup(tables, coef, hist, slots, tenant, rng.choice([3, 6]), n_max, rng.choice([1, 2]), tau)
    assert int(out[1].sum()) >= 0


@pytest.mark.parametrize("n_max,W", [(8, 64), (5, 24), (1, 16)])
def test_long_walks_past_the_history_context_agree_exactly(n_max: int, W: int) -> None:
    """Adversarial for the lookup's context: repeating histories let walks run the full 16 positions, so every
    order's context ends up made of drafted tokens only (the kernel shifts them through registers), with ring
    wrap-around (histories longer than W), a non-power-of-two order count and one request that starts with a
    history shorter than n_max."""
    coef = make_coef(n_max, "cpu", seed=3)
    tables = _table(64, 4)
    cycle = [11, 12, 13, 14, 15, 16, 17]
    rows = [cycle * 9, [2, 3] * 30, cycle[:3], [4, 4, 4, 5] * 12]
    hist = _history(rows, W)
    slots = torch.arange(len(rows), dtype=torch.int64)
    zero = torch.zeros(len(rows), dtype=torch.int32)
    counts = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    tables = _run_insert(tables, coef, hist, slots, zero, zero, counts, 64, n_max, True)
    out = _run_lookup(tables, coef, hist, slots, zero, 16, n_max, 1, 1)
    assert int(out[1].max()) == 16, out[1]  # at least one walk drafts all 16 positions


def test_insert_kernel_names_a_missing_or_short_scratch() -> None:
    coef = make_coef(2, "cpu")
    tables = tuple(t.to(DEV) for t in _table(4, 2))
    hist = tuple(h.to(DEV) for h in _history([[5, 6, 7]], 8))
    one = torch.ones(1, dtype=torch.int32, device=DEV)
    args = (*tables, coef.to(DEV), *hist, one - 1, one - 1, one - 1, one)
    for scratch in (None, torch.zeros(5, dtype=torch.int64, device=DEV), torch.zeros(99, dtype=torch.int32, device=DEV)):
        with pytest.raises(ValueError, match="argument 'scratch' must be int64 with >= 12 elements"):
            _kernels().corpus_insert_triton(*args, 4, 2, True, scratch)


def test_saturated_entry_is_halved() -> None:
    """An entry at CAP is aged by the next insert of its own pair instead of overflowing."""
    coef = make_coef(2, "cpu")
    tables = _table(1, 2)
    hist = _history([[5, 6]], 8)
    zero, one = torch.tensor([0], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    tables = _run_insert(tables, coef, hist, zero, zero, zero, one, 4, 2, True)
    e = int(torch.nonzero(tables[2].view(-1))[0])
    tables[2].view(-1)[e] = ref.CAP
    tables = _run_insert(tables, coef, hist, zero, zero, zero, one, 4, 2, True)
    assert int(tables[2].view(-1)[e]) == ref.CAP // 2 + 1


def _corpus(**kw) -> tuple[NgramCorpus, TokenHistory]:
    cfg = CorpusConfig(**{"entries": 1 << 12, "n_max": 4, "tau": 0.3, **kw})
    return NgramCorpus(cfg, "cpu", max_batch_size=4, max_draft=8), TokenHistory(4, 64, "cpu", max_draft=8)


def _feed(c: NgramCorpus, h: TokenHistory, slot: int, toks: list[int], tenant: int = 0) -> None:
    s = torch.tensor([slot])
    h.write_prompt(s, torch.tensor([toks[:1]], dtype=torch.int32), torch.tensor([1]))
    h.append(s, torch.tensor([toks[1:]], dtype=torch.int32), torch.tensor([len(toks) - 1]))
    c.insert(h, s, torch.tensor([len(toks)]), torch.tensor([tenant], dtype=torch.int32))


def _ask(c: NgramCorpus, h: TokenHistory, slot: int, ctx: list[int], tenant: int = 0):
    s = torch.tensor([slot])
    h.write_prompt(s, torch.tensor([ctx], dtype=torch.int32), torch.tensor([len(ctx)]))
    d = c.lookup(h, s, torch.tensor([tenant], dtype=torch.int32))
    return d.tokens[0, : int(d.length[0])].tolist(), d


def test_learns_across_requests_and_prefers_the_frequent_continuation() -> None:
    c, h = _corpus()
    for _ in range(3):
        _feed(c, h, 0, [1, 2, 3, 4, 5, 6])
    _feed(c, h, 0, [1, 2, 3, 9])
    draft, d = _ask(c, h, 1, [7, 1, 2, 3])
    assert draft[:3] == [4, 5, 6]  # 3 of 4 times "1 2 3" went on with 4
    assert int(d.match_len[0]) == 3 and int(d.match_count[0]) == 4
    assert int(d.q[0, 0]) == (3 << 16) // (4 + 1)
    assert 0 < int(d.score[0]) <= int(d.length[0]) << 16


def test_draft_length_follows_confidence() -> None:
    """A context seen once gives a short draft; seen often, a long one; unseen, none."""
    c, h = _corpus(tau=0.2)
    _feed(c, h, 0, [10, 11, 12, 13, 14, 15, 16, 17])
    once, _ = _ask(c, h, 1, [10, 11])
    for _ in range(30):
        _feed(c, h, 0, [10, 11, 12, 13, 14, 15, 16, 17])
    many, _ = _ask(c, h, 1, [10, 11])
    assert 0 < len(once) < len(many) and many == [12, 13, 14, 15, 16, 17][: len(many)]
    assert _ask(c, h, 1, [30, 31])[0] == []


def test_tenant_isolation_and_shared_mode() -> None:
    c, h = _corpus(isolation="tenant")
    for _ in range(5):
        _feed(c, h, 0, [1, 2, 3, 4], tenant=7)
    assert _ask(c, h, 1, [1, 2], tenant=7)[0][:2] == [3, 4]
    assert _ask(c, h, 1, [1, 2], tenant=8)[0] == []
    s, hs = _corpus(isolation="shared")
    for _ in range(5):
        _feed(s, hs, 0, [1, 2, 3, 4], tenant=7)
    assert _ask(s, hs, 1, [1, 2], tenant=8)[0][:2] == [3, 4]
    assert make_corpus(CorpusConfig(isolation="off"), "cpu") is None


def test_full_table_stays_bounded_and_keeps_frequent_entries() -> None:
    """A 64-entry table flooded with distinct n-grams: sizes never change, counts stay bounded, and a context
    reinforced between the floods survives."""
    c, h = _corpus(entries=64, ways=4, n_max=2, tau=0.1)
    shapes = [tuple(t.shape) for t in (c.tag, c.tok, c.cnt, c.claim)]
    rng = random.Random(0)
    for r in range(40):
        _feed(c, h, 0, [rng.randrange(100, 10_000) for _ in range(12)])
        _feed(c, h, 0, [1, 2, 3, 4])
    assert [tuple(t.shape) for t in (c.tag, c.tok, c.cnt, c.claim)] == shapes
    assert bool((c.claim == ref.INT32_MAX).all())
    assert int(c.cnt.max()) <= 4 * 40
    assert _ask(c, h, 1, [1, 2])[0][:1] == [3]


@pytest.mark.parametrize("bad,msg", [
    (dict(entries=1000), "entries"), (dict(ways=3), "ways"), (dict(n_max=0), "n_max"), (dict(alpha=0), "alpha"),
    (dict(tau=0.0), "tau"), (dict(isolation="global"), "isolation"), (dict(insert_chunk=0), "insert_chunk"),
])
def test_config_errors_name_the_option(bad: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        CorpusConfig(**bad).validate()


def test_memory_cost_and_insert_prompt() -> None:
    assert CorpusConfig().memory_bytes == 32 * 1024 * 1024
    c, h = _corpus(insert_chunk=3)
    s = torch.tensor([0])
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    h.write_prompt(s, torch.tensor([prompt], dtype=torch.int32), torch.tensor([len(prompt)]))
    c.insert_prompt(h, s, torch.tensor([len(prompt)]))
    assert int(c.cnt.sum()) == sum(min(p, 4) for p in range(len(prompt)))  # one update per (position, order)
    assert _ask(c, h, 1, [9, 5, 6])[0][:2] == [7, 8]


def test_device_without_index_matches_a_history_on_the_same_device() -> None:
    """``device="cuda"`` (no index, as a server passes it) takes histories on ``cuda:0``; on the GPU this failed with
    "history is on cuda:0, the corpus on cuda" before the corpus normalised its device (found by
    ``scripts/bench_step.py`` on an H200). On a CPU it checks the same path with ``"cpu"``."""
    dev = DEV.type  # "cuda" or "cpu", no index
    h = TokenHistory(2, 64, dev, max_batch_size=2, max_draft=4)
    c = NgramCorpus(CorpusConfig(entries=1 << 10), dev, max_batch_size=2, max_draft=4)
    assert c.device == h.device == c.tag.device
    slots = torch.tensor([0, 1], dtype=torch.int32, device=h.device)
    h.write_prompt(slots, torch.tensor([[1, 2, 3, 1, 2], [1, 2, 3, 1, 2]], dtype=torch.int32, device=h.device),
                   torch.tensor([5, 5], dtype=torch.int32, device=h.device))
    c.insert_prompt(h, slots, torch.tensor([5, 5], dtype=torch.int32, device=h.device), max_prompt_len=5)
    d = c.lookup(h, slots)
    assert d.tokens[0, 0].item() == 3 and int(d.length[0]) >= 1


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_lookup_after_a_chain_into_out_buffers_equals_one_on_the_extended_history(backend: str) -> None:
    """The corpus tail's lookup: inside ``TokenHistory.run_after(slots, chain, ...)`` and into ``out`` buffers, a
    corpus lookup drafts exactly what a plain lookup drafts on a history that really holds ``history ++ chain``
    (both backends), it leaves the corpus's own buffers (the step's main lookup) untouched, and the history is
    restored afterwards."""
    from sglang_hybrid.ngram.corpus import CorpusDraft

    cfg = CorpusConfig(entries=1 << 12, n_max=4, tau=0.05)
    c = NgramCorpus(cfg, "cpu", backend=backend, max_batch_size=4, max_draft=8)
    h, h2 = TokenHistory(4, 64, "cpu", max_draft=8), TokenHistory(4, 64, "cpu", max_draft=8)
    rng = random.Random(3)
    for _ in range(6):  # a few phrases, with variants, so counts and match lengths differ
        _feed(c, h, 0, [1, 2, 3, 4, 5, 6, rng.randrange(7, 10), 11, 12])
        _feed(c, h, 0, [20, 21, 2, 3, rng.randrange(30, 33), 34])
    rows = [[7, 1], [9, 20], [5, 5, 5], [40]]
    chain = [[2, 3], [21, 2], [6, 40], [41, 42]]
    slots = torch.tensor([0, 1, 2, 3])
    for hist, rs in ((h, rows), (h2, [r + ch for r, ch in zip(rows, chain)])):
        p = max(len(r) for r in rs)
        prompt = torch.tensor([r + [0] * (p - len(r)) for r in rs], dtype=torch.int32)
        hist.write_prompt(slots, prompt, torch.tensor([len(r) for r in rs], dtype=torch.int32))
    main = c.lookup(h, slots)
    main_before = [t.clone() for t in main.as_tuple()]
    before = (h.tokens.clone(), h.lens.clone())
    out = CorpusDraft.zeros(4, 5, "cpu")
    got = h.run_after(slots, torch.tensor(chain, dtype=torch.int32), lambda: c.lookup(h, slots, out=out))
    assert got is out
    assert torch.equal(h.tokens, before[0]) and torch.equal(h.lens, before[1])
    for a, b in zip(main.as_tuple(), main_before):
        assert torch.equal(a, b)
    want = c.lookup(h2, slots, max_draft=5)
    for a, b, name in zip(out.as_tuple(), want.as_tuple(), ("tokens", "length", "match_len", "count", "score", "q")):
        assert torch.equal(a, b), name
    assert int(out.length[0]) >= 2 and out.tokens[0, :2].tolist() == [4, 5]  # the chain's context continues


def test_lookup_out_buffers_are_checked() -> None:
    from sglang_hybrid.ngram.corpus import CorpusDraft

    c, h = _corpus()
    s = torch.tensor([0])
    h.write_prompt(s, torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([2]))

    def draft(D, dtype=torch.int32, rows=1):
        return CorpusDraft(torch.zeros(rows, D, dtype=dtype), *(torch.zeros(rows, dtype=torch.int32) for _ in range(4)),
                           torch.zeros(rows, D, dtype=torch.int32))

    with pytest.raises(ValueError, match="out.tokens must be int32"):
        c.lookup(h, s, out=draft(4, torch.int64))
    with pytest.raises(ValueError, match=r"out.length must be int32 \(1,\)"):
        c.lookup(h, s, out=CorpusDraft(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                                       *(torch.zeros(1, dtype=torch.int32) for _ in range(3)),
                                       torch.zeros(1, 4, dtype=torch.int32)))
    with pytest.raises(ValueError, match=r"out.tokens has 9 columns; must be in \[1, 8\]"):
        c.lookup(h, s, out=draft(9))
