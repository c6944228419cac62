"""Fairness weights between requests (selection/fairness.py, option ``fairness``): the weights against their
plain definition, the decode-step rules (no host sync, nothing allocated), and their effect: a request that
commits few tokens a step gets a larger share of a binding verify budget, in the step and in the simulator."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from sglang_hybrid.config import HybridConfig, HybridConfigError
from sglang_hybrid.selection import SpsTable, dense_sps
from sglang_hybrid.selection.fairness import FairWeights, fair_weights_ref
from sglang_hybrid.step import HybridStep, sync_guard


@pytest.mark.parametrize("alpha", [0.25, 1.0, 2.0])
def test_weights_equal_the_plain_definition_over_many_steps(alpha):
    rng = random.Random(int(alpha * 100))
    fw = FairWeights(num_slots=12, max_bs=6, alpha=alpha, device="cpu")
    steps, committed = [0] * 12, [0] * 12
    for _ in range(40):
        bs = rng.randint(1, 6)
        slots = rng.sample(range(12), bs)
        st = torch.tensor(slots)
        got = fw.weights(st).tolist()
        want = fair_weights_ref([steps[s] for s in slots], [committed[s] for s in slots], alpha)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert max(got) == pytest.approx(1.0) and all(0 < w <= 1.0 + 1e-6 for w in got)
        acc = [rng.choice([1, 1, 2, 5, 17]) for _ in slots]
        fw.update(st, torch.tensor(acc, dtype=torch.int32))
        for s, a in zip(slots, acc):
            steps[s] += 1
            committed[s] += a
        if rng.random() < 0.2:  # a slot takes a new request
            s = rng.randrange(12)
            fw.reset(torch.tensor([s]))
            steps[s] = committed[s] = 0


def test_weights_edge_cases_and_bad_alpha():
    fw = FairWeights(num_slots=4, max_bs=4, alpha=1.0, device="cpu")
    assert fw.weights(torch.tensor([0, 1, 2])).tolist() == [1.0, 1.0, 1.0]  # nothing known yet
    fw.update(torch.tensor([0]), torch.tensor([4], dtype=torch.int32))
    assert fw.weights(torch.tensor([0, 1])).tolist() == [1.0, 1.0]  # an unknown request takes the others' mean
    fw.update(torch.tensor([1]), torch.tensor([1], dtype=torch.int32))
    assert fw.weights(torch.tensor([0, 1, 3])).tolist() == pytest.approx([0.25, 1.0, 0.4])
    assert fair_weights_ref([2, 0], [2, 0], 1.0) == [1.0, 1.0]
    with pytest.raises(ValueError, match="alpha"):
        FairWeights(num_slots=2, max_bs=2, alpha=0.0, device="cpu")
    with pytest.raises(HybridConfigError, match="fairness"):
        HybridConfig(fairness=-0.5).validate()
    assert HybridConfig.from_env({"SGLANG_HYBRID_FAIRNESS": "0.5"}).fairness == 0.5


def test_weights_allocate_nothing_and_never_sync():
    from torch.profiler import ProfilerActivity, profile

    fw = FairWeights(num_slots=8, max_bs=4, alpha=0.7, device="cpu")
    slots, acc = torch.tensor([1, 4, 6]), torch.tensor([3, 1, 9], dtype=torch.int32)
    fw.update(slots, acc)
    fw.weights(slots)
    with sync_guard(True), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fw.weights(slots)
        fw.update(slots, acc)
    assert [e.name for e in prof.events() if e.cpu_memory_usage > 0] == []


GAMMA = 4


def _run_step(fairness: float):
    """Two requests under a verify budget that binds, both on their model chains: slot 0's is confident (0.95 a
    token) and it has committed 9 tokens a step so far, slot 1's is weaker (0.7) and it has committed 1."""
    # Flat up to 6 verify tokens, then compute-bound: a draft token pays only where its survival is high.
    sps = SpsTable(tuple(range(1, 65)), tuple(1000.0 * min(1.0, 6.0 / b) for b in range(1, 65)), 64)
    step = HybridStep(HybridConfig(fairness=fairness, model_prior=0.3), num_slots=4, width=256, gamma=GAMMA,
                      max_bs=2, device="cpu", sps_dense=dense_sps(sps, 64))
    slots = torch.tensor([0, 1])
    rows = [list(range(10, 40)), list(range(100, 120))]  # nothing repeats: no n-gram chain
    p = max(len(r) for r in rows)
    prompt = torch.zeros(2, p, dtype=torch.int32)
    for i, r in enumerate(rows):
        prompt[i, : len(r)] = torch.tensor(r)
    lens = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    step.on_prefill(slots, prompt[:, :-1], lens - 1, torch.tensor([r[-1] for r in rows], dtype=torch.int32))
    if step.fair is not None:  # the requests' records so far: 9 and 1 committed tokens a step
        for _ in range(3):
            step.fair.update(slots, torch.tensor([9, 1], dtype=torch.int32))
    conf = torch.tensor([[0.95] * GAMMA, [0.7] * GAMMA])
    model = torch.tensor([[90, 91, 92, 93], [94, 95, 96, 97]], dtype=torch.int32)
    prop = step.propose(slots, model, model_confidence=conf)
    planner = step.planner_confidence(prop, conf, torch.zeros(2, GAMMA))
    return prop, planner, step


