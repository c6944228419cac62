"""Fairness weights between requests (selection/fairness.py, option ``fairness``): DSpark's plan (the yardstick)
against its plain definition and against the simulator's DSpark planner (itself tested equal to SGLang's), the
weights against their plain definition over many steps, the decode-step rules (no host sync, nothing allocated),
and their effect: a request that runs behind DSpark's speed for it gets a larger share of a binding verify budget,
in the step and in the simulator."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from sglang_hybrid.config import HybridConfig, HybridConfigError
from sglang_hybrid.selection import SpsTable, dense_sps
from sglang_hybrid.selection.fairness import FairWeights, dspark_plan_ref, fair_weights_ref
from sglang_hybrid.sim.dspark_planner import DSparkPlanner
from sglang_hybrid.step import HybridStep, sync_guard


def _table(rng: random.Random, max_tokens: int) -> SpsTable:
    """Random decreasing steps/sec at random probes; values are integers (exact in float32, as DSpark's float64)."""
    probes = sorted({1, *(rng.randint(2, max_tokens) for _ in range(10))})
    vals, v = [], 4096
    for _ in probes:
        v -= rng.choice([0, 0, 1, 7, 60, 300])
        vals.append(float(max(v, 1)))
    return SpsTable(tuple(probes), tuple(vals), max_tokens)


def _surv(rng: random.Random, bs: int, gamma: int, kind: str) -> torch.Tensor:
    if kind == "random":
        conf = [[rng.uniform(0.05, 1.0) for _ in range(gamma)] for _ in range(bs)]
    elif kind == "ties":  # many equal survivals across requests and positions
        conf = [[rng.choice([0.5, 1.0]) for _ in range(gamma)] for _ in range(bs)]
    elif kind == "ones":
        conf = [[1.0] * gamma for _ in range(bs)]
    else:  # "flat": one value everywhere
        conf = [[0.75] * gamma for _ in range(bs)]
    return torch.cumprod(torch.tensor(conf, dtype=torch.float32), 1)


@pytest.mark.parametrize("kind", ["random", "ties", "ones", "flat"])
@pytest.mark.parametrize("bs,gamma", [(1, 7), (3, 4), (16, 7), (40, 5)])
def test_plan_equals_its_definition_and_the_dspark_planner(kind, bs, gamma):
    rng = random.Random(bs * 100 + gamma + len(kind))
    for trial in range(4):
        table = _table(rng, bs * (1 + gamma) + 4)
        sps = dense_sps(table, bs * (1 + gamma) + 4)
        surv = _surv(rng, bs, gamma, kind)
        k, expected, seconds = dspark_plan_ref(surv, sps)
        # The simulator's DSpark planner (SGLang's CPU path, tests/test_sim_dspark_planner.py) on the same chains.
        planner = DSparkPlanner(gamma, table)
        assert k == planner.budget(surv)
        lens = planner.verify_lens(surv / torch.cat([torch.ones(bs, 1), surv[:, :-1]], 1), k).tolist()
        want = [1.0 + float(surv[r, : lens[r] - 1].sum()) for r in range(bs)]
        assert expected == pytest.approx(want, rel=1e-6)
        assert seconds == pytest.approx(1.0 / table.sample_steps_per_sec[
            max(i for i, p in enumerate(table.sample_batch_tokens) if p <= bs + k)], rel=1e-7)
        # The device version, in a larger object (views of its buffers) and with a wider model chain passed in.
        fw = FairWeights(num_slots=64, max_bs=48, gamma=gamma, width=gamma + 2, alpha=1.0,
                         sps=dense_sps(table, 48 * (3 + gamma)), device="cpu")
        fw.plan(torch.cat([surv, torch.rand(bs, 2)], 1))
        assert int(fw._plan.view(bs).budget_used) == k
        assert fw._ed[:bs].tolist() == pytest.approx(expected, rel=1e-6, abs=1e-6)
        assert float(fw._td) == pytest.approx(seconds, rel=1e-6)


def _step_ref(surv_w, w, vlen, sps, bs):
    h = [1.0 + sum(surv_w[r][: vlen[r]]) / w[r] for r in range(bs)]
    return h, 1.0 / float(sps[bs + sum(vlen)])


@pytest.mark.parametrize("scope", ["request", "tenant"])
@pytest.mark.parametrize("alpha", [0.25, 1.0, 2.0])
def test_weights_equal_the_plain_definition_over_many_steps(alpha, scope):
    rng = random.Random(int(alpha * 100) + (scope == "tenant"))
    gamma, width, slots_n, max_bs = 4, 6, 12, 6
    table = _table(rng, max_bs * (1 + width) + 1)
    sps = dense_sps(table, max_bs * (1 + width) + 1)
    fw = FairWeights(num_slots=slots_n, max_bs=max_bs, gamma=gamma, width=width, alpha=alpha, sps=sps, device="cpu",
                     scope=scope)
    rec = {k: [0.0] * slots_n for k in ("h", "th", "e", "td", "n")}
    tenant_of = [rng.choice([0, 7, 2**31 - 1]) for _ in range(slots_n)]  # three tenants, ids as SGLang's hash
    for _ in range(40):
        bs = rng.randint(1, max_bs)
        slots = rng.sample(range(slots_n), bs)
        st = torch.tensor(slots)
        model_surv = _surv(rng, bs, gamma, rng.choice(["random", "ties"]))
        fw.plan(model_surv)
        _, e, td = dspark_plan_ref(model_surv, sps)
        ten = [tenant_of[s] for s in slots] if scope == "tenant" else None
        got = fw.weights(st, None if ten is None else torch.tensor(ten, dtype=torch.int32)).tolist()
        want = fair_weights_ref(*([rec[k][s] for s in slots] for k in ("h", "th", "e", "td", "n")), alpha, ten)
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
        if ten is not None:  # one tenant, one weight
            assert all(got[i] == got[j] for i in range(bs) for j in range(bs) if ten[i] == ten[j])
        assert max(got) == pytest.approx(1.0) and all(0 < w <= 1.0 + 1e-6 for w in got)
        # The chain each request verified, as the selection saw it (weighted), and how much of it was verified.
        surv_w = (torch.cumprod(torch.rand(bs, width), 1) * torch.tensor(got).view(-1, 1)).tolist()
        vlen = [rng.randint(0, width) for _ in slots]
        fw.update(st, torch.tensor(surv_w), torch.tensor(vlen, dtype=torch.int32))
        h, th = _step_ref(surv_w, got, vlen, sps, bs)
        for i, s in enumerate(slots):
            for k, v in (("h", h[i]), ("th", th), ("e", e[i]), ("td", td), ("n", 1)):
                rec[k][s] += v
        if rng.random() < 0.2:  # a slot takes a new request (of any tenant)
            s = rng.randrange(slots_n)
            tenant_of[s] = rng.choice([0, 7, 2**31 - 1])
            fw.reset(torch.tensor([s]))
            for k in rec:
                rec[k][s] = 0.0
    for k, t in (("h", fw.hyb_tokens), ("th", fw.hyb_seconds), ("e", fw.ds_tokens), ("td", fw.ds_seconds)):
        assert t.tolist() == pytest.approx(rec[k], rel=1e-5)


def test_weights_edge_cases_and_bad_arguments():
    sps = dense_sps(SpsTable((1, 8), (100.0, 50.0), 64), 64)
    fw = FairWeights(num_slots=4, max_bs=4, gamma=2, width=3, alpha=1.0, sps=sps, device="cpu")
    assert fw.weights(torch.tensor([0, 1, 2])).tolist() == [1.0, 1.0, 1.0]  # nothing known yet
    # Request 0: 2 expected tokens a step at DSpark's speed; request 1: the same tokens in a step twice as long.
    for slot, hs, ts in ((0, 2.0, 0.01), (1, 2.0, 0.02)):
        fw.hyb_tokens[slot], fw.hyb_seconds[slot], fw.ds_tokens[slot], fw.ds_seconds[slot] = hs, ts, 2.0, 0.01
        fw.steps[slot] = 1
    assert fw.weights(torch.tensor([0, 1])).tolist() == pytest.approx([0.5, 1.0])
    assert fw.weights(torch.tensor([0, 3])).tolist() == [1.0, 1.0]  # an unknown request takes the others' mean
    assert fw.weights(torch.tensor([0, 1, 3])).tolist() == pytest.approx([0.5, 1.0, 0.5 / 0.75])
    assert fair_weights_ref([2.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1, 0], 1.0) == [1.0, 1.0]
    with pytest.raises(ValueError, match="alpha"):
        FairWeights(num_slots=2, max_bs=2, gamma=2, width=3, alpha=0.0, sps=sps, device="cpu")
    with pytest.raises(ValueError, match="SPS table"):
        FairWeights(num_slots=2, max_bs=32, gamma=2, width=3, alpha=1.0, sps=sps, device="cpu")
    with pytest.raises(HybridConfigError, match="fairness"):
        HybridConfig(fairness=-0.5).validate()
    assert HybridConfig.from_env({"SGLANG_HYBRID_FAIRNESS": "0.5"}).fairness == 0.5


def test_tenant_scope_edge_cases_and_bad_arguments():
    sps = dense_sps(SpsTable((1, 8), (100.0, 50.0), 64), 64)
    fw = FairWeights(num_slots=6, max_bs=5, gamma=2, width=3, alpha=2.0, sps=sps, device="cpu", scope="tenant")
    # Slots 0, 1: tenant A at 2x and 1x DSpark's speed (A: 1.5x together); slot 2: tenant B at 0.5x; 3, 4 unknown.
    for slot, hs in ((0, 4.0), (1, 2.0), (2, 1.0)):
        fw.hyb_tokens[slot], fw.hyb_seconds[slot], fw.ds_tokens[slot], fw.ds_seconds[slot] = hs, 1.0, 2.0, 1.0
        fw.steps[slot] = 1
    a, b, c = (torch.tensor(t, dtype=torch.int32) for t in ([5, 5, 9], [5, 5], [5, 5, 9, 5, 3]))
    assert fw.weights(torch.tensor([0, 1, 2]), a).tolist() == pytest.approx([(0.5 / 1.5) ** 2] * 2 + [1.0])
    assert fw.weights(torch.tensor([0, 1]), b).tolist() == [1.0, 1.0]  # one tenant: every weight exactly 1
    # Slot 3 joins tenant A (A's x, its own record unknown); slot 4's tenant has no record: the batch's mean x.
    mean = (1.5 + 1.5 + 0.5 + 1.5) / 4
    assert fw.weights(torch.tensor([0, 1, 2, 3, 4]), c).tolist() == pytest.approx(
        [(0.5 / 1.5) ** 2] * 2 + [1.0, (0.5 / 1.5) ** 2, (0.5 / mean) ** 2])
    assert fair_weights_ref([4.0, 2.0, 1.0], [1.0] * 3, [2.0] * 3, [1.0] * 3, [1, 1, 1], 2.0, [5, 5, 9]) \
        == pytest.approx([(0.5 / 1.5) ** 2] * 2 + [1.0])
    with pytest.raises(ValueError, match="tenant id"):
        fw.weights(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="fairness_scope"):
        FairWeights(num_slots=2, max_bs=2, gamma=2, width=3, alpha=1.0, sps=sps, device="cpu", scope="batch")
    with pytest.raises(HybridConfigError, match="fairness_scope"):
        HybridConfig(fairness=1.0, fairness_scope="kind").validate()
    assert HybridConfig.from_env({"SGLANG_HYBRID_FAIRNESS_SCOPE": "tenant"}).fairness_scope == "tenant"


@pytest.mark.parametrize("scope", ["request", "tenant"])
def test_weights_and_update_allocate_nothing_and_plan_never_syncs(scope):
    from torch.profiler import ProfilerActivity, profile

    sps = dense_sps(SpsTable((1, 8, 20), (100.0, 60.0, 20.0), 64), 64)
    fw = FairWeights(num_slots=8, max_bs=4, gamma=3, width=5, alpha=0.7, sps=sps, device="cpu", scope=scope)
    slots = torch.tensor([1, 4, 6], dtype=torch.int32)  # as the step passes them
    tenant = torch.tensor([3, 0, 3], dtype=torch.int32)
    surv, chosen = torch.cumprod(torch.rand(3, 3), 1), torch.rand(3, 5)
    vlen = torch.tensor([3, 0, 5], dtype=torch.int32)

    fw.plan(surv)
    fw.weights(slots, tenant)
    fw.update(slots, chosen, vlen)
    with sync_guard(True):  # plan is the selection (the torch reference on CPU, which allocates; Triton on a GPU)
        fw.plan(surv)
    with sync_guard(True), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fw.weights(slots, tenant)
        fw.update(slots, chosen, vlen)
    assert [e.name for e in prof.events() if e.cpu_memory_usage > 0] == []


GAMMA = 4
# Flat up to 6 verify tokens, then compute-bound: a draft token pays only where its survival is high.
STEP_SPS = SpsTable(tuple(range(1, 65)), tuple(1000.0 * min(1.0, 6.0 / b) for b in range(1, 65)), 64)


def _step(fairness: float, sps: bool = True, scope: str = "request") -> HybridStep:
    return HybridStep(HybridConfig(fairness=fairness, model_prior=0.3, fairness_scope=scope), num_slots=4,
                      width=256, gamma=GAMMA, max_bs=2, device="cpu",
                      sps_dense=dense_sps(STEP_SPS, 64) if sps else None)


def _run_step(fairness: float, scope: str = "request", tenant=None):
    """Two requests under a verify budget that binds, both on their model chains: slot 0's is confident (0.95 a
    token) and it has run at 3x DSpark's speed for it so far, slot 1's is weaker (0.7) and at DSpark's speed."""
    step = _step(fairness, scope=scope)
    slots = torch.tensor([0, 1])
    rows = [list(range(10, 40)), list(range(100, 120))]  # nothing repeats: no n-gram chain
    p = max(len(r) for r in rows)
    prompt = torch.zeros(2, p, dtype=torch.int32)
    for i, r in enumerate(rows):
        prompt[i, : len(r)] = torch.tensor(r)
    lens = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    step.on_prefill(slots, prompt[:, :-1], lens - 1, torch.tensor([r[-1] for r in rows], dtype=torch.int32),
                    tenant)
    if step.fair is not None:  # the requests' records so far: 3x and 1x DSpark's speed
        f = step.fair
        f.hyb_tokens[:2], f.hyb_seconds[:2] = torch.tensor([30.0, 10.0]), 1.0
        f.ds_tokens[:2], f.ds_seconds[:2], f.steps[:2] = 10.0, 1.0, 5.0
    conf = torch.tensor([[0.95] * GAMMA, [0.7] * GAMMA])
    model = torch.tensor([[90, 91, 92, 93], [94, 95, 96, 97]], dtype=torch.int32)
    prop = step.propose(slots, model, model_confidence=conf)
    planner = step.planner_confidence(prop, conf, torch.zeros(2, GAMMA))
    return prop, planner, step, slots


def test_fairness_moves_a_binding_budget_towards_the_request_behind_dspark():
    base, base_planner, _, _ = _run_step(0.0)
    fair, fair_planner, step, slots = _run_step(1.0)
    assert base.choice.tolist() == fair.choice.tolist() == [0, 0]
    vb, vf = base.verify_len.tolist(), fair.verify_len.tolist()
    assert vb[0] > vb[1]  # without fairness the confident chain takes the budget
    assert vf[1] > vb[1] and vf[0] < vb[0], (vb, vf)
    # DSpark's planner sees the same weights: slot 0's first confidence times 1/3, slot 1's as they were.
    w = step.fair.w[:2].tolist()
    assert w == pytest.approx([1 / 3, 1.0])
    assert fair_planner[0, 0].item() == pytest.approx(base_planner[0, 0].item() / 3, rel=1e-5)
    assert torch.equal(fair_planner[1], base_planner[1]) and torch.equal(fair_planner[0, 1:], base_planner[0, 1:])
    # record books this step: DSpark's plan for the two model chains, and the hybrid's verified chains unweighted.
    before = step.fair.hyb_tokens[:2].clone()
    _, expected, _ = dspark_plan_ref(torch.cumprod(torch.tensor([[0.95] * GAMMA, [0.7] * GAMMA]), 1),
                                     step.sps_dense)
    acc = torch.tensor([2, 1], dtype=torch.int32)
    step.record(slots, fair, torch.tensor([[90, 91, 0, 0, 0], [94, 0, 0, 0, 0]], dtype=torch.int32), acc)
    surv = [[0.95 ** (j + 1) for j in range(vf[0])], [0.7 ** (j + 1) for j in range(vf[1])]]
    assert (step.fair.hyb_tokens[:2] - before).tolist() == pytest.approx([1 + sum(s) for s in surv], rel=1e-5)
    assert step.fair.ds_tokens[:2].tolist() == pytest.approx([10 + e for e in expected], rel=1e-6)


def test_tenant_scope_moves_the_budget_between_tenants_only():
    """Scope "tenant" in the step: the two requests of one tenant share a weight of 1 and verify what they would
    without fairness; as two tenants the budget moves as with scope "request". The step keeps each slot's tenant
    from prefill (it tracks tenants for the weights with the corpus off)."""
    base, _, _, _ = _run_step(0.0)
    one, _, step1, _ = _run_step(1.0, "tenant", torch.tensor([4, 4], dtype=torch.int32))
    two, _, step2, _ = _run_step(1.0, "tenant", torch.tensor([4, 11], dtype=torch.int32))
    per_request, _, _, _ = _run_step(1.0)
    assert step1.tracks_tenant and step1.corpus is None and step2.slot_tenant[:2].tolist() == [4, 11]
    assert step1.fair.w[:2].tolist() == [1.0, 1.0] and one.verify_len.tolist() == base.verify_len.tolist()
    assert step2.fair.w[:2].tolist() == pytest.approx([1 / 3, 1.0])
    assert two.verify_len.tolist() == per_request.verify_len.tolist() != base.verify_len.tolist()
    assert not _step(1.0).tracks_tenant and not _step(0.0, scope="tenant").tracks_tenant
    assert (step2.metrics()["fairness"], step2.metrics()["fairness_scope"]) == (1.0, "tenant")
    assert (_step(0.0, scope="tenant").metrics()["fairness_scope"], _step(1.0).metrics()["fairness_scope"]) \
        == ("", "request")


def test_prefill_hands_the_tenant_to_fairness_with_the_corpus_off():
    """What the workers call at prefill: with scope "tenant" each slot gets its request's tenant id (SGLang's
    extra_key / cache_salt, as the corpus's), though the corpus is off."""
    from sglang_hybrid.sglang_plugin.common import tenant_id
    from tests.prefill_stub import prefill_stub_requests

    step = _step(1.0, scope="tenant")
    step.slot_tenant.fill_(-1)
    reqs = prefill_stub_requests(step, [3, 1], [(None, "chat-app"), (None, None)])
    assert step.corpus is None and step.slot_tenant[[3, 1]].tolist() == [tenant_id(reqs[0]), 0] != [0, 0]


def test_fairness_needs_an_sps_budget(caplog):
    """A fixed verify window (EAGLE-family workers) has no batch budget: the step builds no weights and says so."""
    with caplog.at_level("WARNING", logger="sglang_hybrid"):
        step = _step(1.0, sps=False)
    assert step.fair is None
    assert "fairness=1 has no effect" in caplog.text
    with caplog.at_level("WARNING", logger="sglang_hybrid"):
        step = _step(0.0, scope="tenant")
    assert step.fair is None and not step.tracks_tenant
    assert "fairness_scope=tenant has no effect with fairness=0" in caplog.text


def test_simulator_fairness_narrows_the_gap_between_kinds(tmp_path):
    """Mixed traffic at batch 8 under an SPS table that is flat to 48 verify tokens and compute-bound past them
    (so the budget binds): the more fairness, the faster chat requests run and the slower code edits, and with 4
    neither kind runs below DSpark's speed (with the batch total alone chat runs at about 0.86x)."""
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
    base, a1, a4 = (simulate(recs, dataclasses.replace(opts, fairness=a))["ratios_by_kind"] for a in (0.0, 1.0, 4.0))
    chat, code = ([r[k]["hybrid_over_dspark"] for r in (base, a1, a4)] for k in ("chat", "code-edit"))
    assert chat[0] < chat[1] < chat[2] and code[0] > code[1] > code[2], (chat, code)
    assert chat[0] < 0.9 and min(chat[2], code[2]) >= 1.0, (chat, code)  # with 4, neither kind under DSpark
    # Scope "tenant" (each kind its own tenant here) also lifts chat; on one kind alone it is fairness 0 exactly.
    ten = simulate(recs, dataclasses.replace(opts, fairness=4.0, fairness_scope="tenant"))["ratios_by_kind"]
    assert ten["chat"]["hybrid_over_dspark"] > chat[0], (ten, chat)
    alone = [simulate(recs[0::2], dataclasses.replace(opts, policies=("hybrid",), **kw))["policies"]["hybrid"]
             for kw in ({}, {"fairness": 4.0, "fairness_scope": "tenant"}, {"fairness": 4.0})]
    assert alone[0] == alone[1] != alone[2]
    with pytest.raises(ValueError, match="fairness"):
        simulate(recs, dataclasses.replace(opts, fairness=5.0))
    with pytest.raises(ValueError, match="fairness_scope"):
        simulate(recs, dataclasses.replace(opts, fairness=1.0, fairness_scope="kind"))


@pytest.mark.parametrize("bs,gamma", [(1, 7), (5, 4), (33, 7)])
def test_plan_on_the_triton_kernel_equals_the_reference(kernel_device, bs, gamma):
    """The plan is the selection on the model chains alone; its Triton kernel (what a GPU runs: no scratch memory)
    books exactly what the torch reference books. On CPU under the Triton interpreter; on CUDA in gpu_check.sh."""
    rng = random.Random(bs * 7 + gamma)
    table = _table(rng, bs * (1 + gamma) + 4)
    sps = dense_sps(table, 64 * (1 + gamma))
    fw = {b: FairWeights(num_slots=64, max_bs=64, gamma=gamma, width=gamma, alpha=1.0, sps=sps.to(kernel_device),
                         device=kernel_device, backend=b) for b in ("torch", "triton")}
    for kind in ("random", "ties", "flat"):
        surv = _surv(rng, bs, gamma, kind).to(kernel_device)
        for f in fw.values():
            f.plan(surv)
        a, b = fw["torch"], fw["triton"]
        assert torch.equal(a._plan.view(bs).verify_len, b._plan.view(bs).verify_len)
        assert torch.equal(a._ed[:bs], b._ed[:bs]) and torch.equal(a._td, b._td)
        k, expected, _ = dspark_plan_ref(surv.cpu(), sps)
        assert int(b._plan.view(bs).budget_used) == k
        assert b._ed[:bs].cpu().tolist() == pytest.approx(expected, rel=1e-6)
