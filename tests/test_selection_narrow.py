"""``auto_narrow_above``: the crossover where the wide verify window stops paying, from an SPS table."""

from __future__ import annotations

import pytest

from sglang_hybrid.selection.narrow import auto_narrow_above
from sglang_hybrid.selection.sps import SpsTable, roofline_sps_table


def _brute(sps, wide, narrow, aw, an, max_bs):
    for b in range(1, max_bs + 1):
        if aw * b * sps.lookup(b * wide) < an * b * sps.lookup(b * narrow):  # tokens/s, batch not cancelled
            return max(1, b - 1)
    return 0


def test_flat_table_never_narrows_and_step_table_narrows_at_the_knee():
    flat = SpsTable((1,), (100.0,), 4096)
    assert auto_narrow_above(flat, wide_tokens=9, narrow_tokens=4, accept_wide=3.0, accept_narrow=2.9,
                             max_batch_size=256) == 0
    # Memory-bound up to 256 verify tokens, then the step time doubles.
    knee = SpsTable((1, 257), (100.0, 50.0), 4096)
    # Wide (9 tokens) crosses 256 at b = 29 (261 tokens), narrow (4 tokens) only at b = 65.
    assert auto_narrow_above(knee, wide_tokens=9, narrow_tokens=4, accept_wide=3.0, accept_narrow=2.9,
                             max_batch_size=64) == 28
    # A wide window that accepts twice as much still pays past its own knee.
    assert auto_narrow_above(knee, wide_tokens=9, narrow_tokens=4, accept_wide=6.0, accept_narrow=2.9,
                             max_batch_size=64) == 0


@pytest.mark.parametrize("aw,an", [(7.4, 3.4), (2.9, 2.9), (3.2, 2.9), (4.5, 3.0)])
def test_roofline_table_matches_brute_force(aw, an):
    sps = roofline_sps_table()
    got = auto_narrow_above(sps, wide_tokens=9, narrow_tokens=4, accept_wide=aw, accept_narrow=an,
                            max_batch_size=256)
    assert got == _brute(sps, 9, 4, aw, an, 256)
    if got:  # just past the threshold the narrow window is faster; at it the wide one is not slower
        assert aw * sps.lookup((got + 1) * 9) < an * sps.lookup((got + 1) * 4)
        assert aw * sps.lookup(got * 9) >= an * sps.lookup(got * 4) or got == 1


def test_more_acceptance_from_the_wide_window_never_narrows_earlier():
    sps = roofline_sps_table()
    prev = None
    for aw in (3.0, 3.5, 4.5, 6.0, 7.5):
        t = auto_narrow_above(sps, wide_tokens=9, narrow_tokens=4, accept_wide=aw, accept_narrow=2.9,
                              max_batch_size=512)
        t = 10**9 if t == 0 else t
        assert prev is None or t >= prev
        prev = t


@pytest.mark.parametrize("kw,match", [
    (dict(wide_tokens=4, narrow_tokens=4), "narrow_tokens"),
    (dict(accept_wide=0.5), "bonus"),
    (dict(max_batch_size=0), "max_batch_size"),
])
def test_bad_arguments_are_named(kw, match):
    args = dict(wide_tokens=9, narrow_tokens=4, accept_wide=3.0, accept_narrow=2.9, max_batch_size=8)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        auto_narrow_above(roofline_sps_table(), **args)
