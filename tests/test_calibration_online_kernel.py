"""The online recalibration's ``apply`` kernel (``calibration/online_kernel.py``): the Triton kernel equals its
plain-torch reference ``online_apply_ref`` bit for bit, the reference equals the plain-Python definition
(``OnlineCalibrationRef``) and the vectorised torch path of ``OnlineCalibration.apply`` to float32 rounding, and
``OnlineCalibration`` with the Triton backend follows the torch one step by step.

Inputs are random and adversarial: no evidence (every ratio exactly 1, so ``q`` and the survivals must come back
unchanged bit for bit), records of very different sizes, estimates of exactly 0 and 1 and on the bins' edges,
batches of one and across several programs (``BLOCK_B`` 32), int32 and int64 slots and tokens, and ``q`` /
survival tensors with a column stride of 2. Runs on ``kernel_device`` (``scripts/gpu_check.sh`` runs it
compiled on CUDA).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration.online import OnlineCalibration, OnlineCalibrationRef
from sglang_hybrid.calibration.online_kernel import BLOCK_B, online_apply_ref, online_apply_triton


def _case(dev, seed, bins, bs, L=7, empty=False, strided=False, slot_dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    N = bs + 5
    scale = torch.tensor([0.0, 1e-3, 1.0, 50.0, 3e4])[torch.randint(0, 5, (N, 1), generator=g)]
    E, O = torch.rand(N, L, generator=g) * scale, torch.rand(N, L, generator=g) * scale
    GE, GO = torch.rand(L, generator=g) * 200, torch.rand(L, generator=g) * 200
    K = max(bins, 1)
    BE, BO = torch.rand(K * L, generator=g) * 20, torch.rand(K * L, generator=g) * 20
    if empty:
        E, O, GE, GO, BE, BO = (torch.zeros_like(t) for t in (E, O, GE, GO, BE, BO))
    slots = torch.randperm(N, generator=g)[:bs].to(slot_dtype)
    tok = torch.randint(0, 1000, (bs, L), generator=g, dtype=torch.int32 if seed % 2 else torch.int64)
    length = torch.randint(0, L + 1, (bs,), generator=g)
    q = torch.rand(bs, L, generator=g)
    edges = torch.tensor([0.0, 1.0] + [k / K for k in range(1, K)])
    pick = torch.rand(bs, L, generator=g) < 0.3
    q[pick] = edges[torch.randint(0, len(edges), (int(pick.sum()),), generator=g)]
    sv = torch.cumprod(q, 1)
    to = lambda *ts: [t.to(dev) for t in ts]  # noqa: E731
    recs = to(E, O, GE, GO, BE, BO)
    if strided:  # every other column of a wider buffer
        qw, sw = torch.zeros(bs, 2 * L, device=dev), torch.zeros(bs, 2 * L, device=dev)
        qw[:, ::2], sw[:, ::2] = q.to(dev), sv.to(dev)
        qd, sd = qw[:, ::2], sw[:, ::2]
    else:
        qd, sd = to(q, sv)
    return recs, to(slots, tok, length), qd, sd


def _keep(dev, bs, L):
    return (torch.zeros(bs, dtype=torch.int64, device=dev), torch.zeros(bs, L, dtype=torch.int32, device=dev),
            torch.zeros(bs, dtype=torch.int64, device=dev), torch.zeros(bs, L, device=dev),
            torch.zeros(bs, L, device=dev), torch.zeros(bs, L, dtype=torch.int64, device=dev))


@pytest.mark.parametrize("bins", [0, 3, 8])
@pytest.mark.parametrize("bs", [1, 5, BLOCK_B + 1, 2 * BLOCK_B + 7])
def test_kernel_equals_the_reference_exactly(kernel_device, bins, bs):
    for seed in range(3):
        for strided in (False, True):
            recs, (slots, tok, length), q, sv = _case(kernel_device, seed * 10 + bs, bins, bs, strided=strided,
                                                      slot_dtype=torch.int32 if seed == 1 else torch.int64)
            outs = []
            for fn in (online_apply_ref, online_apply_triton):
                keep = _keep(kernel_device, bs, q.shape[1])
                if strided:  # in place into views with a column stride of 2, as given
                    qq = torch.zeros(bs, 2 * q.shape[1], device=kernel_device)[:, ::2].copy_(q)
                    ss = torch.zeros(bs, 2 * q.shape[1], device=kernel_device)[:, ::2].copy_(sv)
                else:
                    qq, ss = q.clone(), sv.clone()
                fn(*recs, 2.0, slots, tok, length, qq, ss, *keep, bins)
                outs.append((qq, ss) + keep)
            names = ("q", "survival", "slots", "tokens", "length", "table q", "first stage q", "bin")
            for name, a, b in zip(names, *outs):
                if name in ("first stage q", "bin") and not bins:
                    continue
                assert torch.equal(a, b), f"seed {seed} strided {strided}: {name} differs"
            assert torch.equal(outs[1][5], q) and torch.equal(outs[1][3], tok.to(torch.int32))


@pytest.mark.parametrize("bins", [0, 8])
def test_no_evidence_leaves_the_table_bit_for_bit(kernel_device, bins):
    recs, (slots, tok, length), q, sv = _case(kernel_device, 5, bins, 9, empty=True)
    for fn in (online_apply_ref, online_apply_triton):
        qq, ss = q.clone(), sv.clone()
        fn(*recs, 2.0, slots, tok, length, qq, ss, *_keep(kernel_device, 9, q.shape[1]), bins)
        assert torch.equal(qq, q) and torch.equal(ss, sv), fn.__name__


def test_reference_equals_the_python_definition_and_the_torch_path():
    """``online_apply_ref`` against ``OnlineCalibrationRef`` (the Python definition, in double precision) and
    against ``OnlineCalibration.apply``'s vectorised ops: the same numbers up to float32 rounding."""
    rng = np.random.default_rng(11)
    N, L, bs = 6, 5, 4
    slots = torch.tensor([4, 0, 2, 5])
    tok = torch.randint(0, 9, (bs, L), dtype=torch.int32)
    length = torch.full((bs,), L)
    q = torch.as_tensor(rng.uniform(0.05, 0.95, size=(bs, L)), dtype=torch.float32)
    for bins in (0, 8):
        on = OnlineCalibration(N, bs, L, "cpu", bins=bins, backend="torch")
        ref = OnlineCalibrationRef(N, L, bins=bins)
        K = max(bins, 1)
        for t, shape in ((on.expected, (N, L)), (on.observed, (N, L)), (on.global_expected, L),
                         (on.global_observed, L), (on.bin_expected, K * L), (on.bin_observed, K * L)):
            t.copy_(torch.as_tensor(rng.uniform(0, 9, size=shape), dtype=torch.float32))
        ref.E, ref.O = on.expected.double().tolist(), on.observed.double().tolist()
        ref.GE, ref.GO = on.global_expected.double().tolist(), on.global_observed.double().tolist()
        ref.BE, ref.BO = on.bin_expected.double().tolist(), on.bin_observed.double().tolist()
        qa, sa = q.clone(), torch.cumprod(q, 1)
        on.apply(slots, tok, length, qa, sa)
        qb, sb = q.clone(), torch.cumprod(q, 1)
        online_apply_ref(on.expected, on.observed, on.global_expected, on.global_observed, on.bin_expected,
                         on.bin_observed, 2.0, slots, tok, length, qb, sb, *_keep("cpu", bs, L), bins)
        torch.testing.assert_close(qb, qa, rtol=3e-6, atol=1e-7)
        torch.testing.assert_close(sb, sa, rtol=3e-6, atol=1e-7)
        for b, s in enumerate(slots.tolist()):
            rq, rs = ref.apply(s, tok[b].tolist(), L, q[b].tolist())
            np.testing.assert_allclose(qb[b].numpy(), rq, rtol=3e-6, err_msg=f"bins {bins}")
            np.testing.assert_allclose(sb[b].numpy(), rs, rtol=3e-6, err_msg=f"bins {bins}")


