"""Triton kernel == torch reference, bit for bit, on random and adversarial inputs.

The kernel runs on ``kernel_device`` (``$HYBRID_TEST_DEVICE``: the interpreter on CPU by default, compiled on
CUDA from ``scripts/gpu_check.sh``); the reference always runs on the CPU originals, and every output must be
identical (floats compared as bits).
"""

from __future__ import annotations

import os

if (os.environ.get("HYBRID_TEST_DEVICE", "cpu") or "cpu").startswith("cpu"):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/conftest.py does it too)

import numpy as np
import pytest
import torch

from sglang_hybrid.selection import (
    MAX_FLAT_ELEMENTS,
    SelectionArgumentError,
    SelectionBuffers,
    dense_sps,
    load_default_sps_table,
    select_chains_ref,
)
from sglang_hybrid.selection.triton_kernel import select_chains_triton
from tests.oracles.selection_oracle import random_instance, random_sps_curve

FIELDS = ("choice", "verify_len", "tokens", "survival", "price", "budget_used")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _both(mt, ms, nt, ns, nl, budget, sps, dev=torch.device("cpu"), **kw):
    """Run the reference (CPU) and the kernel (on ``dev``); assert identical outputs; return the reference's."""
    bs, G = ms.shape
    W = max(G, ns.shape[1])
    ref = SelectionBuffers(bs, W).view(bs)
    tri = SelectionBuffers(bs, W, dev).view(bs)
    for o in (ref, tri):
        for f in FIELDS:  # poison: every output must be written
            getattr(o, f).fill_(7)
    select_chains_ref(mt, ms, nt, ns, nl, budget, sps, ref, **kw)
    on = lambda t: None if t is None else t.to(dev)
    select_chains_triton(on(mt), on(ms), on(nt), on(ns), on(nl), on(budget), on(sps), tri, **kw)
    for f in FIELDS:
        a, b = getattr(ref, f), getattr(tri, f).cpu()
        assert torch.equal(_bits(a), _bits(b)), f"{f}: reference {a.tolist()} != triton {b.tolist()}"
    return ref


def _check_invariants(out, ms, ns, nl, budget, kw):
    bs, G = ms.shape
    W = out.tokens.shape[1]
    mvl = kw.get("max_verify_len", 0) or W
    vl = out.verify_len
    assert int(vl.sum()) == int(out.budget_used[0])
    assert bool(((vl >= 0) & (vl <= mvl)).all())
    chain_len = torch.where(out.choice == 1, nl.clamp(0, ns.shape[1]), torch.full_like(nl, G))
    assert bool((vl <= chain_len).all())
    if budget is not None:
        assert int(out.budget_used[0]) <= max(int(budget[0]), 0)
    # survival is 0 past the chosen chain's length, and non-increasing
    j = torch.arange(W).view(1, -1)
    assert bool((out.survival[j >= chain_len.view(-1, 1)] == 0).all())
    assert bool((out.survival[:, 1:] <= out.survival[:, :-1]).all())
    assert 0.0 <= float(out.price[0]) <= 1.0


# (bs, gamma, L_max): bs = 1 and non-powers of two, gamma < L, gamma > L, gamma == L, width 1. A short list
# keeps the number of compiled kernel variants small when the tests run on CUDA.
SHAPES = [(1, 3, 5), (3, 4, 2), (5, 5, 5), (7, 2, 6), (2, 1, 1), (8, 7, 8)]


def _random_kw(rng, W):
    return dict(num_iters=int(rng.integers(0, 3)), max_verify_len=int(rng.integers(0, W + 1)),
                survival_eps=float(rng.choice([1e-6, 0.0, 0.1])))


@pytest.mark.parametrize("seed", range(8))
def test_random_budget_mode(seed, kernel_device):
    rng = np.random.default_rng(100 + seed)
    for i in range(3):
        bs, G, L = SHAPES[(3 * seed + i) % len(SHAPES)]
        inst = random_instance(rng, bs=bs, gamma=G, ngram_width=L)
        W = max(G, L)
        budget = torch.tensor([int(rng.integers(-1, bs * W + 2))], dtype=torch.int32)
        kw = _random_kw(rng, W)
        out = _both(*inst, budget, None, kernel_device, **kw)
        _check_invariants(out, inst[1], inst[3], inst[4], budget, kw)


