"""Online per-request recalibration: device module vs its plain-Python reference, the no-evidence case equal
to the shipped calibration bit for bit, shrinkage towards a request's record, and no allocation per step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration import CalibrationTable, DeviceCalibration
from sglang_hybrid.calibration.online import OnlineCalibration, OnlineCalibrationRef
from sglang_hybrid.ngram import NgramDraft


def _draft(rng, bs, L):
    tokens = torch.as_tensor(rng.integers(0, 4, size=(bs, L)), dtype=torch.int32)
    length = torch.as_tensor(rng.integers(0, L + 1, size=bs), dtype=torch.int32)
    return NgramDraft(tokens, length,
                      torch.as_tensor(rng.integers(2, 9, size=bs), dtype=torch.int32),
                      torch.as_tensor(rng.integers(1, 40, size=bs), dtype=torch.int32),
                      torch.as_tensor(rng.integers(0, 2, size=bs), dtype=torch.int32))


@pytest.mark.parametrize("bins", [0, 8])
def test_no_evidence_equals_the_shipped_calibration_exactly(bins):
    table = CalibrationTable.load_default()
    dev = DeviceCalibration(table, "cpu", backend="torch")
    rng = np.random.default_rng(0)
    bs, L = 9, 16
    online = OnlineCalibration(12, bs, L, "cpu", strength=3.0, bins=bins)
    for _ in range(3):
        d = _draft(rng, bs, L)
        model = torch.as_tensor(rng.integers(0, 4, size=(bs, 3)), dtype=torch.int32)
        q0, s0 = torch.zeros(bs, L), torch.zeros(bs, L)
        dev.apply(d, model, q0, s0)
        q1, s1 = q0.clone(), s0.clone()
        slots = torch.as_tensor(rng.permutation(12)[:bs], dtype=torch.int64)
        online.reset(slots)
        online.apply(slots, d.tokens, d.length, q1, s1)
        assert torch.equal(q1, q0) and torch.equal(s1, s0)


@pytest.mark.parametrize("strength,bins", [(0.5, 0), (2.0, 0), (8.0, 0), (2.0, 8), (0.5, 4)])
def test_device_module_equals_python_reference(strength, bins):
    rng = np.random.default_rng(int(strength * 10) + bins)
    num_slots, bs, L = 10, 6, 8
    dev = OnlineCalibration(num_slots, bs, L, "cpu", strength=strength, global_decay=0.9, bins=bins)
    ref = OnlineCalibrationRef(num_slots, L, strength=strength, global_decay=0.9, bins=bins)
    dev.reset(torch.arange(num_slots))
    for step in range(40):
        slots = torch.as_tensor(rng.permutation(num_slots)[:bs], dtype=torch.int64)
        if step % 9 == 4:  # a new request arrives on two slots
            dev.reset(slots[:2])
            for s in slots[:2].tolist():
                ref.reset(s)
        d = _draft(rng, bs, L)
        q = torch.as_tensor(rng.uniform(0, 1, size=(bs, L)), dtype=torch.float32)
        q[0, 0] = 0.0
        q[1 % bs, 1] = 1.0
        q = torch.where(torch.arange(L)[None, :] < d.length.view(-1, 1).to(torch.int64), q, 0.0)
        surv = torch.cumprod(q, 1)
        q_dev, s_dev = q.clone(), surv.clone()
        dev.apply(slots, d.tokens, d.length, q_dev, s_dev)
        for b, s in enumerate(slots.tolist()):
            qr, sr = ref.apply(s, d.tokens[b].tolist(), int(d.length[b]), q[b].tolist())
            np.testing.assert_allclose(q_dev[b].numpy(), qr, rtol=2e-6, atol=1e-7)
            np.testing.assert_allclose(s_dev[b].numpy(), sr, rtol=2e-5, atol=1e-7)
        # The target commits: often the draft's own tokens for a while (so positions get evidence), then others.
        K = L + 1
        committed = torch.as_tensor(rng.integers(0, 4, size=(bs, K)), dtype=torch.int32)
        copy = torch.as_tensor(rng.integers(0, L + 1, size=bs))
        for b in range(bs):
            committed[b, : copy[b]] = d.tokens[b, : copy[b]]
        clen = torch.as_tensor(rng.integers(1, K + 1, size=bs), dtype=torch.int32)
        dev.update(slots, committed, clen)
        ref.update({s: committed[b, : int(clen[b])].tolist() for b, s in enumerate(slots.tolist())})
    np.testing.assert_allclose(dev.expected.numpy(), np.array(ref.E), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dev.observed.numpy(), np.array(ref.O), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dev.global_expected.numpy(), np.array(ref.GE), rtol=1e-4)
    np.testing.assert_allclose(dev.global_observed.numpy(), np.array(ref.GO), rtol=1e-4)
    assert sum(x > 0 for x in ref.GO) >= 4  # positions got evidence: the global level is exercised
    if bins:
        np.testing.assert_allclose(dev.bin_expected.numpy(), np.array(ref.BE), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(dev.bin_observed.numpy(), np.array(ref.BO), rtol=1e-4, atol=1e-6)
        assert sum(x > 0 for x in ref.BO) >= 4 and sum(x > 0 for x in ref.BE) >= 4  # several cells exercised


def test_estimate_shrinks_towards_the_request_record():
    """A request whose drafts are always right moves from the table's 0.5 towards 1; one whose drafts always fail
    moves towards 0; the more evidence, the closer."""
    L = 4
    on = OnlineCalibration(2, 2, L, "cpu", strength=2.0, global_decay=1.0)
    slots = torch.tensor([0, 1])
    tok = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]], dtype=torch.int32)
    length = torch.tensor([4, 4], dtype=torch.int32)
    committed = torch.tensor([[5, 6, 7, 8, 9], [1, 1, 1, 1, 1]], dtype=torch.int32)
    clen = torch.tensor([5, 5], dtype=torch.int32)
    prev = None
    for step in range(30):
        q = torch.full((2, L), 0.5)
        s = torch.cumprod(q, 1)
        on.apply(slots, tok, length, q, s)
        if prev is not None:
            assert q[0, 0] >= prev[0] and q[1, 0] <= prev[1]
        prev = (float(q[0, 0]), float(q[1, 0]))
        on.update(slots, committed, clen)
    assert q[0].min() > 0.9 and float(q[0].max()) <= 1.0
    assert q[1, 0] < 0.1
    # The failing request never tried positions 1..3: they shrink towards its request-level ratio (times the
    # traffic's, where the other request's successes pull the other way).
    assert on.expected[1, 1:].abs().sum() == 0 and on.observed[1].abs().sum() == 0
    assert q[1, 1] < q[0, 1] - 0.3


def test_a_new_request_starts_from_the_traffic_level():
    """Requests whose drafts keep failing teach the traffic level: a fresh request starts below the table."""
    L = 3
    on = OnlineCalibration(4, 4, L, "cpu", strength=2.0, global_decay=1.0)
    slots = torch.arange(4)
    tok = torch.full((4, L), 7, dtype=torch.int32)
    length = torch.full((4,), L, dtype=torch.int32)
    committed = torch.zeros(4, L + 1, dtype=torch.int32)
    clen = torch.full((4,), L + 1, dtype=torch.int32)
    for _ in range(20):
        q, s = torch.full((4, L), 0.6), torch.full((4, L), 0.6)
        on.apply(slots, tok, length, q, s)
        on.update(slots, committed, clen)
    on.reset(slots[:1])
    q, s = torch.full((4, L), 0.6), torch.full((4, L), 0.6)
    on.apply(slots, tok, length, q, s)
    assert on.expected[0].sum() == 0 and q[0, 0] < 0.15


def test_apply_and_update_allocate_nothing():
    bs, L = 8, 8
    on = OnlineCalibration(16, bs, L, "cpu", bins=8)
    slots = torch.arange(bs, dtype=torch.int64)
    tok = torch.zeros(bs, L, dtype=torch.int32)
    length = torch.full((bs,), L, dtype=torch.int32)
    q, s = torch.full((bs, L), 0.5), torch.full((bs, L), 0.5)
    committed = torch.zeros(bs, L + 1, dtype=torch.int32)
    clen = torch.full((bs,), 3, dtype=torch.int32)
    on.apply(slots, tok, length, q, s)
    on.update(slots, committed, clen)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        on.apply(slots, tok, length, q, s)
        on.update(slots, committed, clen)
    allocs = [e for e in prof.events() if e.cpu_memory_usage > 0]
    assert not allocs, [(e.name, e.cpu_memory_usage) for e in allocs]


def test_bad_strength_is_named():
    with pytest.raises(ValueError, match="strength"):
        OnlineCalibration(1, 1, 1, "cpu", strength=0.0)
