"""The probe (``TokenHistory.probe_after``: the lookup's match test on ``history ++ extra[:k]`` for several ``k`` in
one pass): the Triton kernel against the torch reference, exactly, and both against a brute-force oracle, the full
lookup over a plain list holding ``history ++ extra[:k]`` (``tests/oracles/ngram_oracle.py: lookup_from_list``).

The kernel runs on ``kernel_device`` (the interpreter on CPU by default, compiled on CUDA from
``scripts/gpu_check.sh``); the reference on CPU copies of the same inputs. Adversarial cases: histories longer
than the ring (the oldest positions pushed out by the chain), empty and one-token histories, out-of-range and
repeated slots, points of 0 and past the chain (clamped), windows of 1 and wider than the row, small scan blocks.
"""

from __future__ import annotations

import os
import random

if (os.environ.get("HYBRID_TEST_DEVICE", "cpu") or "cpu").startswith("cpu"):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/conftest.py does it too)

import pytest
import torch

from sglang_hybrid.ngram import TokenHistory
from sglang_hybrid.ngram import kernels as tk
from sglang_hybrid.ngram import reference as ref
from tests.oracles.ngram_oracle import lookup_from_list


def _table(rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.full((len(rows), width), -5, dtype=torch.int32)  # stale garbage where nothing was written
    for i, h in enumerate(rows):
        for p in range(max(0, len(h) - width), len(h)):
            tokens[i, p % width] = h[p]
    return tokens, torch.tensor([len(h) for h in rows], dtype=torch.int32)


def _oracle(rows, width, slots, extra, points, n, window) -> torch.Tensor:
    bs, g = extra.shape
    out = torch.zeros(bs, len(points), dtype=torch.int32)
    for b in range(bs):
        s = int(slots[b])
        if not 0 <= s < len(rows):
            continue
        for i, k in enumerate(points):
            k = min(max(int(k), 0), g)
            seq = rows[s] + extra[b, :k].tolist()
            out[b, i] = int(lookup_from_list(seq, 0, width, n, n, window, 1)[1] > 0)
    return out


def _case(rng: random.Random, width: int):
    vocab = rng.choice([2, 3, 5])
    rows = [[rng.randrange(vocab) for _ in range(rng.choice([0, 1, 2, rng.randrange(3 * width)]))] for _ in range(6)]
    g = rng.choice([1, 4, 7])
    bs = rng.randint(1, 7)
    slots = [rng.randrange(-1, 8) for _ in range(bs)]  # out of range (-1, 6, 7) and repeats
    extra = torch.tensor([[rng.randrange(vocab) for _ in range(g)] for _ in range(bs)], dtype=torch.int32)
    points = [rng.randrange(0, g + 3) for _ in range(rng.randint(1, 5))]
    return rows, torch.tensor(slots, dtype=torch.int64), extra, points


@pytest.fixture(params=[16, "default"], ids=["block16", "block_default"])
def scan_block(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.param != "default":
        monkeypatch.setattr(tk, "LOOKUP_BLOCK", request.param)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("width", [8, 64])
def test_probe_kernel_equals_reference_and_oracle(seed, width, kernel_device, scan_block, monkeypatch):
    rng = random.Random(seed * 101 + width)
    for case in range(6):
        rows, slots, extra, points = _case(rng, width)
        n = rng.randint(1, 4)
        window = rng.choice([0, 1, 3, width + 5])
        tokens, lens = _table(rows, width)
        pts = torch.tensor(points, dtype=torch.int32)
        want = _oracle(rows, width, slots, extra, points, n, window)
        for trim in (True, False):  # the CPU reference scans only as far back as the longest row needs
            monkeypatch.setattr(ref, "_TRIM_ON_CPU", trim)
            a = torch.full((slots.shape[0], len(points)), 7, dtype=torch.int32)
            ref.ngram_probe_ref(tokens, lens, slots, extra, pts, a, n, window)
            assert torch.equal(a, want), (case, rows, slots, extra, points, n, window, a, want)
        d = kernel_device
        b = torch.full((slots.shape[0], len(points)), 7, dtype=torch.int32, device=d)
        tk.ngram_probe_triton(tokens.to(d), lens.to(d), slots.to(d), extra.to(d), pts.to(d), b, n, window)
        assert torch.equal(b.cpu(), want), (case, rows, slots, extra, points, n, window, b, want)


def test_probe_reads_a_strided_chain_and_writes_a_strided_output(kernel_device):
    """The step passes the model chain as the first columns of a wider buffer."""
    rows = [[1, 2, 3, 1, 2], [4, 4, 4]]
    tokens, lens = _table(rows, 16)
    wide = torch.tensor([[3, 1, 9, 9, 0, 0], [4, 5, 6, 7, 0, 0]], dtype=torch.int32)
    extra = wide[:, :4]
    pts = torch.tensor([1, 2, 3], dtype=torch.int32)
    slots = torch.tensor([0, 1])
    want = _oracle(rows, 16, slots, extra, [1, 2, 3], 2, 0)
    assert want.tolist() == [[1, 1, 0], [1, 0, 0]]
    d = kernel_device
    out = torch.zeros(2, 6, dtype=torch.int32, device=d)[:, ::2]
    tk.ngram_probe_triton(tokens.to(d), lens.to(d), slots.to(d), wide.to(d)[:, :4], pts.to(d), out, 2, 0)
    assert torch.equal(out.cpu(), want)
    a = torch.zeros(2, 3, dtype=torch.int32)
    ref.ngram_probe_ref(tokens, lens, slots, extra, pts, a, 2, 0)
    assert torch.equal(a, want)


def test_probe_after_checks_its_arguments_and_leaves_the_table():
    h = TokenHistory(4, 32, "cpu", backend="torch")
    h.write_prompt(torch.tensor([0]), torch.tensor([[5, 6, 7, 5]], dtype=torch.int32),
                   torch.tensor([4], dtype=torch.int32))
    before = (h.tokens.clone(), h.lens.clone())
    out = torch.zeros(1, 2, dtype=torch.int32)
    pts = torch.tensor([1, 2], dtype=torch.int32)
    h.probe_after(torch.tensor([0]), torch.tensor([[6, 9]], dtype=torch.int32), pts, out, 2)
    assert out.tolist() == [[1, 0]] and torch.equal(h.tokens, before[0]) and torch.equal(h.lens, before[1])
    with pytest.raises(ValueError, match="out must have shape"):
        h.probe_after(torch.tensor([0]), torch.tensor([[6, 9]], dtype=torch.int32), pts, torch.zeros(1, 3,
                      dtype=torch.int32), 2)
    with pytest.raises(TypeError, match="extra"):
        h.probe_after(torch.tensor([0]), torch.tensor([[6, 9]]), pts, out, 2)
    with pytest.raises(ValueError, match="probe_after"):
        h.probe_after(torch.tensor([0]), torch.tensor([[6, 9]], dtype=torch.int32), pts, out, 0)
