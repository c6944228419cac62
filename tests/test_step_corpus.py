"""HybridStep with the cross-request corpus: a request gets continuations an earlier request produced."""

import pytest
import torch

from sglang_hybrid.config import HybridConfig, HybridConfigError
from sglang_hybrid.step import HostSyncError, HybridStep, sync_guard
from tests.alloc_probe import profile_call, tagged

GAMMA = 4
PHRASE = list(range(200, 212))  # what an earlier request produced (three times)


def _step(**cfg):
    cfg.setdefault("corpus_entries", 1 << 12)
    return HybridStep(HybridConfig(**cfg), num_slots=8, width=256, gamma=GAMMA, max_bs=4, device="cpu")


def _prefill(step, slots, rows, tenant=None):
    p = max(len(r) for r in rows)
    prompt = torch.zeros(len(rows), p, dtype=torch.int32)
    for i, r in enumerate(rows):
        prompt[i, : len(r)] = torch.tensor(r)
    lens = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    first = torch.tensor([r[-1] for r in rows], dtype=torch.int32)
    step.on_prefill(slots, prompt[:, :-1], lens - 1, first, tenant)


def _earlier_request(step, slot=0, tenant=None):
    """Request A on ``slot`` commits PHRASE three times (fresh tokens between), GAMMA + 1 tokens per step."""
    slots = torch.tensor([slot])
    _prefill(step, slots, [[1, 2, 3]], tenant)
    out = []
    for rep in range(3):
        out += PHRASE + [300 + rep, 310 + rep]
    model = torch.tensor([[90, 91, 92, 93]], dtype=torch.int32)
    for i in range(0, len(out), GAMMA + 1):
        chunk = out[i: i + GAMMA + 1]
        committed = torch.zeros(1, GAMMA + 1, dtype=torch.int32)
        committed[0, : len(chunk)] = torch.tensor(chunk)
        prop = step.propose(slots, model)
        step.record(slots, prop, committed, torch.tensor([len(chunk)], dtype=torch.int32))


def _later_request(step, slot=5, tenant=None):
    """Request B on another slot: a fresh prompt ending with PHRASE[:6]; its own history never continues it."""
    slots = torch.tensor([slot])
    _prefill(step, slots, [[400, 401, 402, 403] + PHRASE[:6]], tenant)
    model = torch.tensor([[90, 91, 92, 93]], dtype=torch.int32)
    return step.propose(slots, model)


def test_a_later_request_gets_the_earlier_requests_continuation_from_the_corpus():
    step = _step(corpus="shared", model_prior=0.3)
    _earlier_request(step)
    prop = _later_request(step)
    assert int(step.corpus_cand.pick[0]) == 1  # the corpus candidate beat the (empty) own-history one
    assert prop.choice.tolist() == [1]  # and the selection took it over the model chain
    n = int(prop.verify_len[0])
    assert n >= 2
    assert prop.tokens[0, :n].tolist() == PHRASE[6: 6 + n]
    committed = torch.zeros(1, GAMMA + 1, dtype=torch.int32)
    committed[0, :3] = torch.tensor(PHRASE[6:8] + [999])  # two drafts accepted, then the bonus token
    before = step.metrics()
    step.record(torch.tensor([5]), prop, committed, torch.tensor([3], dtype=torch.int32))
    m = step.metrics()
    assert (m["corpus_chosen"] - before["corpus_chosen"], m["accepted_corpus"] - before["accepted_corpus"]) == (1, 2)
    assert m["corpus_entries"] == 1 << 12


def test_without_the_corpus_the_later_request_gets_no_ngram_chain():
    step = _step(corpus="off", model_prior=0.3)
    assert step.corpus is None
    _earlier_request(step)
    prop = _later_request(step)
    assert prop.choice.tolist() == [0]
    assert prop.tokens[0, :GAMMA].tolist() == [90, 91, 92, 93]


