"""The model-agreement kernels (``calibration/agreement_kernel.py``) against their torch references
(``ModelAgreement._apply_elems_torch`` / ``_share_elems_torch`` / ``_update_elems_torch``, the code the CPU runs):
equal bit for bit, and ``ModelAgreement`` with the Triton backend follows the torch one step by step.

Inputs are random and adversarial: a two-token vocabulary (long agreeing prefixes, partings at every column),
lengths from 0 to past the chain, confidences outside [0, 1] and exactly 0 and 1, survivals with zeros and
under the 1e-12 clamp, records
empty and large, chains narrower and wider than the model's, batches of one and across several programs
(``BLOCK_B`` 32), int32 and int64 tokens, ``q`` / survival / commit views with a column stride of 2, and the
model's online estimate broadcast over the rows (row stride 0). Runs on ``kernel_device``
(``scripts/gpu_check.sh`` runs it compiled on CUDA). The plain definitions (``agreement_ref`` and the others)
are checked against both backends in ``tests/test_calibration_agreement.py``.
"""

from __future__ import annotations

import pytest
import torch

from sglang_hybrid.calibration.agreement import ModelAgreement
from sglang_hybrid.calibration.agreement_kernel import (BLOCK_B, agreement_apply_triton, agreement_share_triton,
                                                        agreement_update_triton)

SIZES = [(1, 1), (4, 7), (7, 7), (16, 7), (3, 5)]  # (L, gamma)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as a view with a column stride of 2."""
    w = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype, device=t.device)
    w[:, ::2] = t
    return w[:, ::2]


def _case(gen, dev, bs, L, G, tok_dtype=torch.int32):
    tok = torch.randint(0, 2, (bs, L), generator=gen).to(tok_dtype)
    length = torch.randint(0, L + 3, (bs,), generator=gen)
    q = torch.rand(bs, L, generator=gen)
    q[torch.rand(bs, L, generator=gen) < 0.15] = 0.0
    q[torch.rand(bs, L, generator=gen) < 0.15] = 1.0
    q[torch.rand(bs, L, generator=gen) < 0.15] = 1e-9  # survivals under the 1e-12 clamp
    mt = torch.randint(0, 2, (bs, G + 2), generator=gen).to(tok_dtype)
    mc = torch.rand(bs, G + 2, generator=gen) * 1.4 - 0.2
    mc[torch.rand(bs, G + 2, generator=gen) < 0.1] = 1.0
    return [t.to(dev) for t in (tok, length, q, mt, mc)]


def _variants(gen, dev, L, G):
    for bs in (1, 5, BLOCK_B + 1, 2 * BLOCK_B + 7):
        for k in range(2):
            tok, length, q, mt, mc = _case(gen, dev, bs, L, G, torch.int64 if k else torch.int32)
            if k:  # strided chains and confidences; the model's estimate broadcast over the rows
                tok, q, mt = _strided(tok), _strided(q), _strided(mt)
                mc = mc[:1].expand(bs, -1)
            yield bs, tok, length, q, mt, mc


@pytest.mark.parametrize("L,G", SIZES)
def test_apply_kernel_equals_the_torch_ops_exactly(kernel_device, L, G):
    gen = torch.Generator().manual_seed(L * 7 + G)
    for bs, tok, length, q, mt, mc in _variants(gen, kernel_device, L, G):
        m = ModelAgreement(bs, L, G, kernel_device, backend="torch")
        a, b = q.clone(), q.clone()
        m._apply_elems_torch(tok, length, a, mt, mc, m.cols)
        agreement_apply_triton(tok, length, b, mt, mc, m.cols)
        assert torch.equal(a, b), (bs, L, G)
        assert torch.equal(a[:, m.cols:], q[:, m.cols:])  # past the model chain: untouched


def _share_outs(m: ModelAgreement, bs: int):
    g, dev = m.cols, m.record.device
    return (torch.full((bs, g), -1.0, device=dev), torch.full((bs, g), -1.0, device=dev),
            torch.full((bs, g), -1.0, device=dev), torch.zeros(bs, g, dtype=torch.bool, device=dev),
            torch.full((bs, g), -7, dtype=torch.int32, device=dev))