@pytest.mark.parametrize("seed", range(8))
def test_random_sps_mode(seed, kernel_device):
    rng = np.random.default_rng(200 + seed)
    for i in range(2):
        bs, G, L = SHAPES[(2 * seed + i) % len(SHAPES)]
        inst = random_instance(rng, bs=bs, gamma=G, ngram_width=L)
        W = max(G, L)
        sps = random_sps_curve(rng, bs * (1 + W) + 1 + int(rng.integers(0, 3)))  # longer than needed is fine
        kw = _random_kw(rng, W)
        out = _both(*inst, None, sps, kernel_device, **kw)
        _check_invariants(out, inst[1], inst[3], inst[4], None, kw)


def _mk(ms, ns, nl):
    ms = torch.tensor(ms, dtype=torch.float32)
    ns = torch.tensor(ns, dtype=torch.float32)
    mt = torch.arange(1, ms.numel() + 1, dtype=torch.int32).view(ms.shape)
    nt = torch.arange(101, 101 + ns.numel(), dtype=torch.int32).view(ns.shape)
    return mt, ms, nt, ns, torch.tensor(nl, dtype=torch.int32)


ADVERSARIAL = {
    "ties": _mk([[0.5, 0.5, 0.5]] * 3, [[0.5, 0.5, 0.5, 0.5]] * 3, [4, 2, 0]),
    "all_zero": _mk([[0.0] * 3] * 2, [[0.0] * 3] * 2, [3, 3]),
    "all_one": _mk([[1.0] * 3] * 3, [[1.0] * 5] * 3, [5, 1, 3]),
    "bs1": _mk([[0.9, 0.5, 0.2]], [[0.95, 0.9, 0.85, 0.8]], [4]),
    "no_match": _mk([[0.9, 0.6, 0.3], [0.8, 0.7, 0.1]], [[0.99] * 4] * 2, [0, 0]),
    "ngram_longer": _mk([[0.7, 0.3], [0.6, 0.2]], [[0.9, 0.85, 0.8, 0.75, 0.7, 0.6]] * 2, [6, 5]),
    "ngram_shorter": _mk([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]] * 2, [[0.95, 0.1]] * 2, [2, 1]),
    "len_out_of_range": _mk([[0.9, 0.8]] * 3, [[0.99, 0.98, 0.97]] * 3, [-4, 9, 2]),
    "not_monotone_nan_neg_gt1": _mk([[0.3, 0.9, float("nan"), 0.5], [1.5, -0.2, 0.4, 0.1]],
                                    [[float("nan"), 0.9], [-0.0, 2.0]], [2, 2]),
    "tiny_below_eps": _mk([[1e-7, 1e-8], [2e-6, 1e-6]], [[5e-7, 1e-9], [0.0, 0.0]], [2, 2]),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial(name, kernel_device):
    mt, ms, nt, ns, nl = ADVERSARIAL[name]
    bs, G = ms.shape
    W = max(G, ns.shape[1])
    for b in (0, bs - 1, 10 * W * bs, -3):  # none, fewer than bs, more than all candidates, negative
        budget = torch.tensor([b], dtype=torch.int32)
        out = _both(mt, ms, nt, ns, nl, budget, None, kernel_device)
        _check_invariants(out, ms, ns, nl, budget, {})
    if name < "n":  # roofline SPS with a verify cap
        sps, kw = dense_sps(load_default_sps_table(), bs * (1 + W)), dict(max_verify_len=min(2, W))
    else:  # flat SPS: verify everything that is a candidate, zeros included
        sps, kw = torch.full((bs * (1 + W) + 1,), 3.0), dict(survival_eps=0.0)
    out = _both(mt, ms, nt, ns, nl, None, sps, kernel_device, num_iters=1, **kw)
    _check_invariants(out, ms, ns, nl, None, kw)


