"""Device application of a calibration table: torch reference vs brute force, Triton vs reference (exact).

The Triton tests run the kernel on ``kernel_device`` (``$HYBRID_TEST_DEVICE``: the interpreter on CPU by
default, compiled on CUDA from ``scripts/gpu_check.sh``) and the reference on CPU copies of the inputs; the
brute-force and host-side argument-check tests run on CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration import (
    CalibrationTable,
    DeviceCalibration,
    apply_calibration_ref,
    apply_calibration_triton,
    default_edges,
)
from sglang_hybrid.ngram import NgramConfig, NgramDraft, TokenHistory


def _table(agree: bool, seed: int = 0, max_draft: int = 16) -> CalibrationTable:
    feats = default_edges(2, 8, max_draft, agree=agree)
    q = np.random.default_rng(seed).uniform(0.0, 1.0, size=tuple(f.num_buckets for f in feats))
    q.flat[0] = 0.0  # exact zeros and ones are legal probabilities
    q.flat[-1] = 1.0
    return CalibrationTable(feats, q)


def _draft(rng: np.random.Generator, bs: int, L: int, adversarial: bool) -> tuple[NgramDraft, torch.Tensor]:
    tokens = torch.as_tensor(rng.integers(0, 5, size=(bs, L)), dtype=torch.int32)
    length = torch.as_tensor(rng.integers(0, L + 1, size=bs), dtype=torch.int32)
    match_len = torch.as_tensor(rng.integers(2, 9, size=bs), dtype=torch.int32)
    match_count = torch.as_tensor(rng.integers(1, 40, size=bs), dtype=torch.int32)
    in_prompt = torch.as_tensor(rng.integers(0, 2, size=bs), dtype=torch.int32)
    model = torch.as_tensor(rng.integers(0, 5, size=(bs, 3)), dtype=torch.int64)
    if adversarial:
        length[0], length[-1] = 0, L  # no draft / full draft
        match_len[1 % bs] = 0  # out-of-range features (only possible on rows without a draft) are clamped
        match_len[2 % bs] = 1000
        match_count[3 % bs] = 0
        match_count[4 % bs] = 2**31 - 1
        in_prompt[5 % bs] = 7
        tokens[6 % bs, 0] = -1
    return NgramDraft(tokens, length, match_len, match_count, in_prompt), model


def _brute(table: CalibrationTable, d: NgramDraft, model: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    bs, L = d.tokens.shape
    q = np.zeros((bs, L), dtype=np.float32)
    s = np.zeros((bs, L), dtype=np.float32)
    for b in range(bs):
        surv = np.float32(1.0)
        agree = int(d.tokens[b, 0]) == int(model[b, 0])
        for j in range(1, L + 1):
            if j <= int(d.length[b]):
                v = table.lookup(np.array(int(d.match_len[b])), np.array(j), np.array(int(d.match_count[b])),
                                 np.array(int(d.in_prompt[b])), np.array(int(agree)) if table.has_agree else None)
                q[b, j - 1] = np.float32(v)
            surv = np.float32(surv * q[b, j - 1])
            s[b, j - 1] = surv
    return q, s


def _run(fn, dev: DeviceCalibration, d: NgramDraft, model: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn`` on ``dev.device`` (the draft and model tokens are copied there); outputs returned on CPU."""
    bs, L = d.tokens.shape
    on = dev.device
    out_q = torch.full((bs, L), 7.0, device=on)
    out_s = torch.full((bs, L), 7.0, device=on)
    d = NgramDraft(*(t.to(on) for t in d.as_tuple()))
    model = model.to(on) if model is not None else None
    fn(dev.table, dev.lut_n, dev.lut_j, dev.lut_c, dev.lut_p, dev.lut_a, d.tokens, d.length, d.match_len,
       d.match_count, d.in_prompt, model if dev.has_agree else None, out_q, out_s)
    return out_q.cpu(), out_s.cpu()


@pytest.mark.parametrize("agree", [False, True])
def test_reference_matches_brute_force(agree):
    table = _table(agree)
    dev = table.to_device("cpu")
    rng = np.random.default_rng(1)
    for bs, L, adv in [(9, 16, True), (1, 1, False), (20, 7, True)]:
        d, model = _draft(rng, bs, L, adv)
        # clamp the adversarial rows into range for the brute force's table.lookup (same clamping semantics)
        q, s = _run(apply_calibration_ref, dev, d, model)
        bq, bsurv = _brute(table, d, model)
        assert np.array_equal(q.numpy(), bq)
        assert np.array_equal(s.numpy(), bsurv)
        lengths = d.length.numpy()
        assert np.all(q.numpy()[np.arange(L)[None, :] >= lengths[:, None]] == 0)
        assert np.all(np.diff(s.numpy(), axis=1) <= 0)


