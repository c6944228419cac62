"""SPS tables: loading with errors naming the file, SGLang compatibility, the shipped roofline default."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable, load_sps_table_from_path

from sglang_hybrid.selection.sps import (
    DEFAULT_ROOFLINE_PATH,
    SpsTable,
    SpsTableError,
    dense_sps,
    load_default_sps_table,
    load_sps_table,
    roofline_json,
    roofline_sps_table,
    roofline_step_seconds,
)

GOOD = {"sample_batch_tokens": [1, 8, 64], "sample_steps_per_sec": [250.0, 240.5, 200.0], "max_batch_tokens": 128}


def _write(tmp_path, obj, name="t.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def test_load_good_and_sglang_reads_ours(tmp_path):
    p = _write(tmp_path, GOOD)
    t = load_sps_table(p)
    assert t.sample_batch_tokens == (1, 8, 64) and t.max_batch_tokens == 128
    theirs = SpsCostTable.from_json(t.to_json())
    assert theirs.sample_batch_tokens == [1, 8, 64] and theirs.sample_steps_per_sec == [250.0, 240.5, 200.0]
    for b in range(0, 140):
        assert t.lookup(b) == theirs.lookup(b)


@pytest.mark.parametrize(
    "content,needle",
    [
        ("{not json", "malformed JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({k: v for k, v in GOOD.items() if k != "sample_steps_per_sec"}, "missing key 'sample_steps_per_sec'"),
        ({**GOOD, "sample_batch_tokens": [1, 64, 8]}, "strictly increasing"),
        ({**GOOD, "sample_batch_tokens": [1, 8, 8]}, "strictly increasing"),
        ({**GOOD, "sample_steps_per_sec": [250.0, 240.0]}, "lengths differ"),
        ({**GOOD, "sample_steps_per_sec": [250.0, 0.0, 200.0]}, "'sample_steps_per_sec'[1]"),
        ({**GOOD, "sample_steps_per_sec": [250.0, -1.0, 200.0]}, "> 0"),
        ('{"sample_batch_tokens": [1], "sample_steps_per_sec": [NaN], "max_batch_tokens": 4}', "finite"),
        ({**GOOD, "sample_batch_tokens": [0, 8, 64]}, "'sample_batch_tokens'[0]"),
        ({**GOOD, "sample_batch_tokens": [1, 8.5, 64]}, "'sample_batch_tokens'[1]"),
        ({**GOOD, "sample_batch_tokens": [], "sample_steps_per_sec": []}, "empty"),
        ({**GOOD, "max_batch_tokens": 32}, "'max_batch_tokens'"),
        ({**GOOD, "sample_steps_per_sec": "fast"}, "must be a list"),
        ({"bias_seconds": 0.001, "bs_probes": [1]}, "SpsAdditiveCostTable"),
    ],
)
def test_load_errors_name_the_file_and_field(tmp_path, content, needle):
    p = _write(tmp_path, content, name="my_table.json")
    with pytest.raises(SpsTableError) as e:
        load_sps_table(p)
    assert str(p) in str(e.value) and needle in str(e.value), str(e.value)


def test_missing_file(tmp_path):
    p = tmp_path / "nope.json"
    with pytest.raises(SpsTableError, match="nope.json: file not found"):
        load_sps_table(p)


def test_shipped_default_is_reproduced_exactly_and_sglang_loads_it():
    assert DEFAULT_ROOFLINE_PATH.read_text(encoding="utf-8") == roofline_json()
    ours = load_default_sps_table()
    assert ours == roofline_sps_table()
    theirs = load_sps_table_from_path(str(DEFAULT_ROOFLINE_PATH))  # ignores our "_comment" key
    assert isinstance(theirs, SpsCostTable)
    assert theirs.sample_batch_tokens == list(ours.sample_batch_tokens)
    assert theirs.max_batch_tokens == 512 * 33


def test_roofline_model_numbers():
    t = roofline_step_seconds
    weights = 16e9 / 4.3e12
    kv_per_req = 1024 * 147456 / 4.3e12
    assert t([8])[0] == pytest.approx(150e-6 + weights + kv_per_req)  # 8 tokens = one request
    per_tok = 16e9 / 790e12
    knee = weights / per_tok
    assert 183 < knee < 185
    # beyond the knee the step grows by compute + KV per token
    assert t([1000])[0] - t([500])[0] == pytest.approx(500 * (per_tok + kv_per_req / 8))
    table = roofline_sps_table()
    sps = np.asarray(table.sample_steps_per_sec)
    assert np.all(np.diff(sps) < 0)  # strictly decreasing in B
    assert 250 < table.lookup(1) < 270  # ~3.9 ms per step at one token
    assert table.lookup(512) < 0.5 * table.lookup(184)


def test_dense_sps_is_sglang_floor_probe_lookup():
    for table in (load_default_sps_table(), SpsCostTable(**GOOD)):
        n = 17000 if isinstance(table, SpsTable) else 200
        d = dense_sps(table, n)
        assert d.dtype == torch.float32 and d.shape == (n + 1,)
        theirs = SpsCostTable(sample_batch_tokens=list(table.sample_batch_tokens),
                              sample_steps_per_sec=list(table.sample_steps_per_sec),
                              max_batch_tokens=table.max_batch_tokens)
        want = torch.tensor([theirs.lookup(b) for b in range(n + 1)], dtype=torch.float32)
        assert torch.equal(d, want)


def test_dense_sps_errors():
    with pytest.raises(SpsTableError, match="'max_tokens'"):
        dense_sps(load_default_sps_table(), 0)
    with pytest.raises(SpsTableError, match="'table'"):
        dense_sps(object(), 10)
