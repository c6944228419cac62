"""Deferred scoring of n-gram drafts (calibration/deferred.py): the device rings against the plain-Python
reference on random and adversarial histories (a ring narrower than the drafts' reach, slot reuse, empty
drafts), the truncation it removes, the forced scoring after ``depth`` steps, and no allocation per step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration.deferred import DeferredScoring, DeferredScoringRef
from sglang_hybrid.calibration.online import OnlineCalibration, OnlineCalibrationRef
from sglang_hybrid.ngram.history import TokenHistory


def _history(num_slots, width):
    return TokenHistory(num_slots, width, "cpu", backend="torch", max_draft=16)


def _start(hist, slots, logical, first):
    """Write ``first`` as each slot's prompt (device) and its logical copy (Python)."""
    p = torch.tensor(first, dtype=torch.int32)
    hist.write_prompt(slots, p, torch.full((len(first),), p.shape[1], dtype=torch.int32))
    for b, s in enumerate(slots.tolist()):
        logical[s] = list(first[b])


@pytest.mark.parametrize("depth,ring_width", [(1, 64), (3, 64), (4, 20), (8, 512)])
def test_device_rings_equal_the_reference(depth, ring_width):
    rng = np.random.default_rng(depth * 100 + ring_width)
    num_slots, bs, L, vocab = 7, 5, 6, 3  # a tiny vocabulary: drafts often match by chance too
    dev = DeferredScoring(num_slots, bs, L, depth, "cpu")
    ref = DeferredScoringRef(num_slots, L, depth)
    hist = _history(num_slots, ring_width)
    logical: dict[int, list[int]] = {}
    future: dict[int, list[int]] = {}
    _start(hist, torch.arange(num_slots), logical, rng.integers(0, vocab, size=(num_slots, 4)).tolist())
    for s in range(num_slots):
        future[s] = rng.integers(0, vocab, size=4000).tolist()
    tried = torch.zeros(bs, L)
    ok = torch.zeros(bs, L)
    for step in range(120):
        slots = torch.as_tensor(rng.permutation(num_slots)[:bs], dtype=torch.int64)
        if step % 17 == 9:  # a new request on the first slot
            s0 = int(slots[0])
            dev.reset(slots[:1])
            ref.reset(s0)
            _start(hist, slots[:1], logical, rng.integers(0, vocab, size=(1, 4)).tolist())
        # Drafts: the slot's true continuation for a random number of tokens, then noise; some empty.
        tokens = torch.as_tensor(rng.integers(0, vocab, size=(bs, L)), dtype=torch.int32)
        length = torch.as_tensor(rng.integers(0, L + 1, size=bs), dtype=torch.int64)
        length[rng.random(bs) < 0.15] = 0
        q = torch.as_tensor(rng.uniform(0.05, 0.95, size=(bs, L)), dtype=torch.float32)
        start = torch.zeros(bs, dtype=torch.int64)
        for b, s in enumerate(slots.tolist()):
            c = int(rng.integers(0, L + 1))
            tokens[b, :c] = torch.tensor(future[s][:c], dtype=torch.int32)
            start[b] = len(logical[s])
        # The step commits 1..4 tokens of each slot's continuation.
        k = 4
        counts = torch.as_tensor(rng.integers(1, k + 1, size=bs), dtype=torch.int32)
        new = torch.zeros(bs, k, dtype=torch.int32)
        for b, s in enumerate(slots.tolist()):
            n = int(counts[b])
            new[b, :n] = torch.tensor(future[s][:n], dtype=torch.int32)
            logical[s] += future[s][:n]
            future[s] = future[s][n:]
        hist.append(slots, new, counts)
        dev.score(slots, tokens, length, q, start, hist.tokens, hist.lens, tried, ok)
        for b, s in enumerate(slots.tolist()):
            t, o = ref.score(s, tokens[b].tolist(), int(length[b]), q[b].tolist(), int(start[b]), logical[s],
                             ring_width)
            np.testing.assert_allclose(tried[b].numpy(), t, rtol=1e-6, atol=1e-7, err_msg=f"step {step} slot {s}")
            np.testing.assert_allclose(ok[b].numpy(), o, rtol=1e-6, atol=1e-7, err_msg=f"step {step} slot {s}")
        for s in range(num_slots):  # the rings hold the same open drafts
            for d in range(depth):
                e = ref.ring[s][d]
                assert int(dev.length[s, d]) == (e[3] if e else 0)
                if e:
                    assert dev.tok[s, d, : e[3]].tolist() == e[0][: e[3]] and int(dev.start[s, d]) == e[2]
                    assert int(dev.done[s, d]) == e[4]
            assert int(dev.ptr[s]) == ref.ptr[s]


