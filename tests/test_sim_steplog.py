"""The simulator's step log (``sim/steplog.py``): it changes nothing, logs what it says, and its feature test
finds a feature that carries information and none in one that does not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from sglang_hybrid.sim.jsonl import read_workload
from sglang_hybrid.sim.runner import SimOptions, load_sps, make_policy, prepare_requests, run_built
from sglang_hybrid.sim.steplog import StepLogPolicy, calibration_rows, feature_gains, fit_logistic

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "sglang_hybrid" / "data" / "workloads"


def _run(records, cls, corpus="shared"):
    opts = SimOptions(batch_size=2, policies=("hybrid",), corpus=corpus, measure="all")
    sps = load_sps(None)
    reqs, vocab, _ = prepare_requests(records, opts)
    pol = make_policy("hybrid", opts, sps, hybrid_cls=cls)
    res = run_built(pol, reqs, vocab, opts, sps)
    return pol, res


@pytest.fixture(scope="module")
def code():
    recs = read_workload(DATA / "code_edit.jsonl")
    return sorted(recs, key=lambda r: len(r.prompt) + len(r.output))[:6]


@pytest.mark.parametrize("corpus", ["shared", "off"])
def test_logging_changes_nothing_and_logs_every_request_step(code, corpus):
    _, plain = _run(code, None, corpus)
    pol, logged = _run(code, StepLogPolicy, corpus)
    assert logged.summary() == plain.summary()
    log = pol.table()
    n = len(log["request"])
    assert n == logged.request_steps and all(len(v) == n for v in log.values())
    for s in ("own", "corpus"):
        assert np.all(log[f"{s}_accepted"] <= log[f"{s}_len"])
        assert np.all((log[f"{s}_q0"] >= 0) & (log[f"{s}_q0"] <= 1))
        assert np.all(log[f"{s}_q0"][log[f"{s}_len"] == 0] == 0)
    assert (log["own_len"] > 0).any() and (log["own_accepted"] > 0).any()  # code edits copy the prompt
    assert (log["corpus_len"] > 0).any() == (corpus == "shared")
    assert int((log["chosen"] > 0).sum()) == logged.ngram_chosen
    assert (log["chosen"] == 2).any() <= (corpus == "shared")
    assert np.all(log["model_accepted"] <= 7)


def test_prev_own_is_what_verify_saw_of_the_last_own_draft(code):
    """``prev_own``: the request's previous own draft matched against the committed tokens: -1 with no draft, never
    more than the reference accepts of it (the commit censors it), -1 on a request's first step."""
    pol, _ = _run(code, StepLogPolicy)
    log = pol.table()
    checked = 0
    for r in np.unique(log["request"]):
        rows = np.flatnonzero(log["request"] == r)
        assert log["prev_own"][rows[0]] == -1
        for a, b in zip(rows[:-1], rows[1:]):
            if log["own_len"][a] == 0:
                assert log["prev_own"][b] == -1
            else:
                assert 0 <= log["prev_own"][b] <= log["own_accepted"][a]
                checked += 1
    assert checked > 0


def test_fit_logistic_recovers_known_weights():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40000, 2))
    w = np.array([-0.5, 1.5, -2.0])
    y = rng.random(40000) < 1 / (1 + np.exp(-(w[0] + x @ w[1:])))
    got, ll = fit_logistic(x, y)
    assert np.allclose(got, w, atol=0.08)
    _, ll0 = fit_logistic(np.zeros((40000, 0)), y)
    assert ll < ll0


def _synthetic_log(n=20000, seed=1):
    rng = np.random.default_rng(seed)
    q0 = rng.uniform(0.05, 0.95, n)
    planted = rng.random(n) < 0.5
    # the outcome follows q0, and the planted feature doubles / halves the odds
    odds = q0 / (1 - q0) * np.where(planted, 4.0, 0.25)
    ok = rng.random(n) < odds / (1 + odds)
    log = {k: np.zeros(n) for k in ("corpus_len", "corpus_match_len", "corpus_count", "model_conf0", "pair_agree",
                                    "hist_len", "own_in_prompt", "own_match_len", "own_count", "own_agree_model")}
    log.update(own_len=np.full(n, 4.0), own_q0=q0, own_accepted=ok.astype(float), prev_own=np.full(n, -1.0))
    return log, planted.astype(float), rng.random(n)


def test_feature_gains_find_a_planted_feature_and_nothing_in_noise():
    log, planted, noise = _synthetic_log()
    rows = feature_gains(log, "own", features={"planted": planted, "noise": noise})
    names = [r[0] for r in rows]
    assert names == ["estimate", "planted", "noise", "all"]
    gains = {r[0]: r[2] for r in rows}
    assert gains["planted"] > 0.05 and abs(gains["noise"]) < 2e-4
    assert rows[1][3] > 2.0  # the planted feature's weight: log(16) = 2.77 between its two values
    # The estimate alone is calibrated here, so its own weight is close to 1 on logit(q0).
    log2, _, noise2 = _synthetic_log(seed=2)
    log2["own_accepted"] = (np.random.default_rng(3).random(len(noise2)) < log2["own_q0"]).astype(float)
    assert abs(feature_gains(log2, "own", features={})[0][3] - 1.0) < 0.1


def test_calibration_rows_bucket_the_estimate():
    log, _, _ = _synthetic_log()
    log["own_accepted"] = (np.random.default_rng(4).random(len(log["own_q0"])) < log["own_q0"]).astype(float)
    log["own_len"][:100] = 0  # no draft: left out
    rows = calibration_rows(log, "own", edges=(0, 0.5, 1.0001))
    assert [r[:2] for r in rows] == [(0.0, 0.5), (0.5, 1.0001)]
    assert sum(r[2] for r in rows) == len(log["own_q0"]) - 100
    for lo, hi, n, q, obs in rows:
        assert lo <= q < hi and abs(q - obs) < 0.02


def test_script_prints_tables_and_saves_the_log(tmp_path, capsys):
    recs = [json.loads(x) for x in (DATA / "code_edit.jsonl").read_text().splitlines()[:6]]
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps(r) + "\n" for r in recs))
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import step_features
    finally:
        sys.path.pop(0)
    out = tmp_path / "log.npz"
    assert step_features.main(["--workload", str(wl), "--batch-size", "2", "--save", str(out)]) == 0
    text = capsys.readouterr().out
    assert "### own-history drafts" in text and "| estimate |" in text and "| pair_agree |" in text
    saved = np.load(out)
    assert len(saved["request"]) > 0 and "own_q0" in saved.files
    with pytest.raises(SystemExit):
        step_features.main(["--workload", str(tmp_path / "missing.jsonl")])
    with pytest.raises(SystemExit):
        step_features.main(["--workload", str(wl), "--batch-size", "0"])
    assert "batch_size: must be >= 1" in capsys.readouterr().err