def test_adversarial_expected_values(kernel_device):
    mt, ms, nt, ns, nl = ADVERSARIAL["all_one"]
    out = _both(mt, ms, nt, ns, nl, torch.tensor([4], dtype=torch.int32), None, kernel_device)
    assert out.budget_used.tolist() == [4] and float(out.price[0]) == 1.0
    mt, ms, nt, ns, nl = ADVERSARIAL["all_zero"]
    # zeros are below eps: no candidate at all
    out = _both(mt, ms, nt, ns, nl, torch.tensor([4], dtype=torch.int32), None, kernel_device)
    assert out.verify_len.tolist() == [0, 0] and out.budget_used.tolist() == [0] and float(out.price[0]) == 0.0
    out = _both(mt, ms, nt, ns, nl, torch.tensor([4], dtype=torch.int32), None, kernel_device, survival_eps=0.0)
    assert out.budget_used.tolist() == [4]  # with eps = 0, zeros are candidates
    mt, ms, nt, ns, nl = ADVERSARIAL["no_match"]
    out = _both(mt, ms, nt, ns, nl, torch.tensor([3], dtype=torch.int32), None, kernel_device)
    assert out.choice.tolist() == [0, 0] and out.verify_len.tolist() == [1, 2]  # 0.9 | 0.8, 0.7
    assert out.tokens.tolist() == [[1, 2, 3, 0], [4, 5, 6, 0]]
    mt, ms, nt, ns, nl = ADVERSARIAL["ngram_longer"]
    out = _both(mt, ms, nt, ns, nl, torch.tensor([8], dtype=torch.int32), None, kernel_device)
    assert out.choice.tolist() == [1, 1] and out.verify_len.tolist() == [4, 4]
    assert out.tokens[1].tolist() == [107, 108, 109, 110, 111, 0]  # 0 past ngram_len
    mt, ms, nt, ns, nl = ADVERSARIAL["not_monotone_nan_neg_gt1"]
    out = _both(mt, ms, nt, ns, nl, torch.tensor([0], dtype=torch.int32), None, kernel_device)
    # running min, NaN/negative -> 0, > 1 -> 1; n-gram rows sanitise to zeros, so the model chain stays
    assert out.choice.tolist() == [0, 0]
    assert torch.equal(out.survival, torch.tensor([[0.3, 0.3, 0, 0], [1, 0, 0, 0]], dtype=torch.float32))
    assert float(out.price[0]) == 1.0  # with K = 0 the price is the best candidate's survival


def test_strided_inputs(kernel_device):
    rng = np.random.default_rng(5)
    mt, ms, nt, ns, nl = random_instance(rng, bs=5, gamma=4, ngram_width=6)
    budget = torch.tensor([7], dtype=torch.int32)
    ref = _both(mt, ms, nt, ns, nl, budget, None, kernel_device)
    # the same values at row stride 2x the width (and ngram_len at stride 2), laid out on the kernel's device
    wide = lambda t: torch.cat([t, t], 1).to(kernel_device)[:, : t.shape[1]]
    big_nl = torch.stack([nl, nl], 1).to(kernel_device)[:, 0]
    assert wide(ms).stride(0) == 8 and big_nl.stride(0) == 2
    out = SelectionBuffers(5, 6, kernel_device).view(5)
    select_chains_triton(wide(mt), wide(ms), wide(nt), wide(ns), big_nl, budget.to(kernel_device), None, out)
    for f in FIELDS:
        assert torch.equal(_bits(getattr(ref, f)), _bits(getattr(out, f).cpu()))


def test_medium_batch_roofline(kernel_device):
    rng = np.random.default_rng(9)
    mt, ms, nt, ns, nl = random_instance(rng, bs=24, gamma=7, ngram_width=12)
    sps = dense_sps(load_default_sps_table(), 24 * 13)
    _both(mt, ms, nt, ns, nl, torch.tensor([50], dtype=torch.int32), None, kernel_device)
    _both(mt, ms, nt, ns, nl, None, sps, kernel_device, num_iters=1)


def test_too_large_for_the_kernel():
    bs, W = 513, 32  # next_pow2: 1024 * 32 > MAX_FLAT_ELEMENTS
    assert 1024 * 32 > MAX_FLAT_ELEMENTS
    z = lambda *s, d=torch.int32: torch.zeros(*s, dtype=d)
    out = SelectionBuffers(bs, W).view(bs)
    with pytest.raises(SelectionArgumentError, match="MAX_FLAT|maximum"):
        select_chains_triton(z(bs, 7), z(bs, 7, d=torch.float32), z(bs, W), z(bs, W, d=torch.float32), z(bs),
                             torch.tensor([5], dtype=torch.int32), None, out)
    with pytest.raises(ValueError, match="maximum is 16384"):
        SelectionBuffers(bs, W, device="cuda")  # refused before any CUDA allocation