def test_tenant_isolation_keeps_one_tenants_text_from_another():
    t1, t2 = torch.tensor([7], dtype=torch.int32), torch.tensor([9], dtype=torch.int32)
    other = _step(corpus="tenant", model_prior=0.3)
    _earlier_request(other, tenant=t1)
    assert _later_request(other, tenant=t2).choice.tolist() == [0]
    same = _step(corpus="tenant", model_prior=0.3)
    _earlier_request(same, tenant=t1)
    assert _later_request(same, tenant=t1).choice.tolist() == [1]


def test_an_empty_corpus_changes_nothing_bit_for_bit():
    """Until the corpus has learnt something the step equals the corpus-off step exactly (the same chains,
    lengths, survivals and selection); and 'off' builds no corpus at all (the pre-corpus code path)."""
    torch.manual_seed(0)
    a, b = _step(corpus="off"), _step(corpus="shared")
    slots = torch.tensor([0, 1, 2])
    rows = [list(range(10, 40)) + list(range(10, 16)), list(range(50, 70)) * 2, list(range(90, 99))]
    _prefill(a, slots, rows)
    _prefill(b, slots, rows)
    model = torch.randint(3, 100, (3, GAMMA), dtype=torch.int32)
    conf = torch.rand(3, GAMMA)
    pa, pb = a.propose(slots, model, model_confidence=conf), b.propose(slots, model, model_confidence=conf)
    for f in ("tokens", "verify_len", "choice", "survival"):
        assert torch.equal(getattr(pa, f), getattr(pb, f)), f
    assert torch.equal(a.ngram_surv, b.ngram_surv) and torch.equal(a._ngram_len, b._ngram_len)


def test_propose_and_record_with_the_corpus_make_no_host_sync(monkeypatch):
    monkeypatch.setenv("SGLANG_HYBRID_SYNC_GUARD", "1")
    step = _step(corpus="shared")
    slots = torch.tensor([0, 1])
    _prefill(step, slots, [[1, 2, 3, 1, 2], [4, 5, 6, 4, 5]])
    for _ in range(2):
        prop = step.propose(slots, torch.zeros(2, GAMMA, dtype=torch.int32))
        step.record(slots, prop, torch.arange(2 * (GAMMA + 1), dtype=torch.int32).view(2, -1),
                    torch.tensor([3, 1], dtype=torch.int32))
    with pytest.raises(HostSyncError):
        with sync_guard(True):
            torch.ones(1).item()


def test_corpus_options_are_validated_and_read_from_the_environment():
    with pytest.raises(HybridConfigError, match="corpus"):
        HybridConfig(corpus="global").validate()
    with pytest.raises(HybridConfigError, match="corpus_entries"):
        HybridConfig(corpus_entries=1000).validate()
    cfg = HybridConfig.from_env({"SGLANG_HYBRID_CORPUS": "tenant", "SGLANG_HYBRID_CORPUS_ENTRIES": "4096"})
    assert (cfg.corpus, cfg.corpus_entries) == ("tenant", 4096)


def test_tenant_id_is_the_prefix_cache_key():
    from types import SimpleNamespace

    from sglang_hybrid.sglang_plugin.common import tenant_id

    assert tenant_id(SimpleNamespace(extra_key=None, cache_salt=None)) == 0
    a = tenant_id(SimpleNamespace(extra_key="acme", cache_salt=None))
    assert a == tenant_id(SimpleNamespace(extra_key="acme", cache_salt=""))
    assert a != tenant_id(SimpleNamespace(extra_key="other", cache_salt=None)) and 0 < a < 2**31