@pytest.mark.parametrize("bins", [0, 8])
def test_online_calibration_with_the_kernel_follows_the_torch_path(kernel_device, bins):
    """``OnlineCalibration``, apply then update over many steps, Triton backend against torch: the records
    (scored with the table's ``q``, which both keep as given) are equal bit for bit; the estimates agree to float32
    rounding, except where the first stage's ``q'`` sits within rounding of a bin's edge and the two land in
    neighbouring bins (the vectorised torch path sums in another order than the kernel)."""
    dev = kernel_device
    rng = np.random.default_rng(5)
    N, L, bs = 6, 6, 4
    ons = [OnlineCalibration(N, bs, L, dev, bins=bins, backend=b) for b in ("torch", "triton")]
    for step in range(30):
        slots = torch.as_tensor(rng.permutation(N)[:bs], device=dev)
        tok = torch.as_tensor(rng.integers(0, 3, size=(bs, L)), dtype=torch.int32, device=dev)
        length = torch.as_tensor(rng.integers(0, L + 1, size=bs), device=dev)
        q0 = torch.as_tensor(rng.uniform(0.02, 0.98, size=(bs, L)), dtype=torch.float32, device=dev)
        committed = torch.as_tensor(rng.integers(0, 3, size=(bs, L)), dtype=torch.int32, device=dev)
        counts = torch.as_tensor(rng.integers(1, L + 1, size=bs), device=dev)
        got = []
        for on in ons:
            q, sv = q0.clone(), torch.cumprod(q0, 1)
            on.apply(slots, tok, length, q, sv)
            got.append((q, sv, on._q1[:bs].clone()))
            on.update(slots, committed, counts)
        same = torch.ones(bs, L, dtype=torch.bool, device=dev)
        if bins:
            q1a, q1b = got[0][2], got[1][2]
            torch.testing.assert_close(q1b, q1a, rtol=1e-5, atol=1e-6)
            ka, kb = (torch.floor(x * bins).clamp(0, bins - 1) for x in (q1a, q1b))
            same = ka == kb
            edge = torch.round(q1a * bins) / bins
            assert ((q1a - edge).abs()[~same] < 1e-5).all(), f"step {step}: a bin differs away from an edge"
            same = torch.cumprod(same.to(torch.int32), 1).bool()  # survivals carry a flip to the right
        torch.testing.assert_close(got[1][0][same], got[0][0][same], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[1][1][same], got[0][1][same], rtol=1e-5, atol=1e-6)
    a, b = ons
    for name in ("expected", "observed", "global_expected", "global_observed"):
        assert torch.equal(getattr(b, name), getattr(a, name)), name
    assert float(a.observed.sum()) > 0 and float(a.expected.sum()) > 0


