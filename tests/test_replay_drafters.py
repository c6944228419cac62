"""``hybrid-spark replay-drafters``: the peers' protocol, checked against the peer harness's own n-gram replay
(``../shared/peers/suffix-decoding/replay_ngram.py``, when present) on slices of the shipped workloads, and
on hand-made workloads whose step counts are known."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from sglang_hybrid.ngram.corpus import CorpusConfig
from sglang_hybrid.sim import replay_drafters as rd
from tests.script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent
WL = ROOT / "sglang_hybrid" / "data" / "workloads"
PEER = Path(os.environ.get("PEER_HARNESS", ROOT.parent / "shared" / "peers" / "suffix-decoding"))


def _write(tmp: Path, name: str, recs) -> Path:
    p = tmp / f"{name}.jsonl"
    p.write_text("".join(json.dumps({"id": str(i), "prompt_ids": a, "output_ids": b}) + "\n"
                         for i, (a, b) in enumerate(recs)))
    return p


@pytest.mark.skipif(not (PEER / "replay_ngram.py").is_file(), reason="peer harness not present")
@pytest.mark.parametrize("name,limit,K", [("chat", 12, 8), ("code_edit", 3, 16)])
def test_ngram_figures_equal_the_peer_harness(tmp_path: Path, monkeypatch, name: str, limit: int, K: int) -> None:
    recs = rd.load_workload(str(WL / f"{name}.jsonl"), limit)
    (tmp_path / "tok").mkdir()
    _write(tmp_path / "tok", "slice", recs)
    monkeypatch.setenv("PEER_WORK", str(tmp_path))
    peer = load_script("peer_replay_ngram", PEER / "replay_ngram.py")
    theirs = peer.replay("slice", K)
    ours = rd.replay(recs, "ngram", K)
    assert ours["per_request_steps"] == theirs["per_request_steps"]
    for key in ("steps", "output_tokens", "tokens_per_step", "proposed_per_step", "accepted_per_step",
                "frac_steps_accepted"):
        assert ours[key] == pytest.approx(float(theirs[key]), rel=0, abs=1e-12), key


def test_protocol_on_a_known_workload() -> None:
    """Prompt 1 2 3 4 5, output 1 2 3 4 5: the n-gram drafter matches "5" only as a 1-gram (n_min 2), then
    "5 1" ... drafts the rest. The corpus drafter learns the first request's output and replays the second
    identical request in fewer steps than the first."""
    req = ([9, 8, 7], [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6])
    res = rd.replay([req], "ngram", 8)
    # step 1 proposes nothing (no 2-gram repeats): +1; ... once "1 2" repeats the rest is drafted in one go.
    assert res["output_tokens"] == 12 and res["steps"] == res["per_request_steps"][0]
    assert res["steps"] < 12
    two = rd.replay([req, req], "corpus", 8, CorpusConfig(entries=1 << 10, tau=0.1))
    first, second = two["per_request_steps"]
    assert second < first
    iso = rd.replay([req, req], "corpus", 8, CorpusConfig(entries=1 << 10, tau=0.1, isolation="tenant"))
    assert iso["per_request_steps"] == [first, first]  # per-request corpora: the second learns nothing new
    assert two["proposed_per_step"] > 0 and 0 < two["frac_steps_accepted"] <= 1


def test_cli_json_and_errors(tmp_path: Path, capsys) -> None:
    p = _write(tmp_path, "w", [([1, 2, 3], [1, 2, 3, 1, 2, 3]), ([4], [1, 2, 3, 1, 2, 3])])
    assert rd.main(["--workload", str(p), "--k", "4", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["drafter"] for r in rows] == list(rd.DRAFTERS)
    for r in rows:
        assert r["K"] == 4 and r["output_tokens"] == 12 and r["tokens_per_step"] >= 1.0
        assert 0.0 <= r["frac_steps_accepted"] <= 1.0
    assert rd.main(["--workload", str(p), "--k", "x"]) == 2
    assert "--k" in capsys.readouterr().err
    assert rd.main(["--workload", str(p), "--drafters", "suffix"]) == 2
    assert "suffix" in capsys.readouterr().err
    assert rd.main(["--workload", str(p), "--corpus-entries", "1000"]) == 2
    assert "entries" in capsys.readouterr().err


def test_combined_local_corpus_drafts_a_one_token_context_from_the_prompt() -> None:
    """"1" is followed by "8" three times in the prompt; in the output it follows "2" and "5", contexts of two
    tokens the prompt never saw, so the per-request n-gram (n >= 2) has nothing, and the shared corpus (which
    holds only this request's output so far) has "1 -> 8" only for the second one. The per-request corpus
    (frequency, order 1, prompt included) drafts "8" both times."""
    req = ([1, 8, 4, 1, 8, 6, 1, 8, 3], [2, 1, 8, 5, 1, 8, 7])
    on = rd.replay([req], "combined", 8, opts=rd.CombinedOptions(local=True))
    off = rd.replay([req], "combined", 8, opts=rd.CombinedOptions(local=False))
    assert off["per_request_steps"] == [6]  # the second "8", drafted by the shared corpus
    assert on["per_request_steps"] == [5]


def test_combined_local_corpus_holds_only_the_running_request() -> None:
    """The per-request corpus starts empty at every request (it once kept every earlier request's text in a
    fixed table, which filled up), and is sized so that the longest request fills at most half of it."""
    recs = [(list(range(100 * i, 100 * i + 30)), list(range(100 * i + 50, 100 * i + 70))) for i in range(5)]
    rep = rd._Replayer("combined", 8, 64, CorpusConfig(entries=1 << 12), rd.CombinedOptions())
    assert rep.local.cfg.entries >= 2 * rep.local.cfg.n_max * 64
    before, orig = [], rep.local.insert_prompt

    def spy(*a, **kw):
        before.append(int((rep.local.cnt > 0).sum()))
        return orig(*a, **kw)

    rep.local.insert_prompt = spy
    rep.run(recs)
    assert before == [0] * 5
    # The table ends holding what a replay of the last request alone holds. (Earlier requests with no output
    # give it the same request index, which the hash reads; (token, count) entries compared as multisets.)
    last = rd._Replayer("combined", 8, 64, CorpusConfig(entries=1 << 12), rd.CombinedOptions())
    last.run([(p, []) for p, _ in recs[:-1]] + recs[-1:])

    def entries(c):
        used = c.cnt > 0
        return sorted(zip(c.tok[used].tolist(), c.cnt[used].tolist()))

    assert entries(rep.local) == entries(last.local) and len(entries(last.local)) > 100


def test_combined_cap_by_match_bounds_the_per_request_ngram() -> None:
    """After "1 2" (a 2-token match into the prompt) the per-request n-gram would copy 8 tokens; capped at
    ``cap_by_match`` x its match length it proposes 2 (1.0) or 4 (2.0), and every n-gram draft of the run stays
    within the cap of its own match length. Local corpus off; the price is near 0 so only the cap cuts."""
    req = ([1, 2, 10, 11, 12, 13, 14, 15, 16, 17], [9, 1, 2, 10, 11, 12, 13, 14, 15, 16, 17])
    first = {}
    for cap in (0.0, 1.0, 2.0):
        rep = rd._Replayer("combined", 8, 64, CorpusConfig(entries=1 << 10),
                           rd.CombinedOptions(local=False, cap_by_match=cap, min_survival=1e-6))
        seen = []
        orig = rep._propose

        def spy(orig=orig, seen=seen, rep=rep):
            d = orig()
            if d[0] and not d[1]:  # a non-empty draft from the per-request n-gram
                seen.append((len(d[0]), int(rep._cands[0].match_len[0])))
            return d

        rep._propose = spy
        rep.run([req])
        assert seen, cap
        first[cap] = seen[0]
        if cap:
            assert all(n <= int(cap * ml) for n, ml in seen), (cap, seen)
    assert first == {0.0: (8, 2), 1.0: (2, 2), 2.0: (4, 2)}, first


def test_combined_options_are_checked(tmp_path: Path, capsys) -> None:
    p = _write(tmp_path, "w", [([1, 2, 3], [1, 2, 3, 1, 2, 3])])
    for argv, needle in ((["--cap-by-match", "-1"], "--cap-by-match"), (["--min-survival", "0"], "--min-survival"),
                         (["--combined-n-max", "1"], "--combined-n-max"), (["--corpus-tau", "2"], "tau"),
                         (["--price-share", "1.5"], "--price-share"), (["--price-memory", "0"], "--price-memory"),
                         (["--price-prior", "-1"], "--price-prior"), (["--price-power", "0"], "--price-power"),
                         (["--request-strength", "-1"], "--request-strength")):
        assert rd.main(["--workload", str(p), *argv]) == 2, argv
        assert needle in capsys.readouterr().err, argv
    with pytest.raises(ValueError, match="cap-sources"):
        rd.replay([([1], [1, 2])], "combined", 4, opts=rd.CombinedOptions(cap_sources="corpus"))


def test_traffic_price_starts_at_the_traffic_rate_and_moves_to_the_request_rate() -> None:
    tp = rd.TrafficPrice(0.1, 0.5, 4, prior=8.0)
    assert tp.price() == 0.1  # nothing proposed yet
    tp.update(8, 8)  # a copy-heavy step: every proposed token accepted
    assert tp.price() == pytest.approx(0.5)
    tp.new_request()  # a new request starts at the traffic's rate (1.0 here), weighted as 8 proposed tokens
    assert tp.price() == pytest.approx(0.5)
    tp.update(0, 8)  # ... and its own evidence pulls it down: (0 + 8 * A/P) / (8 + 8)
    a, p = 8 * 0.75, 8 * 0.75 + 8
    assert tp.price() == pytest.approx(max(0.1, 0.5 * (8 * a / p) / 16))
    for _ in range(40):  # long shots only: the request's own rate, and the traffic's memory forgets the copy step
        tp.update(0, 4)
    assert tp.price() == 0.1
    tp.new_request()
    assert tp.price() == 0.1
    off = rd.TrafficPrice(0.2, 0.0, 4, prior=8.0)
    off.update(10, 10)
    assert off.price() == 0.2


def test_traffic_price_power_prices_high_rates_up_and_low_rates_down() -> None:
    """``share * r ** power``: with power 2 and share 0.51 a copy-heavy request (r = 0.9) pays more than the
    linear rule's 0.35 * r, a chat-like one (r = 0.25) less, so the floor rules it; power 1 is the linear rule."""
    def price(power: float, share: float, acc: int, prop: int) -> float:
        tp = rd.TrafficPrice(0.1, share, 4, prior=0.0, power=power)
        tp.update(acc, prop)
        return tp.price()

    assert price(1.0, 0.35, 9, 10) == pytest.approx(0.35 * 0.9)
    assert price(2.0, 0.51, 9, 10) == pytest.approx(0.51 * 0.81)
    assert price(2.0, 0.51, 9, 10) > price(1.0, 0.35, 9, 10)
    assert price(1.0, 0.35, 2, 4) == pytest.approx(0.175)  # r = 0.5: 0.35 * 0.5 against 0.51 * 0.25
    assert price(2.0, 0.51, 2, 4) == pytest.approx(0.1275)
    assert price(2.0, 0.51, 1, 4) == 0.1  # r = 0.25: 0.032, under the floor
    d = rd.CombinedOptions()
    assert (d.price_power, d.price_share) == (2.0, 0.51)


def test_combined_drafts_only_tokens_above_the_traffic_price() -> None:
    """Copy-heavy traffic (each request repeats its prompt) lifts the price above the floor; every proposed
    token's calibrated survival is at least the price of its step, and the higher price proposes less."""
    recs = [([i, 50 + i, 7, 8, 9, 10, 11, 12, 13], [i, 50 + i, 7, 8, 9, 10, 11, 12, 13, 40 + i, 41, 42])
            for i in range(12)]
    figures = {}
    for share in (0.0, 1.0):
        rep = rd._Replayer("combined", 8, 64, CorpusConfig(entries=1 << 12),
                           rd.CombinedOptions(price_share=share, min_survival=0.05))
        prices, checked = [], []
        orig = rep._propose

        def spy(orig=orig, rep=rep, prices=prices, checked=checked):
            p = rep.price.price()
            d = orig()
            prices.append(p)
            if d[0]:  # the proposed draft is a prefix of a candidate's tokens whose survivals are all >= p
                n = len(d[0])  # (two sources may draft the same tokens at different survivals: one must pay)
                checked.append(any(c.tokens[0, :n].tolist() == d[0] and float(rep.surv[src][0, n - 1]) >= p
                                   for src, c in enumerate(rep._cands)))
            return d

        rep._propose = spy
        t = rep.run(recs)
        assert checked and all(checked), share
        figures[share] = (t.proposed, max(prices))
    assert figures[0.0][1] == 0.05 and figures[1.0][1] > 0.3
    assert figures[1.0][0] < figures[0.0][0]


def test_combined_applies_the_fitted_corpus_table_and_checks_it(tmp_path: Path, capsys, monkeypatch) -> None:
    # Two requests with the same output: the second drafts it from the shared corpus. The table's odds ratio
    # moves the shared corpus's prior (and only its), so a table that cuts every ratio to ~0 removes the
    # corpus's drafts and one that leaves them at 1 keeps the plain replay's figures.
    from sglang_hybrid.calibration.corpus_table import CorpusTable, load_corpus_table

    rng = np.random.default_rng(0)
    out = rng.integers(10, 300, 80).tolist()
    recs = [([1, 2, 3], out), ([4, 5, 6], out)]
    plain = rd.replay(recs, "combined", 8, opts=rd.CombinedOptions(local=False, corpus_calibration="none"))
    from sglang_hybrid.config import HybridConfig

    assert rd.CombinedOptions().corpus_calibration == HybridConfig().corpus_calibration  # priced as the step does
    shipped = load_corpus_table("default")
    one = CorpusTable(np.zeros_like(shipped.log_ratio), shipped.corpus)
    cut = CorpusTable(np.full_like(shipped.log_ratio, -20.0), shipped.corpus)
    tables = {"one": one, "cut": cut}
    loads = []

    def fake_load(spec):
        loads.append(spec)
        return tables.get(spec) if spec in tables else load_corpus_table(spec)

    monkeypatch.setattr("sglang_hybrid.calibration.corpus_table.load_corpus_table", fake_load)
    same = rd.replay(recs, "combined", 8, opts=rd.CombinedOptions(local=False, corpus_calibration="one"))
    gone = rd.replay(recs, "combined", 8, opts=rd.CombinedOptions(local=False, corpus_calibration="cut"))
    assert plain["corpus_share_of_drafts"] > 0.2
    assert (same["tokens_per_step"], same["proposed_per_step"]) == (plain["tokens_per_step"],
                                                                    plain["proposed_per_step"])
    assert gone["corpus_share_of_drafts"] < plain["corpus_share_of_drafts"] / 4
    assert gone["tokens_per_step"] < plain["tokens_per_step"]
    # A table handed in (as main does, having loaded and checked it once) is the one applied; not reloaded.
    loads.clear()
    handed = rd.replay(recs, "combined", 8, opts=rd.CombinedOptions(local=False, corpus_calibration="one"),
                       corpus_table=cut)
    assert loads == [] and handed["proposed_per_step"] == gone["proposed_per_step"]
    p = _write(tmp_path, "w", [([1, 2, 3], [1, 2, 3, 1, 2, 3])])
    assert rd.main(["--workload", str(p), "--drafters", "combined", "--k", "2,4", "--json",
                    "--corpus-calibration", "cut"]) == 0
    assert loads == ["cut"]  # once for the whole run, not once per workload and K
    capsys.readouterr()
    for argv, needle in ((["--corpus-calibration", str(tmp_path / "missing.json")], "missing.json"),
                         (["--corpus-calibration", "default", "--corpus-n-max", "4"], "fitted for a corpus")):
        assert rd.main(["--workload", str(p), "--drafters", "combined", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert "--corpus-calibration" in err and needle in err, (argv, err)


def test_combined_corrects_each_candidate_by_its_requests_own_odds_ratio() -> None:
    """Every candidate's survival is its cell estimate with the odds shifted by ``R = (O + 2) / (E + 2)``, the
    sums over that request's earlier candidates of that source (brute force here), from R = 1 at its start."""
    recs = [([i, 50 + i, 7, 8, 9, 10, 11, 12, 13, 7, 8], [7, 8, 9, 10, 40 + i, 7, 8, 9, 11, 12, 13, 7, 8, 9, 10])
            for i in range(6)]
    rep = rd._Replayer("combined", 8, 64, CorpusConfig(entries=1 << 12), rd.CombinedOptions(request_strength=2.0))
    seen, orig_p, orig_l = [], rep._propose, rep._learn

    def propose():
        d = orig_p()
        seen.append([int(rep.tenant[0]), [(c.tokens[0].tolist(), int(c.length[0]), rep.q[s][0].clone(),
                                            rep.surv[s][0].clone()) for s, c in enumerate(rep._cands)], None])
        return d

    def learn():
        seen[-1][2] = rep.new[0, : int(rep.cnt[0])].tolist()
        orig_l()

    rep._propose, rep._learn = propose, learn
    rep.run(recs)
    sums: dict = {}
    shifted = 0
    for rid, cands, truth in seen:
        for s, (tok, n, q, surv) in enumerate(cands):
            o, e = sums.get((rid, s), (0.0, 0.0))
            r = (o + 2.0) / (e + 2.0)
            want = torch.cumprod(q * r / (1 + q * (r - 1)), 0)
            assert torch.allclose(surv, want, atol=1e-6), (rid, s)
            shifted += n > 0 and abs(r - 1) > 1e-3
            for j in range(min(n, len(truth))):
                if tok[j] == truth[j]:
                    o += 1.0 - float(q[j])
                else:
                    e += float(q[j])
                    break
            sums[(rid, s)] = (o, e)
    assert shifted > 10 and len({rid for rid, _, _ in seen}) == 6