@pytest.mark.parametrize("corpus_tail", [True, False])
def test_the_corpus_path_allocates_nothing_outside_the_kernels(monkeypatch, corpus_tail):
    """As tests/test_step.py's allocation test, with the corpus on (its Triton lookup and insert under the
    interpreter, tagged like the other kernels): no tensor is allocated outside a kernel launch, with and without
    the corpus's tail after the model chain."""
    import os

    from sglang_hybrid import step as step_mod

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py before triton is imported)")
    monkeypatch.setenv("SGLANG_HYBRID_SYNC_GUARD", "1")
    s = HybridStep(HybridConfig(corpus="shared", corpus_entries=1 << 10, corpus_tail=corpus_tail), num_slots=8,
                   width=128, gamma=GAMMA, max_bs=4, device="cpu", verify_window=8, kernel_backend="triton")
    assert (s.ctail is not None) == corpus_tail

    s.history._lookup, s.history._append = tagged(s.history._lookup), tagged(s.history._append)
    s.history._stash, s.history._restore = tagged(s.history._stash), tagged(s.history._restore)
    s.history._probe = tagged(s.history._probe)
    s.corpus_cand._choose, s.tail._choose = tagged(s.corpus_cand._choose), tagged(s.tail._choose)
    s.tail._flags = tagged(s.tail._flags)  # the tail's after-verify flags
    for cc in (s.corpus_cand.counters, s.tail.counters) + ((s.ctail.counters,) if corpus_tail else ()):
        assert cc.backend == "triton"
        cc._add = tagged(cc._add)  # the chains' counters
    s.corpus._lookup, s.corpus._insert = tagged(s.corpus._lookup), tagged(s.corpus._insert)
    s.calib_dev._fn = tagged(s.calib_dev._fn)
    s.online.deferred._elems = tagged(s.online.deferred._elems)
    for rec in (s.online, s.tail.online, s.corpus_cand.online) + ((s.ctail.online,) if corpus_tail else ()):
        rec._apply_kernel, rec._update_elems = tagged(rec._apply_kernel), tagged(rec._update_elems)
    ag = s.agreement  # the model-agreement kernels
    ag._apply_elems, ag._share_elems, ag._update_elems = (tagged(ag._apply_elems), tagged(ag._share_elems),
                                                         tagged(ag._update_elems))
    s.stats._elems, s.stats._reduce = tagged(s.stats._elems), tagged(s.stats._reduce)  # the counters' kernels
    for tab in (s.corpus_cand.table,) + ((s.ctail.table,) if corpus_tail else ()):  # the fitted table's kernel
        assert tab.backend == "triton"
        tab._price = tagged(tab._price)
    monkeypatch.setattr(step_mod, "select_chains", tagged(step_mod.select_chains))
    slots = torch.tensor([0, 1, 2])
    _prefill(s, slots, [list(range(10, 40)) + list(range(10, 14)), list(range(50, 80)), list(range(90, 99)) * 3])
    model = torch.randint(3, 100, (3, GAMMA), dtype=torch.int32)
    conf = torch.rand(3, GAMMA)
    committed = torch.randint(3, 100, (3, 9), dtype=torch.int32)
    accept = torch.tensor([3, 1, 5], dtype=torch.int32)

    def one_step():
        p = s.propose(slots, model, model_confidence=conf)
        s.record(slots, p, committed, accept)

    one_step()
    launches, outside = profile_call(one_step)
    # lookup, corpus lookup, calibration, the n-gram's and the corpus's online apply, selection, append, corpus
    # insert, deferred scoring, the corpus's online update, and the model chain's tail (stash, append, lookup, restore,
    # calibration, online apply and update; with the corpus's tail, its corpus lookup, online apply and update),
    # the model agreement's apply (both candidates), share and update, the counters' two kernels, the
    # corpus's fitted table (the candidate's; with the corpus's tail, its own), and the choice between the n-gram
    # and the corpus (with the corpus's tail, between the two tails too), and the chain counters of the corpus
    # candidate and the tail (with the corpus's tail, its own), and the tail's after-verify flags; and the echo's
    # probe kernel (3 points)
    assert s.echo.points == (1, 2, 3)
    assert launches == 28 + 6 * corpus_tail + 1
    assert outside == [], outside


def test_prefill_gives_each_slot_its_requests_tenant():
    """What the workers call at prefill: in 'tenant' mode each slot gets its request's tenant id."""
    from sglang_hybrid.sglang_plugin.common import tenant_id
    from tests.prefill_stub import prefill_stub_requests

    step = _step(corpus="tenant")
    step.slot_tenant.fill_(-1)
    reqs = prefill_stub_requests(step, [6, 2], [("acme", None), (None, None)])
    assert step.slot_tenant[[6, 2]].tolist() == [tenant_id(reqs[0]), 0] and tenant_id(reqs[0]) != 0
    assert step.history.lens[[6, 2]].tolist() == [4, 4]


