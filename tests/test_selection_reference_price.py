"""The reference's 16-way price search equals the 24-step bisection the Triton kernel and the oracle run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.selection.buffers import QSCALE
from sglang_hybrid.selection import reference
from sglang_hybrid.selection.reference import _dual_price, _dual_price_bisect


@pytest.mark.parametrize("radix_log2", reference._RADIX_CHOICES)
def test_price_search_equals_bisection(radix_log2, monkeypatch):
    monkeypatch.setattr(reference, "_RADIX_CHOICES", (radix_log2,))
    rng = np.random.default_rng(radix_log2)
    for trial in range(20):
        bs, w = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        m_a = np.sort(rng.uniform(0, 1, (bs, w)), axis=1)[:, ::-1]
        n_a = np.sort(rng.uniform(0, 1, (bs, w)), axis=1)[:, ::-1]
        if trial % 3 == 0:  # ties and coarse values
            m_a, n_a = np.round(m_a * 4) / 4, np.round(n_a * 4) / 4
        m_q = torch.tensor((m_a.astype(np.float32) * QSCALE).astype(np.int64))
        n_q = torch.tensor((n_a.astype(np.float32) * QSCALE).astype(np.int64))
        m_ok = torch.tensor(rng.uniform(size=(bs, w)) < 0.9)
        n_ok = torch.tensor(rng.uniform(size=(bs, w)) < 0.7)
        for k in range(0, 2 * w * bs + 2, max(1, w * bs // 5)):
            kk = torch.tensor([k], dtype=torch.int64)
            assert torch.equal(_dual_price(m_q, m_ok, n_q, n_ok, kk), _dual_price_bisect(m_q, m_ok, n_q, n_ok, kk)), \
                (trial, k)
