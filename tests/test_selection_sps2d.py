"""2-D SPS (selection/sps2d.py): the device row for a step's context against the host definition, the roofline
table against the simulator's roofline-2d cost, the JSON format and its errors, and no allocation per step."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sglang_hybrid.selection.sps import SpsTable, SpsTableError
from sglang_hybrid.selection.sps2d import DenseSps2D, Sps2DTable, load_sps2d_table, roofline_sps2d_table
from sglang_hybrid.sim.cost import Roofline2DCost


def _odd_table() -> Sps2DTable:
    """Three levels whose rows are not linear in the context (interpolation must still follow the definition)."""
    probes = (1, 4, 16, 64, 256)
    rows = tuple(SpsTable(probes, tuple(s / (1 + 0.01 * p) for p in probes), 512) for s in (900.0, 500.0, 120.0))
    return Sps2DTable((0, 1000, 5000), rows)


@pytest.mark.parametrize("table", [_odd_table(), roofline_sps2d_table(max_batch_tokens=2048)])
def test_device_row_equals_the_host_definition(table):
    max_b = 600
    dense = DenseSps2D(table, max_b, "cpu")
    out = torch.zeros(max_b + 1)
    rng = np.random.default_rng(0)
    top = table.context_tokens[-1]
    contexts = [0, 1, table.context_tokens[1], top, top * 1.7] + list(rng.uniform(0, top * 1.2, size=12))
    for c in contexts:
        dense.fill(torch.tensor(float(c)), out)
        want = np.array([1.0 / table.seconds(b, float(c)) for b in range(max_b + 1)])
        np.testing.assert_allclose(out.numpy(), want, rtol=2e-5, err_msg=f"context {c}")


def test_roofline_table_is_the_simulators_roofline_2d_cost():
    table = roofline_sps2d_table()
    cost = Roofline2DCost()
    for b in (1, 8, 64, 184, 200, 512, 4096):
        for c in (0, 1000, 128 * 3000, 3_000_000, 12_000_000):
            if b in table.rows[0].sample_batch_tokens:
                assert table.seconds(b, c) == pytest.approx(cost.seconds(b, 0, c), rel=1e-9)


def test_json_round_trip_and_errors_name_the_file(tmp_path):
    t = _odd_table()
    p = tmp_path / "sps2d.json"
    p.write_text(json.dumps(t.to_dict()))
    assert load_sps2d_table(p) == t
    p.write_text(json.dumps({**t.to_dict(), "context_tokens": [0, 1000, 1000]}))
    with pytest.raises(SpsTableError, match="sps2d.json.*context_tokens"):
        load_sps2d_table(p)
    p.write_text(json.dumps(t.rows[0].to_dict()))  # a 1-D table is not a 2-D one
    with pytest.raises(SpsTableError, match="sps2d.json.*format"):
        load_sps2d_table(p)
    with pytest.raises(SpsTableError, match="missing.json: file not found"):
        load_sps2d_table(tmp_path / "missing.json")


def test_fill_allocates_nothing():
    dense = DenseSps2D(_odd_table(), 300, "cpu")
    out = torch.zeros(301)
    ctx = torch.tensor(2500.0)
    dense.fill(ctx, out)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        dense.fill(ctx, out)
    allocs = [e for e in prof.events() if e.cpu_memory_usage > 0]
    assert not allocs, [(e.name, e.cpu_memory_usage) for e in allocs]