def _tail_step(**cfg):
    """A step whose chains are wider than the model chain (verify window 10, gamma 4), so a tail fits after it."""
    cfg.setdefault("corpus_entries", 1 << 12)
    return HybridStep(HybridConfig(corpus="shared", **cfg), num_slots=8, width=256, gamma=GAMMA, max_bs=4,
                      device="cpu", verify_window=10)


def _chain_request(step, slot=5):
    """Request B: a fresh prompt, then a model chain that drafts PHRASE[:GAMMA] with high confidence; neither its
    history nor the corpus at its context says anything, but the corpus knows what follows the chain."""
    slots = torch.tensor([slot])
    _prefill(step, slots, [[400, 401, 402, 403, 404]])
    model = torch.tensor([PHRASE[:GAMMA]], dtype=torch.int32)
    conf = torch.full((1, GAMMA), 0.95)
    return slots, model, conf, step.propose(slots, model, model_confidence=conf)


def test_the_corpus_tail_continues_the_model_chain_with_what_the_corpus_knows():
    step = _tail_step(model_prior=0.9)
    assert step.ctail is not None and step.tail is not None
    _earlier_request(step)
    slots, model, conf, prop = _chain_request(step)
    t = step.tail.tail
    assert bool(step.tail._pick[0])  # the corpus's tail beat the (empty) n-gram tail
    assert prop.choice.tolist() == [0]  # the model chain, extended
    n = int(prop.verify_len[0])
    assert n > GAMMA
    assert prop.tokens[0, :n].tolist() == PHRASE[:n]
    # The planner reads the chosen tail's per-token estimates past the model chain.
    out = torch.zeros(1, GAMMA + t)
    pc = step.planner_confidence(prop, torch.cat([conf, torch.zeros(1, t)], 1), out)
    assert torch.equal(pc[0, GAMMA:], step.ctail.q[0, :t]) and float(pc[0, GAMMA]) > 0
    # Verify: the whole model chain and two tail tokens accepted, then the bonus token.
    committed = torch.zeros(1, 10, dtype=torch.int32)
    committed[0, : GAMMA + 3] = torch.tensor(PHRASE[: GAMMA + 2] + [999])
    before = step.metrics()
    e0 = float(step.ctail.online.observed[5].sum() + step.ctail.online.expected[5].sum())
    step.record(slots, prop, committed, torch.tensor([GAMMA + 3], dtype=torch.int32))
    m = step.metrics()
    assert (m["corpus_tail_chosen"] - before["corpus_tail_chosen"],
            m["accepted_corpus_tail"] - before["accepted_corpus_tail"]) == (1, 2)
    assert (m["tail_chosen"] - before["tail_chosen"], m["accepted_tail"] - before["accepted_tail"]) == (1, 2)
    # Its record was scored (two accepted, the third tried and failed).
    assert float(step.ctail.online.observed[5].sum() + step.ctail.online.expected[5].sum()) > e0


def test_without_the_corpus_tail_the_chain_ends_with_the_model_chain():
    step = _tail_step(model_prior=0.9, corpus_tail=False)
    assert step.ctail is None and step.tail is not None
    _earlier_request(step)
    _, _, _, prop = _chain_request(step)
    n = int(prop.verify_len[0])
    assert prop.choice.tolist() == [0] and n <= GAMMA
    assert "corpus_tail_chosen" not in step.metrics()


def test_the_corpus_tail_is_not_scored_where_the_model_chain_failed():
    step = _tail_step(model_prior=0.9)
    _earlier_request(step)
    slots, _, _, prop = _chain_request(step)
    before = (step.ctail.online.observed.clone(), step.ctail.online.expected.clone())
    committed = torch.zeros(1, 10, dtype=torch.int32)
    committed[0, :3] = torch.tensor(PHRASE[:2] + [999])  # the model chain parts at its third token
    step.record(slots, prop, committed, torch.tensor([3], dtype=torch.int32))
    assert torch.equal(step.ctail.online.observed, before[0])
    assert torch.equal(step.ctail.online.expected, before[1])
