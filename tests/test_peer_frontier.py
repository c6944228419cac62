"""``scripts/peer_frontier.py``'s comparison (the peer itself is a benchmark run by hand, not in the tests)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mod():
    spec = importlib.util.spec_from_file_location("peer_frontier", ROOT / "scripts" / "peer_frontier.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
