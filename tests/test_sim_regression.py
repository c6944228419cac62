"""Simulator regression on a small fixed slice: the hybrid is never below either pure policy by more than noise.

Deterministic counts, not timings: each policy's accepted tokens per request-step and its modelled throughput
(output tokens over the SPS-table step costs, both counts of the replay). The slice is the first 12 records of
each shipped workload (outputs cut to their first 2000 characters), batch 4, steady measure.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sglang_hybrid.sim.jsonl import read_workload
from sglang_hybrid.sim.runner import SimOptions, simulate

DATA = Path(__file__).resolve().parent.parent / "sglang_hybrid" / "data" / "workloads"
NOISE = 0.02  # relative: a 12-request slice moves by about this much between neighbouring settings


def _slice(name: str):
    return [dataclasses.replace(r, output=r.output[:2000]) for r in read_workload(DATA / name)[:12]]


@pytest.fixture(scope="module")
def results():
    out = {}
    for kind, name in (("code-edit", "code_edit.jsonl"), ("chat", "chat.jsonl")):
        out[kind] = simulate(_slice(name), SimOptions(batch_size=4))["policies"]
    return out


@pytest.mark.parametrize("kind", ["code-edit", "chat"])
def test_hybrid_not_below_dspark(results, kind):
    p = results[kind]
    assert p["hybrid"]["accepted_per_step"] >= p["dspark"]["accepted_per_step"] * (1 - NOISE)
    assert p["hybrid"]["throughput"] >= p["dspark"]["throughput"] * (1 - NOISE)


def test_hybrid_not_below_ngram_on_chat(results):
    p = results["chat"]
    assert p["hybrid"]["throughput"] >= p["ngram"]["throughput"] * (1 - NOISE)


def test_hybrid_not_below_ngram_on_code_edits_at_batch_4(results):
    """The hybrid's default n-gram chain under the ragged verify is 16 tokens: at batch 4, where verify is nearly
    free, it verifies longer copies than NGRAM's 12-token window (and still pays the model drafter)."""
    p = results["code-edit"]
    assert p["hybrid"]["throughput"] >= p["ngram"]["throughput"] * (1 - NOISE)


def test_two_dimensional_price_under_the_roofline_2d_cost():
    """Under ``--cost roofline-2d`` (KV charged per actual request) the 1-D SPS table under-prices verify tokens
    at large context, and the hybrid verified too little. Pricing with the 2-D table (``sps2d`` auto) must not
    fall below NGRAM there and must beat the 1-D price by more than noise (measured: 31,396 against 29,367
    modelled tok/s, NGRAM 25,753). Batch 32 over 40 code-edit records, counts only."""
    recs = [dataclasses.replace(r, output=r.output[:1500]) for r in read_workload(DATA / "code_edit.jsonl")[:40]]
    base = SimOptions(batch_size=32, cost="roofline-2d", policies=("ngram", "hybrid"))
    two_d = simulate(recs, base)["policies"]
    one_d = simulate(recs, dataclasses.replace(base, sps2d="off", policies=("hybrid",)))["policies"]
    assert two_d["hybrid"]["throughput"] >= two_d["ngram"]["throughput"] * (1 - NOISE)
    assert two_d["hybrid"]["throughput"] > one_d["hybrid"]["throughput"] * (1 + NOISE)