@pytest.mark.parametrize("agree", [False, True])
def test_triton_matches_reference_exactly(agree, kernel_device):
    table = _table(agree, seed=3)
    dev = table.to_device("cpu")
    kdev = table.to_device(kernel_device)
    rng = np.random.default_rng(2)
    for bs, L, adv in [(70, 16, True), (3, 5, True), (1, 16, False), (64, 1, False)]:
        d, model = _draft(rng, bs, L, adv)
        rq, rs = _run(apply_calibration_ref, dev, d, model)
        tq, ts = _run(apply_calibration_triton, kdev, d, model)
        assert torch.equal(rq, tq)
        assert torch.equal(rs, ts)


def test_triton_with_strided_views_and_int64(kernel_device):
    """The drafter hands out row views of wider buffers; outputs may be row views too."""
    table = _table(True, seed=4)
    dev = table.to_device("cpu")
    kdev = table.to_device(kernel_device)
    on = kdev.device
    rng = np.random.default_rng(5)
    d, model = _draft(rng, 10, 16, True)
    wide = torch.zeros(12, 24, dtype=torch.int64, device=on)
    wide[:10, :16] = d.tokens.to(on)
    model_wide = torch.zeros(10, 8, dtype=torch.int32, device=on)
    model_wide[:, :3] = model.to(on)
    d2 = NgramDraft(wide[:10, :16], *(t.long().to(on) for t in (d.length, d.match_len, d.match_count, d.in_prompt)))
    rq, rs = _run(apply_calibration_ref, dev, d, model)
    oq = torch.zeros(12, 16, device=on)
    osv = torch.zeros(12, 16, device=on)
    apply_calibration_triton(kdev.table, kdev.lut_n, kdev.lut_j, kdev.lut_c, kdev.lut_p, kdev.lut_a, d2.tokens,
                             d2.length, d2.match_len, d2.match_count, d2.in_prompt, model_wide[:, :3], oq[:10],
                             osv[:10])
    assert torch.equal(oq[:10].cpu(), rq) and torch.equal(osv[:10].cpu(), rs)
    assert torch.all(oq[10:].cpu() == 0)


def test_device_apply_on_a_real_lookup(kernel_device):
    """A lookup and both apply backends on ``kernel_device`` (the table's lookup: torch on CPU, Triton on CUDA)."""
    table = _table(False, seed=6)
    cfg = NgramConfig()
    on = kernel_device
    hist = TokenHistory(4, 64, on, backend="triton" if on.type == "cuda" else "torch")
    prompt = torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], [7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9],
                           [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]],
                          dtype=torch.int32, device=on)
    slots = torch.arange(4, dtype=torch.int32, device=on)
    hist.write_prompt(slots, prompt, torch.tensor([12, 12, 12, 12], dtype=torch.int32, device=on))
    draft = hist.lookup(slots, cfg)
    assert draft.length.tolist()[2] == 0 and draft.length.tolist()[0] > 0
    host_draft = NgramDraft(*(t.cpu() for t in draft.as_tuple()))
    bq, bs = _brute(table, host_draft, torch.zeros(4, 1, dtype=torch.int64))
    out_q = torch.zeros(4, 16, device=on)
    out_s = torch.zeros(4, 16, device=on)
    for backend in ("torch", "triton"):
        dev = DeviceCalibration(table, on, backend=backend)
        out_q.fill_(7.0), out_s.fill_(7.0)
        dev.apply(draft, None, out_q, out_s)
        assert np.array_equal(out_q.cpu().numpy(), bq) and np.array_equal(out_s.cpu().numpy(), bs)


def test_apply_checks_arguments_on_host():
    table = _table(True)
    dev = table.to_device("cpu")
    rng = np.random.default_rng(7)
    d, model = _draft(rng, 4, 16, False)
    q = torch.zeros(4, 16)
    s = torch.zeros(4, 16)
    dev.apply(d, model, q, s)
    with pytest.raises(ValueError, match="agree.*model_tokens"):
        dev.apply(d, None, q, s)
    with pytest.raises(TypeError, match="out_q must have dtype"):
        dev.apply(d, model, q.double(), s)
    with pytest.raises(ValueError, match=r"out_survival must have shape \(4, 16\)"):
        dev.apply(d, model, q, s[:3])
    with pytest.raises(ValueError, match=r"draft.length must have shape \(4,\)"):
        dev.apply(NgramDraft(d.tokens, d.length[:2], d.match_len, d.match_count, d.in_prompt), model, q, s)
    with pytest.raises(TypeError, match="draft.match_len must have dtype"):
        dev.apply(NgramDraft(d.tokens, d.length, d.match_len.float(), d.match_count, d.in_prompt), model, q, s)
    with pytest.raises(ValueError, match=r"model_tokens must be a \[bs=4, >=1\]"):
        dev.apply(d, model[:2], q, s)
    small = _table(False, max_draft=8).to_device("cpu")
    with pytest.raises(ValueError, match="exceed the calibration table.*positions up to 8"):
        small.apply(d, None, q, s)
    with pytest.raises(ValueError, match="backend"):
        DeviceCalibration(table, "cpu", backend="cuda-graph")
