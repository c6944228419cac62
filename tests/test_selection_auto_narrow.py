"""``AutoNarrow`` (narrow_above = auto): the SPS table's free region before evidence, then the threshold follows
the acceptance measured under each window."""

from __future__ import annotations

import pytest

from sglang_hybrid.selection.narrow import AutoNarrow, auto_narrow_above
from sglang_hybrid.selection.sps import SpsTable


def _knee(knee_tokens: int = 64) -> SpsTable:
    """Memory-bound (flat) up to ``knee_tokens`` batch tokens, then compute-bound (SPS falls as 1/B)."""
    probes = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    return SpsTable(probes, tuple(100.0 * min(1.0, knee_tokens / p) for p in probes), 2048)


def test_before_evidence_the_wide_window_is_kept_where_it_is_free():
    sps = _knee(64)
    a = AutoNarrow(sps, wide_tokens=9, narrow_tokens=4, prior_accept=2.5, max_batch_size=128)
    # Equal acceptance: the wide window pays only while its b * 9 tokens cost no more than the narrow b * 4
    # (the table's lookup takes the last probe at or below B: flat until 128 tokens, so b <= 14).
    assert a.threshold == auto_narrow_above(sps, wide_tokens=9, narrow_tokens=4, accept_wide=2.5,
                                            accept_narrow=2.5, max_batch_size=128) == 14


def test_the_threshold_follows_the_measured_acceptance():
    sps = _knee(64)
    copy = AutoNarrow(sps, wide_tokens=9, narrow_tokens=4, prior_accept=2.5, max_batch_size=128, decay=1.0)
    copy.observe("wide", 10_000, 10_000 * 6.0)  # copy-heavy traffic: the wide window accepts 6 per step
    copy.observe("narrow", 10_000, 10_000 * 2.9)
    assert copy.refresh() > 14  # it now pays past the flat region
    assert copy.estimate("wide") == pytest.approx(6.0, rel=0.05)
    chat = AutoNarrow(sps, wide_tokens=9, narrow_tokens=4, prior_accept=2.5, max_batch_size=128, decay=1.0)
    chat.observe("wide", 10_000, 10_000 * 2.0)  # the wide window costs more than it gains
    chat.observe("narrow", 10_000, 10_000 * 2.9)
    assert chat.refresh() < 14
    # With no more evidence than the prior's weight, the estimate sits between prior and observation.
    a = AutoNarrow(sps, wide_tokens=9, narrow_tokens=4, prior_accept=2.0, max_batch_size=128, prior_weight=100)
    a.observe("wide", 100, 100 * 4.0)
    assert 2.0 < a.estimate("wide") < 4.0 and a.estimate("narrow") == pytest.approx(2.0)


def test_old_evidence_decays():
    sps = _knee(64)
    a = AutoNarrow(sps, wide_tokens=9, narrow_tokens=4, prior_accept=2.5, max_batch_size=128, decay=0.5)
    a.observe("wide", 1000, 1000 * 6.0)
    for _ in range(30):
        a.observe("wide", 1000, 1000 * 2.0)
    assert a.estimate("wide") < 2.1  # the 6.0 is forgotten (the prior keeps a weight of 256 steps at 2.5)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="prior_accept"):
        AutoNarrow(_knee(), wide_tokens=9, narrow_tokens=4, prior_accept=0.5, max_batch_size=8)
    a = AutoNarrow(_knee(), wide_tokens=9, narrow_tokens=4, prior_accept=2.0, max_batch_size=8)
    with pytest.raises(ValueError, match="window"):
        a.observe("medium", 1, 1)
