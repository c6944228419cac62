"""With no n-gram match anywhere the selection is SGLang 0.5.23's DSpark allocation, token for token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang.kernels.ops.speculative.dspark.dspark_schedule import schedule_verify_lens_topk_from_survival
from sglang.srt.speculative.dspark_components.dspark_planner import (
    DSparkScheduleConfig,
    compute_verify_token_budget,
)
from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable

from sglang_hybrid.selection import SelectionBuffers, dense_sps, select_chains, select_chains_ref
from sglang_hybrid.selection.triton_kernel import select_chains_triton


def _model_only(rng, bs, G, L, ties):
    conf = rng.uniform(0.3, 1.0, size=(bs, G))
    if ties:
        conf = np.round(conf * 4) / 4
    surv = torch.cumprod(torch.tensor(conf, dtype=torch.float32), 1)  # SGLang's compute_sort_survival
    mt = torch.tensor(rng.integers(1, 1000, (bs, G)), dtype=torch.int32)
    nt = torch.tensor(rng.integers(1, 1000, (bs, L)), dtype=torch.int32)
    ns = torch.rand(bs, L)  # ignored: no match anywhere
    return mt, surv, nt, ns, torch.zeros(bs, dtype=torch.int32)


@pytest.mark.parametrize("bs,G,L", [(1, 1, 4), (1, 7, 8), (3, 4, 2), (8, 7, 16), (33, 5, 5), (64, 7, 8)])
def test_budget_mode_equals_schedule_verify_lens_topk(bs, G, L):
    rng = np.random.default_rng(bs * 100 + G)
    cfg = DSparkScheduleConfig(gamma=G)
    for ties in (False, True):
        mt, surv, nt, ns, nl = _model_only(rng, bs, G, L, ties)
        for k in sorted({0, 1, bs - 1, bs, 2 * bs + 1, bs * G // 2, bs * G, bs * G + 5}):
            if k < 0:
                continue
            out = SelectionBuffers(bs, max(G, L)).view(bs)
            select_chains_ref(mt, surv, nt, ns, nl, torch.tensor([k], dtype=torch.int32), None, out)
            theirs = schedule_verify_lens_topk_from_survival(survival_probs=surv, budget=k, cfg=cfg)
            assert torch.equal(out.verify_len + 1, theirs), (k, out.verify_len.tolist(), theirs.tolist())
            assert out.choice.tolist() == [0] * bs
            assert torch.equal(out.tokens[:, :G], mt)


def test_budget_mode_triton_equals_sglang():
    rng = np.random.default_rng(7)
    bs, G, L = 6, 7, 8
    cfg = DSparkScheduleConfig(gamma=G)
    mt, surv, nt, ns, nl = _model_only(rng, bs, G, L, ties=True)
    for k in (0, 5, 17, 100):
        out = SelectionBuffers(bs, L).view(bs)
        select_chains_triton(mt, surv, nt, ns, nl, torch.tensor([k], dtype=torch.int32), None, out)
        theirs = schedule_verify_lens_topk_from_survival(survival_probs=surv, budget=k, cfg=cfg)
        assert torch.equal(out.verify_len + 1, theirs)


def _random_table(rng, max_tokens):
    probes = np.unique(np.concatenate([[1], rng.integers(2, max_tokens, size=12)]))
    t = 1.0 + np.cumsum(rng.uniform(0.0, 0.3, size=probes.size))
    sps = np.round(256.0 / t) / 256.0  # exactly representable in float32: no float32-vs-float64 gap
    return SpsCostTable(sample_batch_tokens=[int(p) for p in probes], sample_steps_per_sec=[float(x) for x in sps],
                        max_batch_tokens=int(max_tokens))


@pytest.mark.parametrize("bs,G", [(1, 7), (4, 7), (16, 5), (48, 7)])
def test_sps_mode_budget_equals_compute_verify_token_budget(bs, G):
    """Same K as SGLang's planner (which sums in float64; we sum in 2**-24 fixed point)."""
    rng = np.random.default_rng(bs + 1000 * G)
    cfg = DSparkScheduleConfig(gamma=G)
    L = G + 1
    for trial in range(6):
        mt, surv, nt, ns, nl = _model_only(rng, bs, G, L, ties=trial % 2 == 1)
        table = _random_table(rng, bs * (1 + L) + 1)
        sps = dense_sps(table, bs * (1 + L))
        out = SelectionBuffers(bs, L).view(bs)
        select_chains(mt, surv, nt, ns, nl, None, sps, out)
        theirs = compute_verify_token_budget(history_survival_probs=surv, sps_table=table, cfg=cfg)
        assert int(out.budget_used[0]) == theirs.budget
        lens = schedule_verify_lens_topk_from_survival(survival_probs=surv, budget=theirs.budget, cfg=cfg)
        assert torch.equal(out.verify_len + 1, lens)