def test_fairness_moves_a_binding_budget_towards_the_request_that_gets_few_tokens():
    base, base_planner, _ = _run_step(0.0)
    fair, fair_planner, step = _run_step(1.0)
    assert base.choice.tolist() == fair.choice.tolist() == [0, 0]
    vb, vf = base.verify_len.tolist(), fair.verify_len.tolist()
    assert vb[0] > vb[1]  # without fairness the confident chain takes the budget
    assert vf[1] > vb[1] and vf[0] < vb[0], (vb, vf)
    # DSpark's planner sees the same weights: slot 0's first confidence times 1/9, slot 1's as they were.
    w = step.fair.w[:2].tolist()
    assert w == pytest.approx([1 / 9, 1.0])
    assert fair_planner[0, 0].item() == pytest.approx(base_planner[0, 0].item() / 9, rel=1e-5)
    assert torch.equal(fair_planner[1], base_planner[1]) and torch.equal(fair_planner[0, 1:], base_planner[0, 1:])


def test_simulator_fairness_narrows_the_gap_between_kinds(tmp_path):
    """Mixed traffic at batch 8 under an SPS table that is flat to 48 verify tokens and compute-bound past them
    (so the budget binds): with fairness 1 chat requests run faster and code edits slower than with the batch
    total alone."""
    from pathlib import Path

    from sglang_hybrid.sim.jsonl import read_workload
    from sglang_hybrid.sim.runner import SimOptions, simulate

    data = Path(__file__).resolve().parent.parent / "sglang_hybrid" / "data" / "workloads"
    code = sorted(read_workload(data / "code_edit.jsonl"), key=lambda r: len(r.prompt) + len(r.output))[:12]
    chat = read_workload(data / "chat.jsonl")[:12]
    recs = [r for pair in zip(code, chat) for r in pair]
    table = tmp_path / "sps.json"
    table.write_text(SpsTable(tuple(range(1, 257)), tuple(1000.0 * min(1.0, 48.0 / b) for b in range(1, 257)),
                              256).to_json())
    opts = SimOptions(batch_size=8, measure="all", policies=("dspark", "hybrid"), sps_table=str(table))
    base = simulate(recs, opts)["ratios_by_kind"]
    fair = simulate(recs, dataclasses.replace(opts, fairness=1.0))["ratios_by_kind"]
    assert fair["chat"]["hybrid_over_dspark"] > base["chat"]["hybrid_over_dspark"]
    assert fair["code-edit"]["hybrid_over_dspark"] < base["code-edit"]["hybrid_over_dspark"]
    with pytest.raises(ValueError, match="fairness"):
        simulate(recs, dataclasses.replace(opts, fairness=5.0))
