"""Fitting: recovery of a known acceptance law, isotonic projections, counting and metrics against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import isotonic_regression, minimize

from sglang_hybrid.calibration import CalibrationTable, Samples, default_edges, fit_table
from sglang_hybrid.calibration.fit import check_monotone, count_cells, isotonic_2d, pava, split_by_doc
from sglang_hybrid.calibration.metrics import auc, ece, evaluate, events

FEATS = default_edges(2, 8, 16)


def _true_law(agree: bool = False) -> np.ndarray:
    """A bucket-constant law: increasing in match length and position, decreasing in match count."""
    shape = tuple(f.num_buckets for f in FEATS) + ((2,) if agree else ())
    n, j, c, p = np.meshgrid(*[np.arange(s) for s in shape[:4]], indexing="ij")
    logit = -0.6 + 0.35 * n + 0.18 * j - 0.2 * c - 0.5 * p
    if agree:
        logit = logit[..., None] + np.array([-0.8, 0.7])
    return 1.0 / (1.0 + np.exp(-logit))


def _draw(law: np.ndarray, S: int, seed: int, agree: bool = False) -> Samples:
    """Samples whose acceptances follow ``law`` exactly (sequential Bernoulli draws per position)."""
    rng = np.random.default_rng(seed)
    match_len = rng.integers(2, 9, size=S)
    match_count = np.minimum(rng.geometric(0.25, size=S), 60)
    in_prompt = rng.integers(0, 2, size=S)
    ag = rng.integers(0, 2, size=S) if agree else None
    draft_len = rng.integers(1, 17, size=S)
    observed = np.minimum(draft_len, rng.integers(1, 40, size=S))
    table = CalibrationTable(FEATS + ([default_edges(agree=True)[-1]] if agree else []), law)
    j = np.arange(1, 17)
    q = table.lookup(match_len[:, None], j[None, :], match_count[:, None], in_prompt[:, None],
                     None if ag is None else ag[:, None])
    ok = rng.random((S, 16)) < q
    ok &= j[None, :] <= observed[:, None]
    accepted = np.cumprod(ok, axis=1).sum(axis=1)
    i32 = lambda a: np.asarray(a, dtype=np.int32)  # noqa: E731
    return Samples(doc=i32(rng.integers(0, 500, size=S)), pos=i32(np.arange(S)), match_len=i32(match_len),
                   match_count=i32(match_count), in_prompt=i32(in_prompt), draft_len=i32(draft_len),
                   observed=i32(observed), accepted=i32(accepted),
                   agree=None if ag is None else ag.astype(np.int8))


@pytest.mark.parametrize("agree", [False, True])
def test_fit_recovers_a_known_law(agree):
    law = _true_law(agree)
    train = _draw(law, 120_000, seed=0, agree=agree)
    held = _draw(law, 40_000, seed=1, agree=agree)
    table = fit_table(train)
    assert table.has_agree == agree
    m = evaluate(table, held)
    assert m["survival"]["ece"] < 0.02 and m["q"]["ece"] < 0.02
    well = table.trials > 1000
    assert well.sum() > 30
    sd = np.sqrt(law * (1 - law) / np.maximum(table.trials, 1))
    assert np.all((np.abs(table.q - law) < 4.5 * sd + 0.01)[well])
    assert np.mean(np.abs(table.q - law)[well]) < 0.02
    # the oracle's own held-out metrics are close to the fit's: nothing much is left on the table
    oracle = CalibrationTable(table.features, law)
    mo = evaluate(oracle, held)
    assert m["survival"]["log_loss"] < mo["survival"]["log_loss"] + 0.005
    assert check_monotone(table, {"match_len": 1, "match_count": -1}) == []


def test_counts_match_a_brute_force_loop():
    s = _draw(_true_law(), 400, seed=2)
    trials, accepts = count_cells(FEATS, s)
    bt = np.zeros_like(trials)
    ba = np.zeros_like(accepts)
    for r in range(len(s)):
        for j in range(1, int(s.observed[r]) + 1):
            if s.accepted[r] >= j - 1:
                idx = tuple(f.bucket(np.array(v)) for f, v in zip(
                    FEATS, (s.match_len[r], j, s.match_count[r], s.in_prompt[r])))
                bt[idx] += 1
                ba[idx] += int(s.accepted[r] >= j)
    assert np.array_equal(trials, bt) and np.array_equal(accepts, ba)


def test_shrinkage_pulls_sparse_cells_to_their_parent():
    s = _draw(_true_law(), 30_000, seed=3)
    raw = fit_table(s, prior_strength=0.0, monotone={"match_len": 0, "match_count": 0})
    shrunk = fit_table(s, prior_strength=1e9, monotone={"match_len": 0, "match_count": 0})
    # infinite prior strength: every cell equals the overall acceptance rate
    rate = raw.accepts.sum() / raw.trials.sum()
    assert np.allclose(shrunk.q, rate, atol=1e-6)
    # zero strength: populated cells are their raw frequencies
    pop = raw.trials > 0
    assert np.allclose(raw.q[pop], raw.accepts[pop] / raw.trials[pop])


def test_pava_matches_scipy_and_the_minmax_formula():
    rng = np.random.default_rng(4)
    for _ in range(50):
        n = int(rng.integers(1, 9))
        y = rng.normal(size=n)
        w = rng.uniform(0.1, 5.0, size=n)
        got = pava(y, w)
        assert np.allclose(got, isotonic_regression(y, weights=w).x)
        brute = [max(min(np.average(y[a:b + 1], weights=w[a:b + 1]) for b in range(i, n)) for a in range(i + 1))
                 for i in range(n)]
        assert np.allclose(got, brute)


def test_isotonic_2d_is_the_weighted_projection():
    rng = np.random.default_rng(5)
    for _ in range(5):
        y = rng.uniform(size=(4, 3))
        w = rng.uniform(0.5, 3.0, size=(4, 3))
        got = isotonic_2d(y, w)
        assert np.all(np.diff(got, axis=0) >= 0) and np.all(np.diff(got, axis=1) >= 0)
        cons = []
        for a, b in itertools.product(range(4), range(3)):
            if a + 1 < 4:
                cons.append({"type": "ineq", "fun": lambda x, a=a, b=b: x[(a + 1) * 3 + b] - x[a * 3 + b]})
            if b + 1 < 3:
                cons.append({"type": "ineq", "fun": lambda x, a=a, b=b: x[a * 3 + b + 1] - x[a * 3 + b]})
        obj = lambda x: float(np.sum(w.ravel() * (x - y.ravel()) ** 2))  # noqa: E731
        ref = minimize(obj, np.full(12, y.mean()), constraints=cons, method="SLSQP", options={"ftol": 1e-12})
        assert obj(got.ravel()) <= ref.fun + 1e-6
        assert np.allclose(got.ravel(), ref.x, atol=1e-3)


def test_monotone_directions_and_check():
    s = _draw(_true_law()[:, :, ::-1, :].copy(), 40_000, seed=6)  # a law increasing in match count
    up = fit_table(s, monotone={"match_len": 1, "match_count": 1})
    down = fit_table(s, monotone={"match_len": 1, "match_count": -1})
    assert check_monotone(up, {"match_len": 1, "match_count": 1}) == []
    assert check_monotone(down, {"match_len": 1, "match_count": -1}) == []
    # forcing the wrong direction pools the count axis (nearly) flat and costs held-out log loss
    assert np.abs(np.diff(down.q, axis=2)).mean() < 0.2 * np.abs(np.diff(up.q, axis=2)).mean()
    held = _draw(_true_law()[:, :, ::-1, :].copy(), 20_000, seed=9)
    assert evaluate(up, held)["survival"]["log_loss"] < evaluate(down, held)["survival"]["log_loss"] - 0.002
    assert check_monotone(up, {"match_count": -1})
    with pytest.raises(ValueError, match="monotone"):
        fit_table(s, monotone={"position": 1})


def test_metrics_against_brute_force():
    rng = np.random.default_rng(7)
    pred = np.round(rng.uniform(size=300), 1)  # many ties
    y = (rng.uniform(size=300) < pred).astype(float)
    pos, neg = pred[y == 1], pred[y == 0]
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert auc(pred, y) == pytest.approx(brute)
    # ECE by hand on two bins
    p = np.array([0.1, 0.1, 0.9, 0.9])
    o = np.array([0.0, 1.0, 1.0, 1.0])
    assert ece(p, o, bins=2) == pytest.approx((abs(0.5 - 0.1) * 2 + abs(1.0 - 0.9) * 2) / 4)


def test_events_and_split():
    s = _draw(_true_law(), 200, seed=8)
    table = CalibrationTable(FEATS, _true_law())
    eq, es = events(table, s)
    assert es.pred.size == int(s.observed.sum())
    assert eq.pred.size == int(np.minimum(s.accepted + 1, s.observed).sum())
    assert es.outcome.sum() == eq.outcome.sum() == int(s.accepted.sum())
    tr, he = split_by_doc(s, 500, 0.3, seed=1)
    assert len(tr) + len(he) == len(s)
    assert not set(tr.doc.tolist()) & set(he.doc.tolist())
    tr2, he2 = split_by_doc(s, 500, 0.3, seed=1)
    assert np.array_equal(tr2.pos, tr.pos)
