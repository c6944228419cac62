"""Two-branch selection: never worse than the one-chain selection, and near the exhaustive optimum."""

from __future__ import annotations

import numpy as np
import torch

from tests.oracles.two_branch_oracle import optimum
from sglang_hybrid.selection import SelectionBuffers, select_chains
from sglang_hybrid.selection.two_branch import select_two_branch


def _instance(rng, bs, G, L):
    ms = torch.tensor(np.cumprod(rng.uniform(0.3, 1.0, (bs, G)), 1), dtype=torch.float32)
    ns = torch.tensor(np.cumprod(rng.uniform(0.2, 1.0, (bs, L)), 1), dtype=torch.float32)
    nl = torch.tensor(rng.integers(0, L + 1, bs), dtype=torch.int32)
    mt = torch.tensor(rng.integers(0, 3, (bs, G)), dtype=torch.int32)
    nt = torch.tensor(rng.integers(0, 3, (bs, L)), dtype=torch.int32)
    return mt, ms, nt, ns, nl


def _sps(rng, n):
    t = 1.0 + np.cumsum(np.where(rng.uniform(size=n + 1) < 0.3, rng.uniform(0, 0.4, n + 1), 0.0))
    t[:4] = 1.0  # flat while memory-bound
    return torch.tensor(100.0 / t, dtype=torch.float32)


def test_two_branch_against_exhaustive_oracle():
    rng = np.random.default_rng(0)
    ratios, used = [], 0
    for trial in range(60):
        bs, G, L = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
        mt, ms, nt, ns, nl = _instance(rng, bs, G, L)
        sps = _sps(rng, bs * (1 + G + L) + 1)
        out = SelectionBuffers(bs, max(G, L)).view(bs)
        select_chains(mt, ms, nt, ns, nl, None, sps, out)
        tb = select_two_branch(mt, ms, nt, ns, nl, out.choice, out.verify_len, sps)
        eligible = [(int(nl[r]) > 0) and int(mt[r, 0]) != int(nt[r, 0]) for r in range(bs)]
        opt = optimum(ms.tolist(), ns.tolist(), nl.tolist(), eligible, sps.tolist(), max(G, L))
        got = float(tb.objective)
        # The reported objective is the allocation's real value.
        lm, ln = tb.model_len.tolist(), tb.ngram_len.tolist()
        assert all(not (a > 0 and b > 0) or eligible[r] for r, (a, b) in enumerate(zip(lm, ln)))
        assert got <= opt * (1 + 1e-9)
        ratios.append(got / opt)
        used += int(tb.used)
    ratios = np.array(ratios)
    assert used > 5  # two branches do get chosen
    assert (ratios >= 0.99).mean() >= 0.9 and ratios.min() >= 0.9, sorted(ratios)[:5]


def test_never_worse_than_one_chain_and_same_first_tokens_stay_single():
    rng = np.random.default_rng(1)
    for trial in range(30):
        bs, G, L = 8, 7, 8
        mt, ms, nt, ns, nl = _instance(rng, bs, G, L)
        nt[:4, 0] = mt[:4, 0]  # the first four agree on their first token
        sps = _sps(rng, bs * (1 + G + L) + 1)
        out = SelectionBuffers(bs, L).view(bs)
        select_chains(mt, ms, nt, ns, nl, None, sps, out)
        tb = select_two_branch(mt, ms, nt, ns, nl, out.choice, out.verify_len, sps)
        assert not ((tb.model_len[:4] > 0) & (tb.ngram_len[:4] > 0)).any()
        vl = out.verify_len.to(torch.int64)
        if not bool(tb.used):  # the one-chain allocation is kept as it is
            assert torch.equal(tb.model_len + tb.ngram_len, vl)
