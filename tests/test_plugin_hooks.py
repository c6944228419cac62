"""The host-API declarations match the installed SGLang, and every override the plugin makes is declared."""

import inspect

import pytest

from sglang_hybrid.sglang_plugin import hooks


def test_declared_host_api_matches_installed_sglang():
    assert hooks.check_host_api() == []


def test_a_changed_host_api_is_reported(monkeypatch):
    bad = hooks.HostAttr("sglang.srt.speculative.eagle_worker_v2:EAGLEWorkerV2.verify", ("self", "renamed_batch"))
    gone = hooks.HostAttr("sglang.srt.speculative.eagle_worker_v2:NoSuchWorker.verify", ("self",))
    monkeypatch.setattr(hooks, "HOST_ATTRS", hooks.HOST_ATTRS + (bad, gone))
    problems = hooks.check_host_api()
    assert any("renamed_batch" in p for p in problems)
    assert any("NoSuchWorker" in p and "missing" in p for p in problems)


def test_a_renamed_tenant_field_of_req_is_reported(monkeypatch):
    """tenant_id reads Req's extra_key / cache_salt / routing_key with getattr: a rename must fail the check, not
    make every request tenant 0."""
    monkeypatch.setattr(hooks, "REQ_TENANT_FIELDS", hooks.REQ_TENANT_FIELDS + ("tenant_label",))
    assert any("Req.__init__ lacks parameters ['tenant_label']" in p for p in hooks.check_host_api())


def test_a_renamed_penalty_field_of_sampling_batch_info_or_params_is_reported(monkeypatch):
    """The DSpark worker reads SamplingBatchInfo.logit_bias and SamplingParams' penalties by name: a rename must fail
    the check at load, not silently drop a request's penalties."""
    monkeypatch.setattr(hooks, "SAMPLING_PENALTY_FIELDS", hooks.SAMPLING_PENALTY_FIELDS + ("acc_linear_penalties",))
    monkeypatch.setattr(hooks, "SAMPLING_PARAMS_PENALTY_FIELDS",
                        hooks.SAMPLING_PARAMS_PENALTY_FIELDS + ("typical_penalty",))
    problems = hooks.check_host_api()
    assert any("SamplingBatchInfo lacks fields ['acc_linear_penalties']" in p for p in problems)
    assert any("SamplingParams lacks fields ['typical_penalty']" in p for p in problems)


def _declared_names():
    return {a.target.split(":")[1].split(".")[-1] for a in hooks.HOST_ATTRS}


def _own_methods(cls):
    return {n: f for n, f in vars(cls).items() if inspect.isfunction(f) and not n.startswith("__")}


def test_every_algo_override_is_an_sglang_method_with_the_same_parameters():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    from sglang_hybrid.sglang_plugin.algo import HybridSparkAlgo

    declared = _declared_names()
    for name, fn in _own_methods(HybridSparkAlgo).items():
        if name.startswith("_"):
            continue  # private helpers of ours
        base = getattr(CustomSpecAlgo, name, None) or getattr(SpeculativeAlgorithm, name, None)
        assert base is not None, f"HybridSparkAlgo.{name} overrides nothing in SGLang"
        ours = list(inspect.signature(fn).parameters)
        theirs = list(inspect.signature(base).parameters)
        assert ours == theirs, f"HybridSparkAlgo.{name}{ours} != SGLang {theirs}"
        if not (name.startswith("is_") or name.startswith("supports_") or name == "has_draft_kv"):
            # Predicates are checked by SGLang's own conformance test; everything else must be declared.
            assert name in declared, f"HybridSparkAlgo.{name} is not declared in hooks.HOST_ATTRS"


def test_every_worker_override_is_declared_with_the_same_parameters():
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    from sglang_hybrid.sglang_plugin.worker import HybridMixin

    declared = _declared_names()
    for name, fn in _own_methods(HybridMixin).items():
        base = getattr(EAGLEWorkerV2, name, None)
        if base is None:
            assert name.startswith("_hybrid") or name.startswith("hybrid"), f"unexpected new method {name}"
            continue
        assert name in declared, f"HybridMixin.{name} overrides EAGLEWorkerV2.{name} but is not declared"
        assert list(inspect.signature(fn).parameters) == list(inspect.signature(base).parameters)