def _one_slot_run(online_defer, steps, L=8, commit=1):
    """One slot whose n-gram draft is always the true continuation; the step commits ``commit`` tokens."""
    text = list(range(100, 100 + L * (steps + 2)))
    hist = _history(1, 256)
    slots = torch.tensor([0])
    hist.write_prompt(slots, torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32))
    on = OnlineCalibration(1, 1, L, "cpu", global_decay=1.0, defer=online_defer)
    pos = 0
    for _ in range(steps):
        tok = torch.tensor([text[pos: pos + L]], dtype=torch.int32)
        q, s = torch.full((1, L), 0.5), torch.full((1, L), 0.5)
        on.apply(slots, tok, torch.tensor([L]), q, s, start=hist.lens.to(torch.int64).clone())
        new = torch.tensor([text[pos: pos + commit]], dtype=torch.int32)
        hist.append(slots, new, torch.tensor([commit], dtype=torch.int32))
        pos += commit
        if online_defer:
            on.update_from_history(slots, hist.tokens, hist.lens)
        else:
            on.update(slots, new, torch.tensor([commit]))
    return on


def test_deep_positions_get_evidence_when_commits_are_short():
    """One token commits per step (a model chain verified at large batch): scored against the step's commit, an
    always-right 8-token draft only ever shows position 0; deferred, every position gets its successes."""
    immediate = _one_slot_run(0, 30)
    assert float(immediate.observed[0, 0]) > 0 and float(immediate.observed[0, 1:].sum()) == 0
    deferred = _one_slot_run(8, 30)
    assert (deferred.observed[0] > 0).all() and float(deferred.expected.sum()) == 0
    # Drafts settle when the history covers them: 30 drafts, all but the last 7 settled, each 0.5 per token.
    assert float(deferred.observed[0, 7]) == pytest.approx(0.5 * (30 - 7))


def test_a_draft_open_for_depth_steps_keeps_what_was_scored():
    on = _one_slot_run(2, 10)  # depth 2: a draft is replaced two steps after its own, 3 tokens known by then
    obs = on.observed[0]
    # Position j of draft k is scored at step k + j if that is before the draft is replaced (j <= 2) and before
    # the run ends (k + j <= 9): 10, 9 and 8 drafts.
    assert obs[:3].tolist() == [0.5 * 10, 0.5 * 9, 0.5 * 8] and float(obs[3:].sum()) == 0
    assert float(on.expected.sum()) == 0  # nothing failed: no failure is invented for the unknown tail