@pytest.mark.parametrize("L,G", SIZES)
def test_share_kernel_equals_the_torch_ops_exactly(kernel_device, L, G):
    gen = torch.Generator().manual_seed(100 + L * 7 + G)
    for i, (bs, tok, length, q, mt, mc) in enumerate(_variants(gen, kernel_device, L, G)):
        surv = torch.cumprod(q, 1)
        record = torch.tensor([[0.0, 0.0], [3.0, 40.0], [900.0, 2.5], [1e-3, 1e-3]][i % 4], device=kernel_device)
        m = ModelAgreement(bs, L, G, kernel_device, backend="torch")
        got = []
        for fn in (m._share_elems_torch, agreement_share_triton):
            outs = _share_outs(m, bs)
            fn(tok, length, surv, mt, mc, record, m._s, *outs)
            got.append(outs)
        for name, a, b in zip(("up", "c", "p", "shared", "tok"), *got):
            assert torch.equal(a, b), (name, bs, L, G, i)
        assert got[0][3].any() or i % 2 or bs < 5  # some rows share tokens


@pytest.mark.parametrize("L,G", SIZES)
def test_update_kernel_equals_the_torch_ops_exactly(kernel_device, L, G):
    gen = torch.Generator().manual_seed(200 + L * 7 + G)
    dev = kernel_device
    for i, (bs, tok, length, q, mt, mc) in enumerate(_variants(gen, dev, L, G)):
        m = ModelAgreement(bs, L, G, dev, backend="torch")
        up, c, p, shared, tk = _share_outs(m, bs)
        m._share_elems_torch(tok, length, torch.cumprod(q, 1), mt, mc, m.record, m._s, up, c, p, shared, tk)
        for width in (1, m.cols, m.cols + 3):
            committed = torch.randint(0, 2, (bs, 2 * width), generator=gen).to(dev)
            committed = committed[:, ::2] if i % 2 else committed[:, :width].to(torch.int32)  # strided int64 too
            counts = torch.randint(0, width + 2, (bs,), generator=gen).to(dev)
            got = []
            for fn in (m._update_elems_torch, agreement_update_triton):
                ev = torch.full((2, bs, m.cols), -1.0, device=dev)
                fn(tk, p, shared, committed, counts, ev)
                got.append(ev)
            assert torch.equal(got[0], got[1]), (bs, L, G, width)


def test_model_agreement_with_the_kernels_follows_the_torch_path(kernel_device):
    """Apply (both candidates), share and update over many steps, Triton backend against torch: the chains'
    estimates, both survivals and the traffic's record equal bit for bit, and the record moves."""
    dev = kernel_device
    gen = torch.Generator().manual_seed(9)
    L, G, bs = 8, 5, 6
    ms = [ModelAgreement(bs, L, G, dev, backend=b, decay=0.999) for b in ("torch", "triton")]
    assert [m.backend for m in ms] == ["torch", "triton"]
    for step in range(25):
        tok, length, q, mt, mc = _case(gen, dev, bs, L, G)
        msurv0 = torch.cumprod(mc[:, :G].clamp(0, 1), 1)
        committed = torch.where(torch.rand(bs, G + 1, generator=gen).to(dev) < 0.8, mt[:, :1].expand(-1, G + 1),
                                torch.randint(0, 2, (bs, G + 1), generator=gen).to(dev).to(mt.dtype))
        counts = torch.randint(1, G + 2, (bs,), generator=gen).to(dev)
        got = []
        for m in ms:
            qq, sv, msv = q.clone(), torch.zeros_like(q), msurv0.clone()
            m.apply(tok, length, qq, sv, mt, mc)
            m.share(tok, length, sv, mt, mc, msv)
            m.update(committed, counts)
            got.append((qq, sv, msv, m.record.clone()))
        for name, a, b in zip(("q", "survival", "model survival", "record"), *got):
            assert torch.equal(a, b), (step, name)
    assert float(ms[0].record.sum()) > 0
