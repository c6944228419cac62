"""Option ``tenant_key``: which fields of an SGLang request name its tenant, for the corpus's ``tenant`` isolation
and ``fairness_scope`` ``tenant`` (``sglang_plugin/common.py: tenant_id``), and the metrics that show it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_hybrid import step as step_mod
from sglang_hybrid.config import TENANT_KEYS, HybridConfig, HybridConfigError
from sglang_hybrid.selection import SpsTable, dense_sps
from sglang_hybrid.sglang_plugin.common import tenant_id
from sglang_hybrid.step import HybridStep
from tests.prefill_stub import prefill_stub_requests

SPS = SpsTable(tuple(range(1, 65)), tuple(1000.0 * min(1.0, 8.0 / b) for b in range(1, 65)), 64)


def _req(extra_key=None, cache_salt=None, routing_key=None):
    return SimpleNamespace(extra_key=extra_key, cache_salt=cache_salt, routing_key=routing_key)


def _step(**cfg) -> HybridStep:
    return HybridStep(HybridConfig(**cfg), num_slots=6, width=64, gamma=3, max_bs=4, device="cpu",
                      sps_dense=dense_sps(SPS, 64))


def test_the_option_is_validated_and_read_from_the_environment():
    assert HybridConfig().tenant_key == "cache"
    with pytest.raises(HybridConfigError, match="tenant_key"):
        HybridConfig(tenant_key="user").validate()
    for key in TENANT_KEYS:
        assert HybridConfig.from_env({"SGLANG_HYBRID_TENANT_KEY": key}).tenant_key == key


def test_each_key_reads_its_own_fields():
    plain, salted, routed, both = _req(), _req(cache_salt="acme"), _req(routing_key="chat"), \
        _req(cache_salt="acme", routing_key="chat")
    # "cache" (the default; the prefix cache's key): the routing key is not read.
    assert tenant_id(plain) == tenant_id(routed) == 0
    assert tenant_id(salted) == tenant_id(both) == tenant_id(salted, "cache") != 0
    # "routing_key": the cache salt is not read, so a traffic class needs no salted prefix cache.
    assert tenant_id(plain, "routing_key") == tenant_id(salted, "routing_key") == 0
    assert tenant_id(routed, "routing_key") == tenant_id(both, "routing_key") != 0
    assert tenant_id(routed, "routing_key") != tenant_id(_req(routing_key="code"), "routing_key")
    # Both: one tenant per (extra_key, cache_salt, routing_key); none of them set is tenant 0.
    ids = {tenant_id(r, "cache+routing_key") for r in (salted, routed, both, _req(extra_key="acme"))}
    assert len(ids) == 4 and 0 not in ids and all(0 < t < 2**31 for t in ids)
    assert tenant_id(plain, "cache+routing_key") == 0
    # A routing key equal to a salt does not collide with it (the fields keep their places in the hash).
    assert tenant_id(_req(cache_salt="x"), "cache+routing_key") != tenant_id(_req(routing_key="x"), "cache+routing_key")


@pytest.mark.parametrize("key", TENANT_KEYS)
def test_prefill_hands_the_keyed_tenant_to_the_step_and_counts_tenants(key):
    """Through the workers' prefill hook (fairness between tenants, corpus off): each slot's tenant id is the one
    ``tenant_key`` names, and ``tenants_seen`` counts the distinct ones."""
    step = _step(fairness=1.0, fairness_scope="tenant", tenant_key=key)
    assert step.tracks_tenant and step.metrics()["tenants_seen"] == 0
    tenants = [(None, "acme", "chat"), (None, "acme", "code"), (None, None, "chat"), (None, None, None)]
    reqs = prefill_stub_requests(step, [5, 0, 3, 1], tenants)
    ids = [tenant_id(r, key) for r in reqs]
    assert step.slot_tenant[[5, 0, 3, 1]].tolist() == ids
    m = step.metrics()
    assert m["tenant_key"] == key and m["tenants_seen"] == len(set(ids))
    assert m["tenants_seen"] == {"cache": 2, "routing_key": 3, "cache+routing_key": 4}[key]
    prefill_stub_requests(step, [2], [(None, "acme", "chat")])  # a tenant seen before is not counted again
    assert step.metrics()["tenants_seen"] == m["tenants_seen"]


def test_tenants_seen_stays_bounded(monkeypatch):
    monkeypatch.setattr(step_mod, "TENANTS_TRACKED", 3)
    step = _step(fairness=1.0, fairness_scope="tenant", tenant_key="routing_key")
    step.note_tenants(range(10))
    step.note_tenants([11, 12])
    assert step.metrics()["tenants_seen"] == 3


def test_without_a_reader_of_tenants_the_key_is_unused_and_said_so(caplog):
    with caplog.at_level("WARNING", logger="sglang_hybrid"):
        step = _step(tenant_key="routing_key")
    assert not step.tracks_tenant
    assert "tenant_key=routing_key has no effect" in caplog.text
    prefill_stub_requests(step, [0], [(None, None, "chat")])  # nothing read, nothing counted
    m = step.metrics()
    assert (m["tenant_key"], m["tenants_seen"]) == ("", 0)
    assert step.slot_tenant.tolist() == [0] * 6


def test_a_corpus_isolated_by_routing_key_alone_warns(caplog):
    with caplog.at_level("WARNING", logger="sglang_hybrid"):
        _step(corpus="tenant", corpus_entries=1 << 10, tenant_key="routing_key")
    assert "isolates the corpus by routing key only" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="sglang_hybrid"):
        step = _step(corpus="tenant", corpus_entries=1 << 10, tenant_key="cache+routing_key")
    assert "routing key only" not in caplog.text and "has no effect" not in caplog.text
    reqs = prefill_stub_requests(step, [4, 2], [(None, "acme", "chat"), (None, "other", "chat")])
    assert step.slot_tenant[[4, 2]].tolist() == [tenant_id(r, "cache+routing_key") for r in reqs]
    assert len(set(step.slot_tenant[[4, 2]].tolist())) == 2  # one routing key, two cache tenants: kept apart
