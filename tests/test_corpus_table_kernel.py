"""The corpus table's price kernel (``calibration/corpus_table_kernel.py``) against its torch reference
(``DeviceCorpusTable._price_torch``, the code the CPU runs) bit for bit, and both against the host definition
(``CorpusTable.ratio``, the odds rule in float64).

Inputs are random and adversarial: match lengths below 0 and past the table, counts at every bucket's edge (0, 1,
2, 127, 128, 2^31 - 1), fixed-point estimates of 0 and of exactly 1 (``Q_ONE``), drafts wider and narrower than
the table's columns, int64 lengths and counts, strided drafts and outputs, batches of one and across several
programs (``BLOCK_B`` 32), and the shipped table. Runs on ``kernel_device`` (``scripts/gpu_check.sh`` runs it
compiled on CUDA).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration.corpus_table import COUNT_BUCKETS, CorpusTable
from sglang_hybrid.calibration.corpus_table_kernel import BLOCK_B, corpus_price_triton
from sglang_hybrid.calibration.candidates import Q_ONE
from sglang_hybrid.ngram.corpus import CorpusConfig


def _table(rng, D, n_max=8):
    lr = rng.normal(0, 1.0, (n_max + 1, COUNT_BUCKETS, D))
    cfg = CorpusConfig(n_max=n_max)
    return CorpusTable(lr, {k: getattr(cfg, k) for k in ("n_max", "alpha", "tau", "ways")})


def _case(rng, bs, width, strided):
    ml = rng.integers(-1, 12, bs)
    cnt = rng.integers(1, 1000, bs)
    edges = [0, 1, 2, 127, 128, 2**31 - 1]
    cnt[: min(bs, len(edges))] = edges[: min(bs, len(edges))]
    qi = rng.integers(0, Q_ONE + 1, (bs, width))
    qi[rng.random((bs, width)) < 0.2] = 0
    qi[rng.random((bs, width)) < 0.2] = Q_ONE
    dt = torch.int64 if strided else torch.int32
    dq = torch.tensor(qi, dtype=torch.int32)
    if strided:  # every other column of a wider buffer
        w = torch.zeros(bs, 2 * width, dtype=torch.int32)
        w[:, ::2] = dq
        dq = w[:, ::2]
    return dq, torch.tensor(ml, dtype=dt), torch.tensor(cnt, dtype=dt)


@pytest.mark.parametrize("D,width", [(5, 3), (5, 5), (4, 9), (16, 16)])
@pytest.mark.parametrize("bs", [1, 6, BLOCK_B + 1, 2 * BLOCK_B + 7])
def test_kernel_equals_the_torch_ops_and_the_definition(kernel_device, D, width, bs):
    rng = np.random.default_rng(D * 100 + width * 10 + bs)
    t = _table(rng, D)
    dev = t.to_device(2 * BLOCK_B + 7, width, kernel_device, backend="torch")
    scale = torch.tensor(1.0 / Q_ONE, dtype=torch.float32, device=kernel_device)
    for strided in (False, True):
        dq, ml, cnt = (x.to(kernel_device) for x in _case(rng, bs, width, strided))
        got = []
        for fn in (dev._price_torch, lambda *a: corpus_price_triton(dev, *a)):
            q = torch.full((bs, 2 * width), -1.0, device=kernel_device)[:, ::2] if strided else \
                torch.full((bs, width), -1.0, device=kernel_device)
            fn(dq, scale, ml, cnt, q)
            got.append(q)
        assert torch.equal(got[0], got[1]), (D, width, bs, strided)
        q0 = dq.cpu().numpy() / Q_ONE
        r = t.ratio(ml.cpu().numpy(), cnt.cpu().numpy(), width)
        want = q0 * r / (1 + q0 * (r - 1))
        np.testing.assert_allclose(got[1].cpu().numpy(), want, rtol=3e-6, atol=1e-7)
        assert (got[1].cpu().numpy()[q0 == 0] == 0).all()  # no estimate stays none (1 may round to 1 + 1 ulp)


def test_the_backend_picks_the_kernel_and_the_step_prices_alike(kernel_device):
    """``DeviceCorpusTable.price`` with each backend, on the shipped table at the step's width."""
    from sglang_hybrid.calibration.corpus_table import DEFAULT_CORPUS_TABLE

    t = CorpusTable.load(DEFAULT_CORPUS_TABLE)
    rng = np.random.default_rng(1)
    width = 16
    dq, ml, cnt = (x.to(kernel_device) for x in _case(rng, 9, width, False))
    scale = torch.tensor(1.0 / Q_ONE, dtype=torch.float32, device=kernel_device)
    tables = [t.to_device(9, width, kernel_device, backend=b) for b in ("torch", "triton")]
    assert [x.backend for x in tables] == ["torch", "triton"]
    qs = [torch.zeros(9, width, device=kernel_device) for _ in tables]
    for x, q in zip(tables, qs):
        x.price(dq, scale, ml, cnt, q)
    assert torch.equal(qs[0], qs[1]) and float(qs[0].sum()) > 0
