"""Online calibration of model-free candidates: starts at the prior, converges to the measured acceptance, and
counts trials the way the verify rule reaches them (censored past the known tokens)."""

from __future__ import annotations

import pytest
import torch

from sglang_hybrid.calibration.candidate_online import OnlineCalibration


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
