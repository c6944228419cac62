"""The history's echo of the model chain (``calibration/echo.py``): the prefix a splice lookup finds in the history,
lifted to odds times ``R``, and the traffic's record behind ``R``.

``lift_ref`` / ``update_ref`` are the per-row definitions (float64); the step's buffers must agree with them on
random and adversarial inputs (zero and one conditionals, reach 0 and past the last column), leave the survivals
unchanged bit for bit without evidence, learn the true odds ratio from synthetic traffic, and allocate nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration.echo import (ModelEcho, PrefixEcho, lift_ref, make_step_echo, probe_points,
                                            update_ref)
from sglang_hybrid.ngram import NgramConfig
from sglang_hybrid.step import sync_guard
from tests.alloc_probe import profile_call

W = 9


def _survival(rng: np.random.Generator, bs: int, w: int = W) -> torch.Tensor:
    c = rng.uniform(0.0, 1.0, size=(bs, w))
    c[rng.random((bs, w)) < 0.1] = 0.0  # adversarial: dead chains and certain tokens
    c[rng.random((bs, w)) < 0.1] = 1.0
    return torch.cumprod(torch.from_numpy(c.astype(np.float32)), 1)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("record", [(0.0, 0.0), (0.5, 40.0), (30.0, 1.0)])
def test_lift_equals_the_reference(seed, record):
    rng = np.random.default_rng(seed)
    bs = 6
    e = PrefixEcho(8, W, "cpu")
    e.record.copy_(torch.tensor(record))
    r = float(e.ratio())
    surv = _survival(rng, bs)
    reach = torch.from_numpy(rng.integers(0, W + 2, size=bs).astype(np.int32))
    reach[0], reach[1] = 0, W + 3  # nothing lifted; every column lifted
    out, cond = torch.zeros(bs, W), torch.zeros(bs, W)
    e.lift(surv, reach, out, cond)
    ref_out, ref_cond = lift_ref(surv, reach, r)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cond.double(), ref_cond, rtol=1e-5, atol=1e-6)
    assert torch.equal(out[0], surv[0])  # reach 0: untouched
    assert float(out.max()) <= 1.0
    if r > 1:  # a lift never lowers a survival, and lowers nothing where the survival was 0
        assert bool((out >= surv).all()) and bool((out[surv == 0] == 0).all())


def test_a_huge_ratio_past_a_zero_survival_gives_no_nan():
    """Adversarial: conditionals of 0 and 1e-20 under a ratio of 1e5 over 16 columns (the running factor
    overflows float32); the lift stays finite, in [0, 1], and 0 where the survival was 0."""
    e = PrefixEcho(2, 16, "cpu")
    e.record.copy_(torch.tensor([0.0, 2e5]))
    c = torch.full((2, 16), 0.5)
    c[0, 3], c[1, 2] = 0.0, 1e-20
    surv = torch.cumprod(c, 1)
    out = torch.zeros(2, 16)
    e.lift(surv, torch.full((2,), 16, dtype=torch.int32), out, torch.zeros(2, 16))
    assert bool(torch.isfinite(out).all()) and float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    assert bool((out[0, 3:] == 0).all())
    torch.testing.assert_close(out.double(), lift_ref(surv, torch.full((2,), 16), float(e.ratio()))[0],
                               rtol=1e-5, atol=1e-6)


def test_without_evidence_the_survivals_are_unchanged_bit_for_bit():
    rng = np.random.default_rng(5)
    e = PrefixEcho(4, W, "cpu")
    surv = _survival(rng, 4)
    out = torch.zeros(4, W)
    e.lift(surv, torch.full((4,), W, dtype=torch.int32), out, torch.zeros(4, W))
    assert float(e.ratio()) == 1.0 and torch.equal(out, surv)
    e.lift(surv, torch.full((4,), W, dtype=torch.int32), surv, torch.zeros(4, W))  # in place
    assert torch.equal(out, surv)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_update_equals_the_reference_over_several_steps(seed):
    rng = np.random.default_rng(seed)
    e = PrefixEcho(8, W, "cpu", decay=0.99)
    ref = torch.zeros(2, dtype=torch.float64)
    for _ in range(5):
        bs = int(rng.integers(1, 8))
        tokens = torch.from_numpy(rng.integers(0, 4, size=(bs, W)).astype(np.int32))  # few ids: long matches
        committed = tokens.clone()
        flip = rng.random((bs, W)) < 0.2
        committed[torch.from_numpy(flip)] += 1
        committed = committed[:, : int(rng.integers(3, W + 1))]  # a verify window narrower than the chain
        counts = torch.from_numpy(rng.integers(0, committed.shape[1] + 1, size=bs).astype(np.int32))
        scored = torch.from_numpy(rng.random((bs, W)) < 0.7)
        p = torch.from_numpy(rng.uniform(0, 1, size=(bs, W)).astype(np.float32))
        e.update(tokens, scored, p, committed, counts)
        ref = update_ref(ref, tokens, scored, p, committed, counts, 0.99)
        torch.testing.assert_close(e.record.double(), ref, rtol=1e-5, atol=1e-5)
    assert float(ref.sum()) > 0


def test_the_record_learns_the_true_odds_ratio():
    """Synthetic traffic: echoed tokens priced at 0.4 that the target accepts 90% of the time. ``R`` tends to the
    Mantel-Haenszel odds ratio odds(0.9) / odds(0.4) = 13.5, and the lifted conditional to 0.9."""
    rng = np.random.default_rng(0)
    e = PrefixEcho(64, 1, "cpu", decay=1.0)
    tokens = torch.zeros(64, 1, dtype=torch.int32)
    p = torch.full((64, 1), 0.4)
    scored = torch.ones(64, 1, dtype=torch.bool)
    for _ in range(200):
        committed = torch.from_numpy((rng.random((64, 1)) >= 0.9).astype(np.int32))  # 0 = accepted
        e.update(tokens, scored, p, committed, torch.ones(64, dtype=torch.int32))
    assert float(e.ratio()) == pytest.approx(13.5, rel=0.05)
    out = torch.zeros(1, 1)
    e.lift(torch.full((1, 1), 0.4), torch.ones(1, dtype=torch.int32), out, torch.zeros(1, 1))
    assert float(out) == pytest.approx(0.9, abs=0.01)


def test_a_token_after_a_miss_or_past_the_commit_is_not_scored():
    """Only tried tokens count: token 2 of row 0 follows a miss, row 1 committed one token."""
    e = PrefixEcho(2, 4, "cpu", decay=1.0)
    tokens = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]], dtype=torch.int32)
    committed = torch.tensor([[5, 9, 7, 8], [5, 6, 7, 8]], dtype=torch.int32)
    p = torch.full((2, 4), 0.5)
    e.update(tokens, torch.ones(2, 4, dtype=torch.bool), p, committed, torch.tensor([4, 1], dtype=torch.int32))
    # row 0: token 0 accepted (O 0.5), token 1 missed (E 0.5); row 1: token 0 accepted (O 0.5)
    assert e.record.tolist() == [0.5, 1.0]


def test_lift_and_update_allocate_nothing():
    rng = np.random.default_rng(1)
    e = PrefixEcho(4, W, "cpu")
    surv, out, cond = _survival(rng, 3), torch.zeros(3, W), torch.zeros(3, W)
    reach = torch.tensor([0, 3, 6], dtype=torch.int32)
    tokens = torch.randint(0, 5, (3, W), dtype=torch.int32)
    committed = tokens[:, :6].clone()
    counts = torch.tensor([6, 2, 4], dtype=torch.int32)
    scored = torch.ones(3, W, dtype=torch.bool)

    def one_step():
        with sync_guard(True):
            e.lift(surv, reach, out, cond)
            e.update(tokens, scored, cond, committed, counts)

    one_step()  # warm-up: the per-batch-size views are made once
    assert profile_call(one_step) == (0, [])


def test_errors():
    with pytest.raises(ValueError, match="max_bs and width"):
        PrefixEcho(0, 4, "cpu")
    with pytest.raises(ValueError, match="strength"):
        PrefixEcho(2, 4, "cpu", strength=0.0)
    with pytest.raises(ValueError, match="columns"):
        PrefixEcho(2, 4, "cpu").lift(torch.zeros(1, 5), torch.zeros(1, dtype=torch.int32), torch.zeros(1, 5),
                                     torch.zeros(1, 5))


def test_model_echo_reach_finish_and_score():
    """A step: the tail's match gives reach gamma, splice points raise the reach to the largest that matched (never
    lower it); ``finish`` marks the lifted columns before a kept splice point and takes the drafter's own estimate
    for a spliced row; ``score`` scores exactly those against the committed tokens."""
    g, w = 4, 6
    e = ModelEcho(4, g, w, "cpu", decay=1.0)
    e.start(3, torch.tensor([2, 0, 0], dtype=torch.int32))  # row 0's tail matched
    e.note(torch.tensor([True, True, False]), torch.full((3,), 1, dtype=torch.int32))
    e.note(torch.tensor([True, False, False]), torch.full((3,), 3, dtype=torch.int32))
    assert e.reach[:3].tolist() == [g, 1, 0]
    surv = torch.cumprod(torch.full((3, w), 0.5), 1)
    lifted = e.lift_model(surv).clone()
    raw = e.lift_raw(surv[:, :g] * 0.9).clone()
    assert float(e.ratio()) == 1.0 and torch.equal(lifted, surv) and torch.equal(raw, surv[:, :g] * 0.9)
    tokens = torch.arange(3 * w, dtype=torch.int32).view(3, w)
    after = torch.zeros(3, w, dtype=torch.bool)
    after[0, 2:] = True  # row 0 spliced at 2
    spliced = torch.tensor([True, False, False])
    e.finish(tokens, surv, after, spliced)
    assert not after[1:].any() and after[0, 2:].all()  # after is given back as it came
    assert e.echoed[:3, :g].tolist() == [[True, True, False, False], [True, False, False, False], [False] * g]
    assert e._p[0].tolist() == pytest.approx([0.45, 0.5, 0.5, 0.5])  # row 0: the drafter's own, before the lift
    assert e._p[1].tolist() == pytest.approx([0.5] * g)
    committed = tokens[:, :5].clone()
    committed[0, 1] = -1  # row 0 misses its second token
    e.score(committed, torch.tensor([5, 5, 5], dtype=torch.int32))
    # row 0: token 0 accepted (O 0.55), token 1 missed (E 0.5); row 1: token 0 accepted (O 0.5)
    assert e.record.tolist() == pytest.approx([0.5, 1.05])
    with pytest.raises(ValueError, match="gamma"):
        ModelEcho(2, 7, 6, "cpu")


def test_make_step_echo_and_its_probe_points():
    """The echo needs a lookup after the model chain: the tail's, a splice's or a probe's. Probe points sit just
    before the chain's end, at least 1, and skip the splices' points (their own lookups extend the reach)."""
    g, w, cfg = 4, 6, NgramConfig()
    kw = dict(max_bs=2, gamma=g, width=w, device="cpu", lookup_cfg=cfg)
    assert make_step_echo(True, tail=False, **kw) is None
    assert make_step_echo(False, tail=True, splice_points=(2, 3), probes=3, **kw) is None
    assert make_step_echo(True, tail=True, **kw).points == ()
    assert make_step_echo(True, tail=False, splice_points=(3,), **kw).points == ()
    assert make_step_echo(True, tail=False, probes=2, **kw).points == (2, 3)
    assert make_step_echo(True, tail=True, splice_points=(3,), probes=9, **kw).points == (1, 2)
    assert make_step_echo(True, tail=False, splice_points=(1, 2, 3), probes=3, **kw).points == ()
    assert probe_points(g, 0) == () and probe_points(g, 1) == (3,) and probe_points(1, 4) == ()
    with pytest.raises(ValueError, match="echo_probes"):
        probe_points(g, -1)
    with pytest.raises(ValueError, match="probe points"):
        ModelEcho(2, g, w, "cpu", points=(g,), lookup_cfg=cfg)
    with pytest.raises(ValueError, match="probe points"):
        ModelEcho(2, g, w, "cpu", points=(1,))
