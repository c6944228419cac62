"""Online calibration of model-free candidates: starts at the prior, converges to the measured acceptance, and
counts trials the way the verify rule reaches them (censored past the known tokens)."""

from __future__ import annotations

import pytest
import torch

from sglang_hybrid.calibration.candidate_online import OnlineCalibration, RequestOddsRatio


def _est(cal, src, length, ml, mc, prior, D=4):
    q, s = torch.zeros((1, D)), torch.zeros((1, D))
    cal.estimate(src, torch.tensor([length]), torch.tensor([ml]), torch.tensor([mc]),
                 torch.full((1, D), prior), q, s)
    return q[0], s[0]


def test_prior_then_evidence() -> None:
    cal = OnlineCalibration(4, "cpu", strength=4.0)
    q, s = _est(cal, 1, 3, 2, 5, 0.5)
    assert q.tolist() == [0.5, 0.5, 0.5, 0.0]
    assert s.tolist() == pytest.approx([0.5, 0.25, 0.125, 0.0])
    # 40 candidates of 3 tokens, all accepted: the estimate moves towards 1 in that cell only.
    for _ in range(40):
        cal.update(1, torch.tensor([[7, 8, 9, 0]]), torch.tensor([3]), torch.tensor([2]), torch.tensor([5]),
                   torch.full((1, 4), 0.5), torch.tensor([[7, 8, 9, 3, 3]]), torch.tensor([5]))
    q, _ = _est(cal, 1, 3, 2, 5, 0.5)
    assert q[:3].tolist() == pytest.approx([0.5 * 44 / 24] * 3)  # prior * (accepts + 4) / (predicted + 4)
    q, _ = _est(cal, 1, 3, 2, 5, 0.25)  # a candidate with a lower prior in the same cell keeps its rank
    assert q[:3].tolist() == pytest.approx([0.25 * 44 / 24] * 3)
    assert _est(cal, 0, 3, 2, 5, 0.5)[0][0] == 0.5  # the other source is untouched
    assert _est(cal, 1, 3, 2, 100, 0.5)[0][0] == 0.5  # and another count bucket


def test_trials_stop_at_the_first_miss_and_at_the_known_tokens() -> None:
    cal = OnlineCalibration(4, "cpu")
    # draft 1 2 3 4; truth 1 2 9 (3 known): positions 1, 2 accepted, 3 rejected, 4 not reached.
    cal.update(0, torch.tensor([[1, 2, 3, 4]]), torch.tensor([4]), torch.tensor([3]), torch.tensor([1]),
               torch.full((1, 4), 0.5), torch.tensor([[1, 2, 9, 0]]), torch.tensor([3]))
    assert cal.trials.sum().item() == 3 and cal.accepts.sum().item() == 2 and cal.predicted.sum().item() == 1.5
    # draft 1 2 3 4; truth 1 2 (2 known, all matched): positions 3, 4 are censored.
    cal.update(0, torch.tensor([[1, 2, 3, 4]]), torch.tensor([4]), torch.tensor([3]), torch.tensor([1]),
               torch.full((1, 4), 0.5), torch.tensor([[1, 2, 0, 0]]), torch.tensor([2]))
    assert cal.trials.sum().item() == 5 and cal.accepts.sum().item() == 4


def test_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match="max_draft"):
        OnlineCalibration(0, "cpu")
    with pytest.raises(ValueError, match="strength"):
        OnlineCalibration(4, "cpu", strength=0)


def test_request_odds_ratio_starts_as_the_identity_and_shifts_each_rows_odds() -> None:
    lay = RequestOddsRatio(2, 3, 4, "cpu", strength=2.0)
    g = torch.Generator().manual_seed(0)
    q = torch.rand((3, 4), generator=g)
    out_q, out_s = torch.zeros(3, 4), torch.zeros(3, 4)
    lay.apply(1, q, out_q, out_s)
    assert torch.equal(out_q, q) and torch.equal(out_s, torch.cumprod(q, 1))  # no evidence: bit for bit
    # Row 0: every tried token accepted (O grows); row 2: the first token always fails (E grows); row 1 unscored.
    draft = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    truth = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 0, 0, 0], [9, 9, 9, 9, 9]])
    qq = torch.full((3, 4), 0.5)
    for _ in range(10):
        lay.update(1, draft, torch.tensor([4, 4, 4]), qq, truth, torch.tensor([5, 0, 5]))
    assert lay.O[1].tolist() == pytest.approx([20.0, 0.0, 0.0]) and lay.E[1].tolist() == pytest.approx([0.0, 0.0, 5.0])
    assert lay.O[0].abs().sum() == 0 and lay.E[0].abs().sum() == 0  # the other source is untouched
    lay.apply(1, qq, out_q, out_s)
    r = torch.tensor([22.0 / 2.0, 1.0, 2.0 / 7.0])
    want = 0.5 * r / (1 + 0.5 * (r - 1))
    assert out_q[:, 0].tolist() == pytest.approx(want.tolist())
    assert out_s[:, 3].tolist() == pytest.approx((want ** 4).tolist())
    lay.reset(torch.tensor([0]))
    assert lay.O[:, 0].abs().sum() == 0 and lay.E[1, 2].item() == pytest.approx(5.0)


def test_request_odds_ratio_sums_equal_a_brute_force_loop() -> None:
    g = torch.Generator().manual_seed(1)
    lay = RequestOddsRatio(1, 6, 8, "cpu")
    O, E = [0.0] * 6, [0.0] * 6
    for _ in range(30):
        tok = torch.randint(0, 3, (6, 8), generator=g)
        truth = torch.randint(0, 3, (6, 9), generator=g)
        length = torch.randint(0, 9, (6,), generator=g)
        tlen = torch.randint(0, 10, (6,), generator=g)
        q = torch.rand((6, 8), generator=g)
        lay.update(0, tok, length, q, truth, tlen)
        for b in range(6):
            for j in range(min(int(length[b]), int(tlen[b]))):
                y = int(tok[b, j]) == int(truth[b, j])
                if y:
                    O[b] += 1.0 - float(q[b, j])
                else:
                    E[b] += float(q[b, j])
                    break
    assert lay.O[0].tolist() == pytest.approx(O, abs=1e-4) and lay.E[0].tolist() == pytest.approx(E, abs=1e-4)
    with pytest.raises(ValueError, match="strength"):
        RequestOddsRatio(1, 1, 4, "cpu", strength=0)
