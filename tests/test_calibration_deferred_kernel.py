"""Deferred scoring's Triton kernel (``calibration/deferred_kernel.py``) against its plain-torch reference
(``DeferredScoring._elems_torch``, the path the CPU runs): the evidence, the bins' sums and every ring equal bit for
bit, and the kernel path equals the plain-Python oracle (``DeferredScoringRef``).

Inputs are random and adversarial: a three-token vocabulary (drafts match the history by chance), drafts that are
the slot's true continuation (long matches, drafts settled by the history covering them), empty drafts, a
history ring narrower than the drafts' reach, slot reuse with a shorter prompt (a stale ring entry whose start
lies past the new history's end), estimates on the bins' edges (0, k / bins, 1), batch sizes that change from
step to step, int32 and int64 slots, and a draft tensor that is a strided slice. Runs on ``kernel_device`` (the
Triton interpreter on a CPU; compiled kernels under ``HYBRID_TEST_DEVICE=cuda``, ``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration.deferred import DeferredScoring, DeferredScoringRef
from sglang_hybrid.calibration.online import OnlineCalibration
from sglang_hybrid.ngram.history import TokenHistory


def _run(dev, depth, ring_width, bins, seed, steps=40, num_slots=6, max_bs=4, L=6, vocab=3):
    rng = np.random.default_rng(seed)
    pair = [DeferredScoring(num_slots, max_bs, L, depth, dev, bins=bins, backend=b) for b in ("torch", "triton")]
    ref = DeferredScoringRef(num_slots, L, depth)
    hist = TokenHistory(num_slots, ring_width, dev, backend="torch", max_draft=16)
    logical: dict[int, list[int]] = {}
    future = {s: rng.integers(0, vocab, size=2000).tolist() for s in range(num_slots)}

    def prompt(slots, n):
        p = rng.integers(0, vocab, size=(len(slots), n)).tolist()
        hist.write_prompt(torch.as_tensor(slots, device=dev), torch.tensor(p, dtype=torch.int32, device=dev),
                          torch.full((len(slots),), n, dtype=torch.int32, device=dev))
        for s, row in zip(slots, p):
            logical[s] = list(row)

    prompt(list(range(num_slots)), 12)
    K = max(bins, 1)
    edges = torch.tensor([0.0, 1.0] + [k / K for k in range(1, K)], dtype=torch.float32)
    outs = [[torch.zeros(max_bs, L, device=dev), torch.zeros(max_bs, L, device=dev),
             torch.zeros(K * L, device=dev), torch.zeros(K * L, device=dev)] for _ in pair]
    for step in range(steps):
        bs = int(rng.integers(1, max_bs + 1))
        slot_list = rng.permutation(num_slots)[:bs].tolist()
        slots = torch.tensor(slot_list, dtype=torch.int32 if step % 2 else torch.int64, device=dev)
        if step % 7 == 3:  # a new request, with a shorter prompt than the slot held: stale entries' starts lie ahead
            s0 = slot_list[0]
            for x in pair:
                x.reset(slots[:1])
            ref.reset(s0)
            prompt([s0], int(rng.integers(1, 4)))
        wide = torch.as_tensor(rng.integers(0, vocab, size=(bs, 2 * L)), dtype=torch.int32)
        length = torch.as_tensor(rng.integers(0, L + 1, size=bs), dtype=torch.int64)
        length[torch.as_tensor(rng.random(bs) < 0.15)] = 0
        q = torch.as_tensor(rng.uniform(0.0, 1.0, size=(bs, L)), dtype=torch.float32)
        q1 = torch.as_tensor(rng.uniform(0.0, 1.0, size=(bs, L)), dtype=torch.float32)
        on_edge = torch.as_tensor(rng.random((bs, L)) < 0.3)
        q1[on_edge] = edges[torch.as_tensor(rng.integers(0, len(edges), size=int(on_edge.sum())))]
        q[:, 0][torch.as_tensor(rng.random(bs) < 0.2)] = 1.0
        start = torch.zeros(bs, dtype=torch.int64)
        for b, s in enumerate(slot_list):
            c = int(rng.integers(0, L + 1))
            wide[b, 0: 2 * c: 2] = torch.tensor(future[s][:c], dtype=torch.int32)
            start[b] = len(logical[s])
        tokens = wide.to(dev)[:, ::2]  # a strided view: row stride 2 L, column stride 2
        counts = torch.as_tensor(rng.integers(1, 6, size=bs), dtype=torch.int32)
        new = torch.zeros(bs, 5, dtype=torch.int32)
        for b, s in enumerate(slot_list):
            n = int(counts[b])
            new[b, :n] = torch.tensor(future[s][:n], dtype=torch.int32)
            logical[s] += future[s][:n]
            future[s] = future[s][n:]
        hist.append(slots, new.to(dev), counts.to(dev))
        args = (slots, tokens, length.to(dev), q.to(dev), start.to(dev), hist.tokens, hist.lens)
        for x, o in zip(pair, outs):
            x.score(*args, o[0][:bs], o[1][:bs], q1=q1.to(dev) if bins else None, bin_tried_out=o[2],
                    bin_ok_out=o[3])
        for i, name in enumerate(("tried", "ok", "bin tried", "bin ok")[: 4 if bins else 2]):
            assert torch.equal(outs[0][i], outs[1][i]), f"step {step}: {name} differs"
        names = ("tok", "q", "start", "length", "done", "q1", "ptr")
        for name, a, b in zip(names, pair[0].rings, pair[1].rings):
            assert torch.equal(a, b), f"step {step}: ring {name} differs"
        for b, s in enumerate(slot_list):  # the oracle, on the logical history
            got = ref.score(s, tokens[b].tolist(), int(length[b]), q[b].tolist(), int(start[b]), logical[s],
                            ring_width, q1=q1[b].tolist() if bins else None, bins=bins)
            np.testing.assert_allclose(outs[1][0][b].cpu().numpy(), got[0], rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(outs[1][1][b].cpu().numpy(), got[1], rtol=1e-6, atol=1e-7)
    return pair


@pytest.mark.parametrize("depth,ring_width,bins", [(1, 64, 0), (3, 64, 8), (4, 16, 8), (8, 512, 8), (8, 16, 0), (4, 5, 8),
                                                   (5, 64, 3)])
def test_kernel_equals_the_torch_reference_exactly(kernel_device, depth, ring_width, bins):
    _run(kernel_device, depth, ring_width, bins, seed=depth * 1000 + ring_width + bins)


def test_kernel_bin_sums_equal_the_oracle(kernel_device):
    """The bins' sums (not covered by the per-slot oracle check above) against the oracle, one slot per step."""
    dev = kernel_device
    rng = np.random.default_rng(7)
    L, depth, bins, W = 5, 3, 4, 64
    x = DeferredScoring(2, 1, L, depth, dev, bins=bins, backend="triton")
    ref = DeferredScoringRef(2, L, depth)
    hist = TokenHistory(2, W, dev, backend="torch", max_draft=16)
    hist.write_prompt(torch.tensor([0, 1], device=dev), torch.zeros(2, 3, dtype=torch.int32, device=dev),
                      torch.tensor([3, 3], dtype=torch.int32, device=dev))
    logical = [0, 0, 0]
    text = rng.integers(0, 2, size=400).tolist()
    bt, bo = torch.zeros(bins * L, device=dev), torch.zeros(bins * L, device=dev)
    tried, ok = torch.zeros(1, L, device=dev), torch.zeros(1, L, device=dev)
    for _ in range(30):
        tok = torch.as_tensor(rng.integers(0, 2, size=(1, L)), dtype=torch.int32)
        q = torch.as_tensor(rng.uniform(size=(1, L)), dtype=torch.float32)
        q1 = torch.as_tensor(rng.uniform(size=(1, L)), dtype=torch.float32)
        start = len(logical)
        n = int(rng.integers(1, 4))
        new, text = text[:n], text[n:]
        logical += new
        hist.append(torch.tensor([1], device=dev), torch.tensor([new], dtype=torch.int32, device=dev),
                    torch.tensor([n], dtype=torch.int32, device=dev))
        x.score(torch.tensor([1], device=dev), tok.to(dev), torch.tensor([L], device=dev), q.to(dev),
                torch.tensor([start], device=dev), hist.tokens, hist.lens, tried, ok, q1=q1.to(dev),
                bin_tried_out=bt, bin_ok_out=bo)
        _, _, rbt, rbo = ref.score(1, tok[0].tolist(), L, q[0].tolist(), start, logical, W, q1=q1[0].tolist(),
                                   bins=bins)
        np.testing.assert_allclose(bt.cpu().numpy(), rbt, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(bo.cpu().numpy(), rbo, rtol=1e-6, atol=1e-7)


def test_online_calibration_with_the_kernel_equals_the_torch_path(kernel_device):
    """``OnlineCalibration(defer, bins)`` end to end (apply, append, update_from_history): the records, the
    traffic level and the bins are the same bit for bit whichever backend scores the drafts. (``apply`` runs as
    torch ops in both, since its own kernel sums in another order: ``test_calibration_online_kernel.py``.)"""
    dev = kernel_device
    rng = np.random.default_rng(3)
    L, N, bs = 6, 5, 3
    ons = [OnlineCalibration(N, bs, L, dev, defer=4, bins=8, backend=b) for b in ("torch", "triton")]
    ons[1]._apply_kernel = None  # the deferred scoring alone differs between the two
    hist = TokenHistory(N, 128, dev, backend="torch", max_draft=16)
    hist.write_prompt(torch.arange(N, device=dev), torch.zeros(N, 2, dtype=torch.int32, device=dev),
                      torch.full((N,), 2, dtype=torch.int32, device=dev))
    text = {s: rng.integers(0, 3, size=600).tolist() for s in range(N)}
    for _ in range(25):
        sl = rng.permutation(N)[:bs].tolist()
        slots = torch.tensor(sl, device=dev)
        tok = torch.as_tensor([text[s][: L] if rng.random() < 0.5 else rng.integers(0, 3, size=L).tolist()
                               for s in sl], dtype=torch.int32, device=dev)
        length = torch.as_tensor(rng.integers(0, L + 1, size=bs), device=dev)
        q0 = torch.as_tensor(rng.uniform(0.05, 0.95, size=(bs, L)), dtype=torch.float32, device=dev)
        start = hist.lens.index_select(0, slots).to(torch.int64)
        for on in ons:
            q, sv = q0.clone(), torch.cumprod(q0, 1)
            on.apply(slots, tok, length, q, sv, start=start)
        n = rng.integers(1, 5, size=bs)
        new = torch.zeros(bs, 4, dtype=torch.int32)
        for b, s in enumerate(sl):
            new[b, : n[b]] = torch.tensor(text[s][: n[b]], dtype=torch.int32)
            text[s] = text[s][n[b]:]
        hist.append(slots, new.to(dev), torch.as_tensor(n, dtype=torch.int32, device=dev))
        for on in ons:
            on.update_from_history(slots, hist.tokens, hist.lens)
    a, b = ons
    for name in ("expected", "observed", "global_expected", "global_observed", "bin_expected", "bin_observed"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert float(a.observed.sum()) > 0 and float(a.expected.sum()) > 0 and float(a.bin_observed.sum()) > 0


def test_torch_path_refuses_foreign_rings():
    x = DeferredScoring(2, 1, 4, 2, "cpu")
    other = DeferredScoring(2, 1, 4, 2, "cpu")
    z = torch.zeros(1, 3, 4)
    with pytest.raises(ValueError, match="its own rings"):
        x._elems_torch(other.rings, torch.zeros(1, dtype=torch.int64), torch.zeros(1, 4, dtype=torch.int32),
                       torch.zeros(1, dtype=torch.int64), torch.zeros(1, 4), torch.zeros(1, dtype=torch.int64), None,
                       torch.zeros(2, 8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), z, z, z, z,
                       torch.zeros(1, 3, 4, dtype=torch.int64), 0)


def test_bins_need_their_inputs():
    x = DeferredScoring(2, 1, 4, 2, "cpu", bins=4)
    with pytest.raises(ValueError, match="needs q1"):
        x.score(torch.zeros(1, dtype=torch.int64), torch.zeros(1, 4, dtype=torch.int32),
                torch.zeros(1, dtype=torch.int64), torch.zeros(1, 4), torch.zeros(1, dtype=torch.int64),
                torch.zeros(2, 8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), torch.zeros(1, 4),
                torch.zeros(1, 4))
