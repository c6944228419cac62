"""The simulator's clairvoyant yardstick (``sim/oracle.py``): what it bounds, and that only it sees the reference."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sglang_hybrid.sim import simulate_cli
from sglang_hybrid.sim.jsonl import read_workload
from sglang_hybrid.sim.oracle import OraclePolicy
from sglang_hybrid.sim.policies import DSparkPolicy, StepInput
from sglang_hybrid.sim.runner import SimOptions, load_sps, prepare_requests, simulate
from sglang_hybrid.sim.simulator import run_policy

DATA = Path(__file__).resolve().parent.parent / "sglang_hybrid" / "data" / "workloads"


@pytest.fixture(scope="module")
def code():
    recs = read_workload(DATA / "code_edit.jsonl")
    return sorted(recs, key=lambda r: len(r.prompt) + len(r.output))[:8]


def test_lengths_oracle_verifies_only_accepted_tokens(code):
    """'lengths' cuts every model chain to what the reference accepts: each verified draft token is accepted, the
    accepted tokens per request-step equal DSpark's, and fewer tokens are verified."""
    opts = SimOptions(batch_size=2, policies=("dspark", "oracle"), oracle="lengths", measure="all")
    r = simulate(code, opts)
    d, o = r["policies"]["dspark"], r["policies"]["oracle"]
    assert o["draft_acceptance"] == 1.0 and d["draft_acceptance"] < 1.0
    assert o["accepted_per_step"] == d["accepted_per_step"] and o["steps"] == d["steps"]
    assert o["verified_per_step"] < d["verified_per_step"]
    assert r["ratios"]["oracle_over_dspark"] > 1.0


def test_choice_oracle_takes_the_chain_the_reference_accepts_further(code):
    """'choice' keeps DSpark's lengths and swaps in the n-gram chain where it is accepted further: on code edits
    (answers that copy the prompt) it is taken, it never verifies more than DSpark, and it accepts more."""
    opts = SimOptions(batch_size=2, policies=("dspark", "oracle"), oracle="choice", measure="all")
    r = simulate(code, opts)
    d, o = r["policies"]["dspark"], r["policies"]["oracle"]
    assert o["ngram_chosen_frac"] > 0.0
    assert o["verified_per_step"] <= d["verified_per_step"] + 1e-9
    assert o["accepted_per_step"] > d["accepted_per_step"]
    both = simulate(code, dataclasses.replace(opts, oracle="both"))["policies"]["oracle"]
    assert both["draft_acceptance"] == 1.0 and both["accepted_per_step"] == o["accepted_per_step"]


def test_only_a_clairvoyant_policy_sees_the_reference(code):
    opts = SimOptions(batch_size=2, measure="all")
    sps = load_sps(None)
    reqs, vocab, _ = prepare_requests(code[:3], opts)
    seen = []

    class Spy(DSparkPolicy):
        def step(self, inp: StepInput, history):
            seen.append(inp.reference)
            return super().step(inp, history)

    run_policy(Spy(7, sps), reqs, 2, sps, gamma=7, vocab_size=vocab)
    assert seen and all(x is None for x in seen)
    oracle = OraclePolicy(7, sps, "choice")
    with pytest.raises(ValueError, match="needs StepInput.reference"):
        oracle.step(StepInput(*([None] * 4)), None)
    with pytest.raises(ValueError, match="oracle mode"):
        OraclePolicy(7, sps, "perfect")
    with pytest.raises(ValueError, match="policies: choose from"):
        simulate(code, SimOptions(batch_size=2, policies=("oracle",)))  # no mode named


def test_cli_runs_dspark_beside_the_oracle(capsys, code, tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text((DATA / "code_edit.jsonl").read_text().splitlines()[0] + "\n")
    rc = simulate_cli.main(["--workload", str(wl), "--batch-size", "1", "--policy", "hybrid", "--oracle", "choice",
                            "--measure", "all", "--json", "--no-progress"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["policies"]) == ["hybrid", "dspark", "oracle"] and "oracle_over_dspark" in out["ratios"]
    with pytest.raises(SystemExit):
        simulate_cli.main(["--workload", str(wl), "--oracle", "magic"])


def test_choice_oracle_also_weighs_the_corpus_chain():
    """With corpus='shared' the bound includes the cross-request corpus's chain, fed as the hybrid feeds it: a
    request repeated after itself is drafted from the corpus, so the bound accepts more than without it."""
    rec = read_workload(DATA / "chat.jsonl")[0]
    recs = [rec, dataclasses.replace(rec, id=rec.id + "-again")]
    opts = SimOptions(batch_size=1, policies=("dspark", "oracle"), oracle="choice", measure="all")
    off = simulate(recs, opts)["policies"]["oracle"]
    on = simulate(recs, dataclasses.replace(opts, corpus="shared"))["policies"]["oracle"]
    assert on["accepted_per_step"] > off["accepted_per_step"]
    assert on["ngram_chosen_frac"] > off["ngram_chosen_frac"]


def test_estimate_oracle_is_the_hybrid_with_its_ngram_candidates_priced_by_their_outcome(code):
    """'estimate' runs the hybrid's own step and prices every model-free candidate by what the reference accepts:
    its predicted accepted tokens per draft then equal the observed, and it beats the hybrid's estimate. (Compared
    without ``model_agreement``: the oracle turns off the shared price, which re-prices the model chain too.)"""
    opts = SimOptions(batch_size=2, policies=("hybrid", "oracle"), oracle="estimate", measure="all", corpus="shared",
                      model_agreement=False)
    r = simulate(code, opts)
    h, o = r["policies"]["hybrid"], r["policies"]["oracle"]
    cal = o["ngram_calibration"]
    assert cal["predicted_accepted_per_draft"] == cal["actual_accepted_per_draft"]
    assert h["ngram_calibration"]["predicted_accepted_per_draft"] != h["ngram_calibration"]["actual_accepted_per_draft"]
    assert o["throughput"] > h["throughput"]