@pytest.mark.parametrize("name", ["create_future_map", "need_topk", "carries_draft_hidden_states",
                                  "get_platform_worker_cls", "build_disagg_draft_input"])
def test_methods_customspecalgo_lacks_are_provided(name):
    from sglang_hybrid.sglang_plugin.algo import HybridSparkAlgo

    assert name in vars(HybridSparkAlgo)


def test_every_dspark_worker_override_is_declared_with_the_same_parameters():
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    from sglang_hybrid.sglang_plugin.dspark_worker import HybridDSparkWorker

    declared = _declared_names()
    overrides = [n for n in _own_methods(HybridDSparkWorker) if getattr(DSparkWorkerV2, n, None) is not None]
    assert {"_forward_decode", "_forward_prefill", "alloc_memory_pool"} <= set(overrides)
    for name in overrides:
        assert name in declared, f"HybridDSparkWorker.{name} overrides DSparkWorkerV2.{name} but is not declared"
        ours = list(inspect.signature(getattr(HybridDSparkWorker, name)).parameters)
        assert ours == list(inspect.signature(getattr(DSparkWorkerV2, name)).parameters), name
    for name in _own_methods(HybridDSparkWorker):
        assert name in overrides or name.startswith("_hybrid") or name.startswith("hybrid") or name == "_one_hot_ngram_rows"
    init = list(inspect.signature(HybridDSparkWorker.__init__).parameters)
    assert init == list(inspect.signature(DSparkWorkerV2.__init__).parameters)


def test_dspark_algo_answers_as_sglangs_dspark(monkeypatch):
    """For a DSpark draft, every predicate SGLang dispatches DSPARK on gives DSPARK's answer."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_hybrid.sglang_plugin.algo import HybridSparkAlgo

    algo = HybridSparkAlgo("HYBRID_SPARK", lambda a: None, supports_overlap=True)
    algo._resolved_kind = "dspark"
    ref = SpeculativeAlgorithm.DSPARK
    for name in ("is_dspark", "is_dflash_family", "is_eagle", "is_eagle3", "is_standalone", "is_ngram",
                 "supports_ragged_verify", "supports_target_verify_for_draft", "supports_prefill_shared_read_done",
                 "need_topk", "carries_draft_hidden_states", "has_draft_kv", "supports_grammar_overlap"):
        assert getattr(algo, name)() == getattr(ref, name)(), name
    for n in (4, 9):
        for is_draft in (True, False):
            assert algo.get_num_tokens_per_req_for_target_verify(n, is_draft) == \
                ref.get_num_tokens_per_req_for_target_verify(n, is_draft)
    algo._resolved_kind = "standalone"
    assert not algo.is_dspark() and algo.need_topk()


def test_carries_penalties_reads_which_tensors_exist_and_the_penalizer_flag():
    """The workers loop over a batch's requests for penalties only when this host check says a penalizer is on: the overlap scheduler's accumulated tensors exist, or the penalizer's flag (without overlap)."""
    from types import SimpleNamespace

    import torch

    from sglang_hybrid.sglang_plugin.penalty_glue import carries_penalties

    none = dict(acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=torch.zeros(1, 4),
                penalizer_orchestrator=None)
    assert not carries_penalties(None) and not carries_penalties(SimpleNamespace(**none))  # a bias alone: no
    for field in hooks.SAMPLING_PENALTY_FIELDS:
        assert carries_penalties(SimpleNamespace(**dict(none, **{field: torch.zeros(1, 4)})))
    assert carries_penalties(SimpleNamespace(**dict(none, penalizer_orchestrator=SimpleNamespace(is_required=True))))
    assert not carries_penalties(SimpleNamespace(**dict(none, penalizer_orchestrator=SimpleNamespace(is_required=False))))
