"""The selection against brute force: the exact rule (Python loops) and the true optimum over all choices.

Runs the torch reference only (the Triton kernel equals it bit for bit: test_selection_kernel.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.selection import SelectionBuffers, select_chains_ref
from tests.oracles.selection_oracle import (
    best_for_choice,
    chains,
    literal_rule_oracle,
    optimum,
    random_instance,
    random_sps_curve,
    rule_oracle,
    theta_of,
)

N_INSTANCES = 1000  # per mode


def _problem(rng, mode):
    inst = random_instance(rng)
    bs, G = inst[1].shape
    W = max(G, inst[3].shape[1])
    if mode == "budget":
        k = int(rng.integers(-1, bs * W + 2))
        return inst, k, torch.tensor([k], dtype=torch.int32), None
    sps = random_sps_curve(rng, bs * (1 + W) + 1)
    return inst, None, None, sps


def _run_ref(inst, budget, sps, **kw):
    bs, G = inst[1].shape
    out = SelectionBuffers(bs, max(G, inst[3].shape[1])).view(bs)
    select_chains_ref(*inst, budget, sps, out, **kw)
    return out


@pytest.mark.parametrize("mode", ["budget", "sps"])
def test_reference_matches_rule_oracle(mode):
    rng = np.random.default_rng(11 if mode == "budget" else 12)
    for i in range(150):
        inst, k, budget, sps = _problem(rng, mode)
        kw = dict(num_iters=i % 3, max_verify_len=int(rng.integers(0, 3)), survival_eps=[1e-6, 0.0, 0.05][i % 3])
        out = _run_ref(inst, budget, sps, **kw)
        want = rule_oracle(inst[1], inst[3], inst[4], k, None if sps is None else sps.double().tolist(), **kw)
        got = (out.choice.tolist(), out.verify_len.tolist(), int(out.budget_used), float(out.price))
        assert got == want, f"instance {i}: {got} != {want}"


def _summary(name, r):
    q = np.quantile(r, [0.0, 0.001, 0.01, 0.05, 0.5])
    return (f"{name}: n={r.size} min={q[0]:.4f} q0.1%={q[1]:.4f} q1%={q[2]:.4f} q5%={q[3]:.4f} "
            f"median={q[4]:.4f} within1%={np.mean(r >= 0.99):.4f} exact={np.mean(r >= 1 - 1e-6):.4f}")


@pytest.mark.parametrize("mode", ["budget", "sps"])
def test_near_optimal_against_brute_force(mode):
    """Theta / optimum over all 2**bs chain choices (bs <= 6): >= 0.99 on 99% of instances, never < 0.95."""
    rng = np.random.default_rng(21 if mode == "budget" else 22)
    ratios, literal, dspark = [], [], []
    for i in range(N_INSTANCES):
        inst, k, budget, sps = _problem(rng, mode)
        spsl = None if sps is None else sps.double().tolist()
        out = _run_ref(inst, budget, sps)
        opt, _ = optimum(inst[1], inst[3], inst[4], k, spsl)
        ours = theta_of(out.survival, out.verify_len, int(out.budget_used), spsl)
        ratios.append(ours / opt)
        ch = chains(inst[1], inst[3], inst[4])
        bs = len(ch)
        # The allocation is exact for the chosen chains (top-K / Theta scan), up to the 2**-24 fixed point.
        mine = best_for_choice([ch[r][int(out.choice[r])] for r in range(bs)], bs, k, spsl)
        assert ours >= mine * (1 - 1e-6), f"instance {i}: allocation not optimal for its choice"
        # Never worse than DSpark alone (every request on the model chain): it is one of the candidates.
        base = best_for_choice([c[0] for c in ch], bs, k, spsl)
        assert ours >= base * (1 - 1e-6), f"instance {i}: worse than the all-model allocation"
        dspark.append(base / opt)
        c, lens, kk = literal_rule_oracle(inst[1], inst[3], inst[4], k, spsl)
        lit = bs + sum(ch[r][c[r]][0][j] for r in range(bs) for j in range(lens[r]))
        literal.append(lit * (1.0 if spsl is None else spsl[bs + kk]) / opt)
    r = np.asarray(ratios)
    print()
    print(_summary(f"[{mode}] ours / optimum", r))
    print(_summary(f"[{mode}] model chain only (DSpark) / optimum", np.asarray(dspark)))
    print(_summary(f"[{mode}] first-draft rule (lambda = K-th value, last iterate) / optimum", np.asarray(literal)))
    assert np.mean(r >= 0.99) >= 0.99, _summary(mode, r)
    assert r.min() >= 0.95, _summary(mode, r)
