"""The corpus drafts' fitted calibration: samples, fit, file, device apply, option, CLI (calibration/corpus_table.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration.candidates import STEP_CORPUS_TAU, CorpusCandidate, corpus_config, make_step_corpus
from sglang_hybrid.calibration.cli import main as calibrate_main
from sglang_hybrid.calibration.corpus_samples import CorpusSamples, _score, corpus_samples
from sglang_hybrid.calibration.corpus_table import (COUNT_BUCKETS, DEFAULT_CORPUS_TABLE, CorpusTable,
                                                    count_bucket, heldout_metrics, load_corpus_table)
from sglang_hybrid.config import HybridConfig, HybridConfigError
from sglang_hybrid.ngram.corpus import CorpusConfig, CorpusDraft


def _odds(q, r):
    return q * r / (1 + q * (r - 1))


def _synthetic(n, D, rng, law):
    """Samples whose token j is accepted with probability ``law(q, m, c, j)`` (all tried until the first miss)."""
    m = rng.integers(0, 9, n).astype(np.int32)
    cnt = np.floor(2.0 ** rng.uniform(0, 8.5, n)).astype(np.int32)  # every count bucket well populated
    q = rng.uniform(0.05, 0.95, (n, D))
    p = law(q, m[:, None], count_bucket(cnt)[:, None], np.arange(D)[None, :])
    y = rng.random((n, D)) < p
    before = np.cumprod(np.concatenate([np.ones((n, 1), bool), y[:, :-1]], 1), 1).astype(bool)
    return CorpusSamples(np.arange(n, dtype=np.int32), m, cnt, q, before, before & y)


def test_count_bucket_is_floor_log2_clamped():
    c = np.array([0, 1, 2, 3, 4, 7, 8, 127, 128, 129, 10**6])
    assert count_bucket(c).tolist() == [0, 0, 1, 1, 2, 2, 3, 6, 7, 7, 7]


def test_fit_recovers_a_planted_odds_ratio():
    rng = np.random.default_rng(0)
    truth = lambda m, c, j: np.exp(0.25 * (m - 4) - 0.15 * c + 0.1 * j)  # noqa: E731
    s = _synthetic(80000, 3, rng, lambda q, m, c, j: _odds(q, truth(m, c, j)))
    t = CorpusTable.fit(s, CorpusConfig(), prior_strength=1.0)
    tried = s.tried.sum(0)
    assert tried[0] == 80000 and tried[2] > 5000
    # Well-populated cells (position 0: every draft is tried there) recover the law.
    for m in (1, 4, 8):
        for c in (0, 3, 7):
            assert t.log_ratio[m, c, 0] == pytest.approx(np.log(truth(m, c, 0)), abs=0.15)


def test_fit_of_a_calibrated_source_is_the_identity():
    rng = np.random.default_rng(1)
    s = _synthetic(200000, 2, rng, lambda q, m, c, j: q)
    t = CorpusTable.fit(s, CorpusConfig())
    assert np.abs(t.log_ratio[:, :, 0]).max() < 0.15 and np.abs(t.log_ratio).mean() < 0.06
    m = heldout_metrics(t, s)
    assert m["fitted"]["log_loss"] == pytest.approx(m["raw"]["log_loss"], abs=2e-3)


def test_fit_counts_match_a_brute_force_loop():
    rng = np.random.default_rng(2)
    s = _synthetic(300, 3, rng, lambda q, m, c, j: 0.7 * np.ones_like(q))
    s.match_len[:5] = 40  # clamped to n_max
    cfg = CorpusConfig(n_max=8)
    O = np.zeros((9, COUNT_BUCKETS, 3))
    E = np.zeros_like(O)
    for i in range(len(s)):
        m, c = min(int(s.match_len[i]), 8), int(count_bucket(s.match_count[i : i + 1])[0])
        for j in range(3):
            if s.tried[i, j]:
                y = float(s.accepted[i, j])
                O[m, c, j] += (1 - s.q[i, j]) * y
                E[m, c, j] += s.q[i, j] * (1 - y)
    st = 3.0
    rj = (O.sum((0, 1)) + st) / (E.sum((0, 1)) + st)
    rmj = (O.sum(1) + st * rj) / (E.sum(1) + st)
    want = np.log((O + st * rmj[:, None, :]) / (E + st))
    t = CorpusTable.fit(s, cfg, prior_strength=st)
    np.testing.assert_allclose(t.log_ratio, want, rtol=1e-12, atol=1e-12)


def _random_table(rng, D=5, n_max=8):
    lr = rng.normal(0, 1.0, (n_max + 1, COUNT_BUCKETS, D))
    cfg = CorpusConfig(n_max=n_max)
    return CorpusTable(lr, {k: getattr(cfg, k) for k in ("n_max", "alpha", "tau", "ways")})


@pytest.mark.parametrize("width", [3, 5, 9])
def test_device_apply_matches_the_host_definition(width):
    rng = np.random.default_rng(width)
    t = _random_table(rng)
    bs = 37
    ml = rng.integers(-1, 12, bs).astype(np.int32)  # adversarial: below 0 and past n_max
    cnt = np.concatenate([[0, 1, 2, 127, 128, 2**31 - 1], rng.integers(1, 1000, bs - 6)]).astype(np.int32)
    length = rng.integers(0, width + 1, bs)
    q = rng.uniform(0, 1, (bs, width)) * (np.arange(width)[None, :] < length[:, None])
    q[0, 0], q[1, 0] = 1.0, 0.0
    host = _odds(q, t.ratio(ml, cnt, width))
    dev = t.to_device(64, width, "cpu")
    qt = torch.tensor(q, dtype=torch.float32)
    dev.apply(torch.tensor(ml), torch.tensor(cnt), qt)
    np.testing.assert_allclose(qt.numpy(), host, rtol=2e-6, atol=1e-7)
    assert (qt.numpy()[q == 0] == 0).all() and qt[0, 0] == 1.0  # zeros stay zeros, certainty stays certain
    # a narrower call on the same buffers (fixed shapes per batch: only a prefix of rows and columns)
    q2 = torch.tensor(q[:4, :2], dtype=torch.float32)
    dev.apply(torch.tensor(ml[:4]), torch.tensor(cnt[:4]), q2)
    np.testing.assert_allclose(q2.numpy(), host[:4, :2], rtol=2e-6, atol=1e-7)


def test_candidate_price_applies_the_table_before_the_survival():
    rng = np.random.default_rng(3)
    t = _random_table(rng, D=4)
    bs, w = 6, 4
    qi = torch.tensor(rng.integers(0, 65536, (bs, w)), dtype=torch.int32)
    draft = CorpusDraft(torch.zeros(bs, w, dtype=torch.int32), torch.full((bs,), w, dtype=torch.int32),
                        torch.tensor(rng.integers(1, 9, bs), dtype=torch.int32),
                        torch.tensor(rng.integers(1, 200, bs), dtype=torch.int32),
                        torch.zeros(bs, dtype=torch.int32), qi)
    cand = CorpusCandidate(8, 8, w, "cpu", online=False, table=t)
    q, surv = cand.price(torch.arange(bs), draft)
    want = _odds(qi.numpy() / 65536.0, t.ratio(draft.match_len.numpy(), draft.match_count.numpy(), w))
    np.testing.assert_allclose(q.numpy(), want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(surv.numpy(), np.cumprod(want, 1), rtol=1e-5, atol=1e-7)
    plain = CorpusCandidate(8, 8, w, "cpu", online=False)
    np.testing.assert_allclose(plain.price(torch.arange(bs), draft)[0].numpy(), qi.numpy() / 65536.0, rtol=1e-6)


def test_save_load_round_trip_and_errors_name_the_file(tmp_path):
    t = _random_table(np.random.default_rng(4))
    p = t.save(tmp_path / "t.json")
    back = CorpusTable.load(p)
    np.testing.assert_allclose(back.log_ratio, t.log_ratio, atol=1e-6)
    assert back.source == str(p)
    data = json.loads(p.read_text())
    cases = {
        "missing.json": None,
        "notjson.json": "{",
        "format.json": {**data, "format": "sglang-hybrid-calibration"},
        "version.json": {**data, "version": 99},
        "shape.json": {**data, "log_ratio": [[0.0]]},
        "nan.json": {**data, "log_ratio": np.full((9, 8, 2), np.nan).tolist()},
        "nmax.json": {**data, "corpus": {**data["corpus"], "n_max": 4}},
    }
    for name, body in cases.items():
        f = tmp_path / name
        if body is not None:
            f.write_text(body if isinstance(body, str) else json.dumps(body))
        with pytest.raises(ValueError, match=name):
            CorpusTable.load(f)


def test_a_table_for_another_corpus_is_refused():
    t = _random_table(np.random.default_rng(5))
    t.check_corpus(CorpusConfig())
    with pytest.raises(ValueError, match="fitted for a corpus"):
        t.check_corpus(CorpusConfig(alpha=2))
    with pytest.raises(ValueError, match="fitted for a corpus"):
        make_step_corpus("shared", 1 << 10, num_slots=2, max_bs=2, width=4, device="cpu", backend="torch",
                         table=CorpusTable(t.log_ratio[:5], {**t.corpus, "n_max": 4}))


def test_shipped_default_loads_fits_the_step_corpus_and_improves_nothing_it_should_not():
    t = load_corpus_table("default")
    assert t.source == str(DEFAULT_CORPUS_TABLE)
    t.check_corpus(corpus_config("shared", 1 << 21, 1))  # the step's corpus, its walk cut included
    assert t.corpus["tau"] == STEP_CORPUS_TAU != CorpusConfig().tau
    with pytest.raises(ValueError, match="fitted for a corpus"):  # a stand-alone corpus walks differently
        t.check_corpus(CorpusConfig())
    assert load_corpus_table("none") is None
    held = t.heldout
    assert held["fitted"]["log_loss"] < held["raw"]["log_loss"]
    assert held["fitted"]["ece"] < held["raw"]["ece"]
    assert t.fit_meta["corpus_digest"] and t.fit_meta["tokens"] > 10**6


def test_option_errors_name_the_key_and_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(HybridConfigError, match="corpus_calibration.*missing"):
        HybridConfig(corpus="shared", corpus_calibration=str(tmp_path / "missing.json")).validate()
    with pytest.raises(HybridConfigError, match="corpus_calibration.*bad.json"):
        HybridConfig(corpus="shared", corpus_calibration=str(bad)).validate()
    HybridConfig(corpus="off", corpus_calibration=str(bad)).validate()  # not read while the corpus is off
    HybridConfig(corpus="tenant", corpus_calibration="none").validate()
    assert HybridConfig.from_env({"SGLANG_HYBRID_CORPUS_CALIBRATION": "none"}).corpus_calibration == "none"


def test_scoring_matches_a_brute_force_loop():
    rng = np.random.default_rng(6)
    n, D = 200, 5
    tok = rng.integers(0, 3, (n, D))
    truth = rng.integers(0, 3, (n, D))
    length = rng.integers(0, D + 1, n)
    known = rng.integers(0, D + 1, n)
    tried, acc = _score(tok, length, truth, known)
    for i in range(n):
        ok = True
        for j in range(D):
            t = ok and j < length[i] and j < known[i]
            assert tried[i, j] == t
            assert acc[i, j] == (t and tok[i, j] == truth[i, j])
            ok = t and tok[i, j] == truth[i, j]


def test_replay_learns_across_documents_and_scores_against_the_text():
    rng = np.random.default_rng(7)
    body = rng.integers(10, 400, 60)
    docs = [np.concatenate([[1, 2, 3], body]), np.concatenate([[4, 5, 6], body]), rng.integers(10, 400, 50)]
    s = corpus_samples(docs, [3, 3, 3], CorpusConfig(entries=1 << 12), 6, batch=1)
    first, second = s.doc == 0, s.doc == 1
    # Document 1 repeats document 0's output: the corpus drafts it and nearly every first token is accepted.
    assert second.sum() > 40 and s.accepted[second, 0].mean() > 0.9
    assert not first.any() or s.accepted[first, 0].mean() < 0.5  # its own random text: little to copy
    assert (s.accepted <= s.tried).all() and (s.q[~s.tried & (s.q == 0)] == 0).all()
    # Side by side (batch 3), document 1 decodes beside document 0, one token behind nothing: it can only draft
    # what document 0 has already produced, so it gains less than when it came after it.
    sb = corpus_samples(docs, [3, 3, 3], CorpusConfig(entries=1 << 12), 6, batch=3)
    assert set(np.unique(sb.doc)) <= {0, 1, 2} and (sb.accepted <= sb.tried).all()
    assert sb.accepted[sb.doc == 1, 0].sum() < s.accepted[second, 0].sum()


def test_calibrate_cli_fits_a_corpus_table_from_requests(tmp_path, capsys):
    rng = np.random.default_rng(8)
    words = ["alpha", "beta", "gamma", "delta", "return", "value", "self", "data", "(", ")", ":", "\n"]
    lines = []
    for i in range(40):
        out = " ".join(rng.choice(words, 60)) + " the same closing phrase of every answer here."
        lines.append(json.dumps({"prompt": f"question {i}: " + " ".join(rng.choice(words, 20)), "output": out}))
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text("\n".join(lines) + "\n")
    out = tmp_path / "ct.json"
    rc = calibrate_main(["--candidate", "corpus", "--corpus", str(reqs), "--max-draft", "8", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "corpus q" in text and "fitted" in text
    t = CorpusTable.load(out)
    assert t.max_draft == 8 and t.fit_meta["corpus_requests"] == 40
    assert t.corpus["tau"] == STEP_CORPUS_TAU  # fitted on the walks the step's corpus drafts
    assert t.heldout["fitted"]["events"] > 0
    HybridConfig(corpus="shared", corpus_calibration=str(out)).validate()
    assert calibrate_main(["--candidate", "corpus", "--corpus", str(reqs), "--corpus-entries", "1000",
                           "--out", str(tmp_path / "x.json")]) == 2
    assert "--corpus-entries" in capsys.readouterr().err
    assert calibrate_main(["--candidate", "corpus", "--corpus", str(reqs), "--draft-model", str(tmp_path),
                           "--out", str(tmp_path / "x.json")]) == 2
    assert "--draft-model" in capsys.readouterr().err
