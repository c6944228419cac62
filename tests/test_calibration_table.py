"""Calibration table files: round trip, and every kind of bad file raises its own message naming the file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sglang_hybrid.calibration import CalibrationError, CalibrationTable, Feature, default_edges
from sglang_hybrid.calibration.table import SCHEMA_VERSION
from sglang_hybrid.ngram import NgramConfig


def _table(agree: bool = False) -> CalibrationTable:
    feats = default_edges(2, 8, 16, agree=agree)
    shape = tuple(f.num_buckets for f in feats)
    rng = np.random.default_rng(0)
    q = rng.uniform(0.05, 0.95, size=shape)
    trials = rng.integers(0, 1000, size=shape)
    accepts = (trials * q).astype(np.int64)
    return CalibrationTable(feats, q, trials, accepts, {"source": "test"}, {"survival": {"ece": 0.01}})


def _write(tmp_path, obj, name="t.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def _good_json() -> dict:
    return _table().to_json()


def test_round_trip(tmp_path):
    for agree in (False, True):
        t = _table(agree)
        p = t.save(tmp_path / f"a{agree}.json")
        u = CalibrationTable.load(p)
        assert u.has_agree == agree
        assert [f.edges for f in u.features] == [f.edges for f in t.features]
        np.testing.assert_allclose(u.q, t.q, atol=5e-7)
        assert np.array_equal(u.trials, t.trials) and np.array_equal(u.accepts, t.accepts)
        assert u.fit == t.fit and u.heldout == t.heldout
        # saving again gives the same bytes
        assert u.save(tmp_path / "b.json").read_bytes() == p.read_bytes()


def test_bucket_mapping():
    f = Feature("match_count", (1, 2, 3, 5, 9, None))
    assert f.bucket(np.array([1, 2, 3, 4, 5, 8, 9, 10_000])).tolist() == [0, 1, 2, 2, 3, 3, 4, 4]
    g = Feature("match_len", (2, 3, 4, 5))
    assert g.bucket(np.array([2, 3, 4])).tolist() == [0, 1, 2]
    assert [f.label(k) for k in range(f.num_buckets)] == ["1", "2", "3-4", "5-8", "9+"]
    pos = next(f for f in default_edges(2, 8, 16) if f.name == "position")
    assert pos.edges == (1, 2, 3, 4, 5, 7, 9, 13, 17)
    pos = next(f for f in default_edges(2, 8, 3) if f.name == "position")
    assert pos.edges == (1, 2, 3, 4)


def test_missing_file(tmp_path):
    p = tmp_path / "nope.json"
    with pytest.raises(CalibrationError, match=r"nope\.json.*file not found"):
        CalibrationTable.load(p)


def test_malformed_json(tmp_path):
    p = _write(tmp_path, '{"format": "sglang-hybrid/ngram-calibration", "q": [1, 2', "broken.json")
    with pytest.raises(CalibrationError, match=r"broken\.json.*malformed JSON.*line 1"):
        CalibrationTable.load(p)


def test_wrong_schema_version(tmp_path):
    obj = _good_json()
    obj["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(CalibrationError, match=r"v\.json.*schema_version is 2.*reads schema_version 1"):
        CalibrationTable.load(_write(tmp_path, obj, "v.json"))
    del obj["schema_version"]
    with pytest.raises(CalibrationError, match=r"schema_version is None"):
        CalibrationTable.load(_write(tmp_path, obj, "v.json"))


def test_wrong_format_name(tmp_path):
    obj = _good_json()
    obj["format"] = "something-else"
    with pytest.raises(CalibrationError, match=r"f\.json.*'format' is 'something-else'"):
        CalibrationTable.load(_write(tmp_path, obj, "f.json"))


def test_probability_out_of_range(tmp_path):
    obj = _good_json()
    obj["q"][3][2][1][0] = 1.5
    with pytest.raises(CalibrationError, match=r"p\.json.*1\.5 at \[match_len=5, position=3, match_count=2, "
                                               r"in_prompt=0\], outside \[0, 1\]"):
        CalibrationTable.load(_write(tmp_path, obj, "p.json"))
    obj["q"][3][2][1][0] = -0.01
    with pytest.raises(CalibrationError, match=r"outside \[0, 1\]"):
        CalibrationTable.load(_write(tmp_path, obj, "p.json"))


def test_nan_probability(tmp_path):
    obj = _good_json()
    obj["q"][0][7][4][1] = float("nan")  # json.dumps writes NaN
    with pytest.raises(CalibrationError, match=r"nan\.json.*NaN or infinite value at \[match_len=2, "
                                               r"position=13-16, match_count=9\+, in_prompt=1\]"):
        CalibrationTable.load(_write(tmp_path, obj, "nan.json"))


def test_shape_mismatch(tmp_path):
    obj = _good_json()
    obj["features"][0]["edges"] = [2, 3, 4, 5, 6, 7, 8, 9, 10]  # 8 buckets, q has 7
    with pytest.raises(CalibrationError, match=r"s\.json.*'q' has shape \[7, 8, 5, 2\] but the feature edges give "
                                               r"\[8, 8, 5, 2\]"):
        CalibrationTable.load(_write(tmp_path, obj, "s.json"))
    obj = _good_json()
    obj["q"][0][0] = obj["q"][0][0][:3]  # ragged
    with pytest.raises(CalibrationError, match=r"s\.json.*'q' is not a rectangular array"):
        CalibrationTable.load(_write(tmp_path, obj, "s.json"))
    obj = _good_json()
    obj["trials"] = obj["trials"][:-1]
    with pytest.raises(CalibrationError, match=r"'trials' has shape \[6, 8, 5, 2\]"):
        CalibrationTable.load(_write(tmp_path, obj, "s.json"))


def test_bad_edges_and_features(tmp_path):
    obj = _good_json()
    obj["features"][1]["edges"] = [1, 3, 2, 4, 5, 7, 9, 13, 17]
    with pytest.raises(CalibrationError, match=r"e\.json.*'position'.*strictly increasing"):
        CalibrationTable.load(_write(tmp_path, obj, "e.json"))
    obj = _good_json()
    obj["features"][2]["edges"] = [1, None, 3, 5, 9, None]
    with pytest.raises(CalibrationError, match=r"'match_count': edge 1 is None"):
        CalibrationTable.load(_write(tmp_path, obj, "e.json"))
    obj = _good_json()
    obj["features"][0], obj["features"][1] = obj["features"][1], obj["features"][0]
    with pytest.raises(CalibrationError, match=r"e\.json.*features must be \['match_len', 'position'"):
        CalibrationTable.load(_write(tmp_path, obj, "e.json"))
    obj = _good_json()
    obj["accepts"][0][0][0][0] = obj["trials"][0][0][0][0] + 1
    with pytest.raises(CalibrationError, match=r"'accepts' exceeds 'trials'"):
        CalibrationTable.load(_write(tmp_path, obj, "e.json"))


def test_coverage(tmp_path):
    p = _table().save(tmp_path / "c.json")
    t = CalibrationTable.load(p, NgramConfig())  # defaults (2, 8, 16, 0) are covered
    t.check_covers(NgramConfig(n_min=3, n_max=5, max_draft=4))
    with pytest.raises(CalibrationError, match=r"c\.json.*'match_len' covers \[2, 8\].*can produce \[2, 10\]"):
        t.check_covers(NgramConfig(n_max=10))
    with pytest.raises(CalibrationError, match=r"'match_len' covers \[2, 8\].*can produce \[1, 8\]"):
        CalibrationTable.load(p, NgramConfig(n_min=1))
    with pytest.raises(CalibrationError, match=r"'position' covers \[1, 16\].*can produce \[1, 32\]"):
        t.check_covers(NgramConfig(max_draft=32))
    # a bounded match_count axis cannot cover an unbounded window, but covers a small window
    obj = _good_json()
    obj["features"][2]["edges"] = [1, 2, 3, 5, 9, 17]
    p2 = _write(tmp_path, obj, "bounded.json")
    t2 = CalibrationTable.load(p2)
    with pytest.raises(CalibrationError, match=r"bounded\.json.*'match_count' covers \[1, 16\].*\[1, inf\]"):
        t2.check_covers(NgramConfig())
    t2.check_covers(NgramConfig(window=16))
    with pytest.raises(CalibrationError, match=r"'match_count' covers \[1, 16\].*\[1, 17\]"):
        t2.check_covers(NgramConfig(window=17))


def test_lookup_matches_cells():
    t = _table()
    assert t.lookup(np.array(5), np.array(6), np.array(4), np.array(1)) == t.q[3, 4, 2, 1]
    assert t.lookup(np.array(8), np.array(16), np.array(99), np.array(0)) == t.q[6, 7, 4, 0]
    ta = _table(agree=True)
    with pytest.raises(ValueError, match="agree"):
        ta.lookup(np.array(5), np.array(6), np.array(4), np.array(1))
    assert ta.lookup(np.array(5), np.array(6), np.array(4), np.array(1), np.array(1)) == ta.q[3, 4, 2, 1, 1]