@pytest.mark.parametrize("bins", [0, 8])
def test_online_calibration_deferred_equals_reference(bins):
    rng = np.random.default_rng(5)
    num_slots, bs, L, depth = 6, 4, 5, 3
    on = OnlineCalibration(num_slots, bs, L, "cpu", strength=1.5, global_decay=0.95, defer=depth, bins=bins)
    ref = OnlineCalibrationRef(num_slots, L, strength=1.5, global_decay=0.95, bins=bins)
    dref = DeferredScoringRef(num_slots, L, depth)
    hist = _history(num_slots, 128)
    logical: dict[int, list[int]] = {}
    _start(hist, torch.arange(num_slots), logical, rng.integers(0, 3, size=(num_slots, 3)).tolist())
    for step in range(60):
        slots = torch.as_tensor(rng.permutation(num_slots)[:bs], dtype=torch.int64)
        tokens = torch.as_tensor(rng.integers(0, 3, size=(bs, L)), dtype=torch.int32)
        length = torch.as_tensor(rng.integers(1, L + 1, size=bs), dtype=torch.int64)
        q = torch.as_tensor(rng.uniform(0.1, 0.9, size=(bs, L)), dtype=torch.float32)
        q = torch.where(torch.arange(L)[None, :] < length[:, None], q, 0.0)
        start = hist.lens[slots].to(torch.int64)
        q_dev, s_dev = q.clone(), torch.cumprod(q, 1)
        on.apply(slots, tokens, length, q_dev, s_dev, start=start)
        q1 = {}
        for b, s in enumerate(slots.tolist()):
            qr, _ = ref.apply(s, tokens[b].tolist(), int(length[b]), q[b].tolist())
            np.testing.assert_allclose(q_dev[b].numpy(), qr, rtol=2e-6, atol=1e-7)
            q1[s] = on._q1[b].tolist()  # the first stage's estimates as the device kept them (bins are exact)
        counts = torch.as_tensor(rng.integers(1, 4, size=bs), dtype=torch.int32)
        new = torch.as_tensor(rng.integers(0, 3, size=(bs, 3)), dtype=torch.int32)
        hist.append(slots, new, counts)
        ev, bt, bo = {}, [0.0] * (L * max(bins, 1)), [0.0] * (L * max(bins, 1))
        for b, s in enumerate(slots.tolist()):
            logical[s] += new[b, : int(counts[b])].tolist()
            out = dref.score(s, tokens[b].tolist(), int(length[b]), q[b].tolist(), int(start[b]), logical[s], 128,
                             q1=q1[s], bins=bins)
            ev[s] = out[:2]
            if bins:
                bt = [x + y for x, y in zip(bt, out[2])]
                bo = [x + y for x, y in zip(bo, out[3])]
        on.update_from_history(slots, hist.tokens, hist.lens)
        ref.add_evidence(ev, (bt, bo) if bins else None)
    np.testing.assert_allclose(on.expected.numpy(), np.array(ref.E), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(on.observed.numpy(), np.array(ref.O), rtol=1e-5, atol=1e-6)
    assert float(on.observed.sum()) > 0 and float(on.expected.sum()) > 0
    if bins:
        np.testing.assert_allclose(on.bin_expected.numpy(), np.array(ref.BE), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(on.bin_observed.numpy(), np.array(ref.BO), rtol=1e-4, atol=1e-6)
        assert float(on.bin_observed.sum()) > 0 and float(on.bin_expected.sum()) > 0


def test_deferred_steps_allocate_nothing():
    bs, L = 4, 8
    on = OnlineCalibration(8, bs, L, "cpu", defer=4, bins=8)
    hist = _history(8, 64)
    slots = torch.arange(bs, dtype=torch.int64)
    hist.write_prompt(slots, torch.ones(bs, 3, dtype=torch.int32), torch.full((bs,), 3, dtype=torch.int32))
    tok = torch.ones(bs, L, dtype=torch.int32)
    length = torch.full((bs,), L, dtype=torch.int32)
    start = torch.full((bs,), 3, dtype=torch.int64)
    q, s = torch.full((bs, L), 0.5), torch.full((bs, L), 0.5)
    on.apply(slots, tok, length, q, s, start=start)
    on.update_from_history(slots, hist.tokens, hist.lens)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        on.apply(slots, tok, length, q, s, start=start)
        on.update_from_history(slots, hist.tokens, hist.lens)
    allocs = [e for e in prof.events() if e.cpu_memory_usage > 0]
    assert not allocs, [(e.name, e.cpu_memory_usage) for e in allocs]


def test_bad_depth_and_missing_start_are_named():
    with pytest.raises(ValueError, match="defer"):
        OnlineCalibration(1, 1, 1, "cpu", defer=-1)
    on = OnlineCalibration(1, 1, 2, "cpu", defer=2)
    with pytest.raises(ValueError, match="start="):
        on.apply(torch.tensor([0]), torch.zeros(1, 2, dtype=torch.int32), torch.tensor([2]), torch.full((1, 2), 0.5),
                 torch.full((1, 2), 0.5))