@pytest.mark.parametrize("bins", [0, 8])
@pytest.mark.parametrize("bs", [1, 6, 2 * BLOCK_B + 7])
def test_update_kernel_equals_the_torch_path_exactly(kernel_device, bins, bs):
    """``update`` (the records scored against each step's commit) with its Triton kernel against the torch ops
    (its reference, ``OnlineCalibration._update_elems_torch``): the per-token evidence and every record equal bit
    for bit. Commits narrower and wider than the drafts, strided and int64 commits, lengths from 0 to past the
    draft, drafts that copy the commit for a while. ``apply`` runs as torch ops in both (its kernel rounds
    differently), so both score the same kept drafts."""
    dev = kernel_device
    rng = np.random.default_rng(bs * 10 + bins)
    N, L = bs + 3, 6
    ons = [OnlineCalibration(N, bs, L, dev, bins=bins, backend=b) for b in ("torch", "triton")]
    ons[1]._apply_kernel = None
    for step in range(12):
        slots = torch.as_tensor(rng.permutation(N)[:bs], dtype=torch.int32 if step % 2 else torch.int64, device=dev)
        width = int(rng.choice([1, 3, L, L + 3]))
        committed = torch.as_tensor(rng.integers(0, 3, size=(bs, 2 * width)), dtype=torch.int64 if step % 3 else
                                    torch.int32, device=dev)[:, ::2]  # column stride 2
        tok = torch.as_tensor(rng.integers(0, 3, size=(bs, L)), dtype=torch.int32, device=dev)
        copy = rng.integers(0, L + 1, size=bs)
        for b in range(bs):
            c = min(int(copy[b]), width)
            tok[b, :c] = committed[b, :c].to(torch.int32)
        length = torch.as_tensor(rng.integers(0, L + 1, size=bs), device=dev)
        counts = torch.as_tensor(rng.integers(0, width + 2, size=bs), dtype=torch.int32, device=dev)
        q0 = torch.as_tensor(rng.uniform(0.0, 1.0, size=(bs, L)), dtype=torch.float32, device=dev)
        q0[:, 0] = torch.where(torch.as_tensor(rng.random(bs) < 0.2, device=dev), 1.0, q0[:, 0])
        for on in ons:
            q, sv = q0.clone(), torch.cumprod(q0, 1)
            on.apply(slots, tok, length, q, sv)
            on.update(slots, committed, counts)
        a, b = ons
        for name in ("_e", "_o", "_fb", "_ob", "_bin_e", "_bin_o", "expected", "observed", "global_expected",
                     "global_observed", "bin_expected", "bin_observed"):
            if name in ("_fb", "_ob", "_bin_e", "_bin_o") and not bins:
                continue
            x, y = getattr(a, name), getattr(b, name)
            x, y = (x[:bs], y[:bs]) if name in ("_e", "_o", "_fb", "_ob") else (x, y)
            assert torch.equal(x, y), f"step {step}: {name} differs"
    assert float(ons[0].observed.sum()) > 0 and float(ons[0].expected.sum()) > 0
