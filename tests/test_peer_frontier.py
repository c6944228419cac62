"""``scripts/peer_frontier.py``'s comparison (the peer itself is a benchmark run by hand, not in the tests)."""

from __future__ import annotations

import json

import pytest

from tests.script_loader import load_script


def _mod():
    return load_script("peer_frontier")


def test_compare_finds_best_within_budget_and_dominating_points():
    m = _mod()
    pts = [((0.3, 1.0), 1.30, 1.20), ((0.1, 1.0), 1.34, 1.50), ((0.05, 2.0), 1.36, 1.70), ((0.2, 0.5), 1.33, 1.40)]
    c = m.compare((1.335, 1.55), pts)
    assert c["best_at_budget"] == ((0.1, 1.0), 1.34, 1.50)  # the most tokens among proposals <= 1.55
    assert c["dominating"] == [((0.1, 1.0), 1.34, 1.50)]
    assert c["default"] == ((0.1, 1.0), 1.34, 1.50)
    c = m.compare((1.35, 1.45), pts)  # ahead of every point at or under its proposals
    assert c["best_at_budget"] == ((0.2, 0.5), 1.33, 1.40) and c["dominating"] == []
    c = m.compare((1.40, 1.10), pts)  # fewer proposals than any point
    assert c["best_at_budget"] is None and c["dominating"] == []
    # equal tokens and equal proposals count as ahead of ours (the goal asks for at least / no more)
    assert m.compare((1.34, 1.50), pts)["dominating"] == [((0.1, 1.0), 1.34, 1.50)]


def test_compare_brute_force_on_random_points():
    m = _mod()
    import random

    rng = random.Random(0)
    for _ in range(200):
        pts = [((rng.choice([0.05, 0.1, 0.2]), rng.choice([0.5, 1.0, 2.0])), round(rng.uniform(1, 2), 2),
                round(rng.uniform(1, 2), 2)) for _ in range(rng.randint(1, 6))]
        ours = (round(rng.uniform(1, 2), 2), round(rng.uniform(1, 2), 2))
        c = m.compare(ours, pts)
        within = [x for x in pts if x[2] <= ours[1]]
        if within:
            assert c["best_at_budget"] in within and c["best_at_budget"][1] == max(x[1] for x in within)
        else:
            assert c["best_at_budget"] is None
        assert sorted(c["dominating"]) == sorted(x for x in pts if x[1] >= ours[0] and x[2] <= ours[1])


def test_read_ours_takes_the_combined_lines(tmp_path):
    m = _mod()
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(o) for o in [
        {"drafter": "ngram", "K": 8, "tokens_per_step": 1.1, "proposed_per_step": 1.0},
        {"drafter": "combined", "K": 8, "tokens_per_step": 1.3, "proposed_per_step": 1.4},
        {"drafter": "combined", "K": 16, "tokens_per_step": 1.31, "proposed_per_step": 1.45}]) + "\n")
    assert m.read_ours(str(f)) == {8: (1.3, 1.4), 16: (1.31, 1.45)}
    g = tmp_path / "n.jsonl"
    g.write_text(json.dumps({"drafter": "ngram", "K": 8, "tokens_per_step": 1, "proposed_per_step": 1}) + "\n")
    with pytest.raises(SystemExit, match="no combined-drafter lines"):
        m.read_ours(str(g))


def test_main_refuses_without_a_peer_build(tmp_path, monkeypatch):
    m = _mod()
    monkeypatch.setenv("PEER_WORK", str(tmp_path))
    with pytest.raises(SystemExit, match="no peer build"):
        m.main(["--ours", f"x={tmp_path / 'r.jsonl'}"])


def test_envelope_is_the_best_mix_of_two_settings():
    m = _mod()
    pts = [((0.3, 1.0), 1.0, 1.0), ((0.1, 1.0), 2.0, 3.0), ((0.05, 2.0), 1.5, 2.5)]
    assert m.envelope(pts, 0.5) is None  # every setting proposes more
    assert m.envelope(pts, 1.0) == pytest.approx(1.0)
    assert m.envelope(pts, 2.0) == pytest.approx(1.5)  # halfway between (1, 1) and (3, 2), above (2.5, 1.5)'s reach
    assert m.envelope(pts, 2.5) == pytest.approx(1.75)  # the line (1, 1)-(3, 2) beats the point (2.5, 1.5)
    assert m.envelope(pts, 9.0) == pytest.approx(2.0)  # past every point: the best single one
    # a dense brute force: the envelope at p is the max over all pairs of mixes spending exactly p, or points under p
    import random

    rng = random.Random(1)
    for _ in range(100):
        pts = [((0.1, 1.0), rng.uniform(1, 2), rng.uniform(1, 2)) for _ in range(rng.randint(1, 5))]
        p = rng.uniform(0.9, 2.1)
        cands = [t for _, t, q in pts if q <= p]
        for (_, ta, qa) in pts:
            for (_, tb, qb) in pts:
                for k in range(1001):
                    w = k / 1000
                    q = w * qa + (1 - w) * qb
                    if abs(q - p) < 1e-3 * abs(qa - qb) + 1e-12 and q <= p + 1e-9:
                        cands.append(w * ta + (1 - w) * tb)
        e = m.envelope(pts, p)
        if not cands:
            assert e is None
        else:
            assert e == pytest.approx(max(cands), abs=2e-3)
