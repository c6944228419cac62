"""HYBRID_SPARK on a DSpark drafter inside the real SGLang engine on CPU, against SGLang's own DSPARK.

The losslessness suite of ``test_spec_e2e.py`` (greedy bs 1-8, stop token / string, abort, sampling chi-square)
also runs on ``hybrid_dspark_compact`` (the ragged verify, window 8), under ``SGLANG_HYBRID_SYNC_GUARD=1``. This
module adds what is particular to DSpark:

- greedy output at bs 1, 2 and 4 in the static (16-token chunked prefill) and cap-accept (budgeted verify lengths,
  full window computed) modes;
- with the n-gram drafter off, the outputs, every step's budget and verified tokens (DSpark's own step dump,
  ``SGLANG_DSPARK_DEBUG_DUMP=core``) and every request's verify steps and accept length equal SGLang's DSPARK in
  compact mode: the merge is the identity then. (Per-request verify lengths are not dumped on CPU: DSpark stages
  that component through a device stream into pinned memory. Equal budgets, equal per-step totals and equal
  confidences leave DSpark's top-K allocation no freedom, so the per-request lengths are equal as well.);
- on prompts whose outputs repeat long spans, the n-gram chain is chosen and one step accepts more drafts than
  the DSpark block holds (gamma = 3, window 8), read from the metrics, and the n-gram tail after the block is
  verified on some steps; ``max_new_tokens`` reached inside such a
  chain cuts the output exactly;
- with the cross-request corpus on (``hybrid_dspark_compact`` runs it shared), a request sent again is drafted
  from what the corpus learnt of the first one's output, and stays lossless;
- radix-cache prefix reuse and request-slot reuse stay lossless;
- the overlap scheduler is on.

Tests are ordered so that each engine starts once (the pool keeps two alive).
"""

from __future__ import annotations

from typing import List

import pytest
from e2e_scenarios import (
    check_greedy,
    check_penalised_sampling,
    check_penalties,
    check_retraction,
    hf_greedy,
    penalised_batch,
    repeating_rows,
)
from engine_harness import DSPARK_GAMMA

pytestmark = pytest.mark.e2e

MAX_NEW = 32


def _repeating_rows(prompts, reference) -> List[int]:
    return repeating_rows(prompts, reference, MAX_NEW, n=4)


def _greedy(max_new: int) -> dict:
    return {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}


def _steps(info: dict) -> List[tuple]:
    """From DSpark's step dump: (batch size, budget, verified tokens) of every decode step, in order."""
    return [(r["bs"], r.get("budget"), r["num_verify_tokens"]) for r in info["records"]]


@pytest.mark.parametrize("config, mode", [("hybrid_dspark_static", "static"), ("hybrid_dspark_cap", "cap-accept")])
@pytest.mark.parametrize("bs", [1, 2, 4])
def test_static_and_cap_accept_greedy_equals_reference(engine_pool, prompts, hf_reference, config, mode, bs):
    engine = engine_pool.get(config)
    rows = [5, 2, 8, 4][:bs]  # 40, 17, 28 and 33 tokens: chunked in 16-token pieces in the static config
    sps = [_greedy(16 if i % 2 == 0 else 9) for i in range(bs)]
    # cap-accept weighs tenants against each other: two tenants (cache_salt), and a request with none ("": tenant 0).
    salt = [("chat", "", "code", "chat")[i] for i in range(bs)] if mode == "cap-accept" else None
    outputs = engine.generate([prompts[i] for i in rows], sps, cache_salt=salt)
    check_greedy(outputs, [hf_reference[i] for i in rows], sps)
    info = engine.server_info()
    assert info["disable_overlap_schedule"] is False
    assert info["internal_states"][0]["hybrid_spark"]["verify_mode"] == mode
    # cap-accept runs the fairness weights (engine_harness.py), which also scale DSpark's planner confidences.
    assert info["internal_states"][0]["hybrid_spark"]["fairness"] == (1.0 if mode == "cap-accept" else 0.0)
    assert info["internal_states"][0]["hybrid_spark"]["fairness_scope"] == ("tenant" if mode == "cap-accept" else "")
    hs = info["internal_states"][0]["hybrid_spark"]  # the state's device memory, counted at start-up (memory.py)
    assert hs["device_bytes"] > hs["device_bytes_history"] + 64 * hs["penalty_rows"] > 0, hs


def test_routing_keys_and_salts_name_the_tenants_through_sglang(engine_pool, prompts, hf_reference):
    """cap-accept names tenants by (cache salt, routing key) (tenant_key cache+routing_key): four concurrent
    requests with three distinct pairs are served losslessly and the worker counts three new tenants at prefill,
    so each request's routing key reached the scheduler's Req and the step."""
    engine = engine_pool.get("hybrid_dspark_cap")
    before = engine.server_info()["internal_states"][0]["hybrid_spark"]
    assert before["tenant_key"] == "cache+routing_key"
    rows = [5, 2, 8, 4]
    sps = [_greedy(9) for _ in rows]
    salt = ["rk-a", "rk-a", "", "rk-a"]
    keys = ["rk-chat", "rk-code", "rk-chat", "rk-chat"]  # the first and the last are one tenant
    outputs = engine.generate([prompts[i] for i in rows], sps, cache_salt=salt, routing_key=keys)
    check_greedy(outputs, [hf_reference[i] for i in rows], sps)
    after = engine.server_info()["internal_states"][0]["hybrid_spark"]
    assert after["tenants_seen"] - before["tenants_seen"] == 3, (before["tenants_seen"], after["tenants_seen"])


def test_radix_prefix_reuse_and_slot_reuse_stay_lossless(engine_pool, tiny_models, prompts, hf_reference):
    engine = engine_pool.get("hybrid_dspark_static")
    long = prompts[5]  # 40 tokens, prefilled in 16-token chunks
    first = engine.generate([long], [_greedy(12)])
    check_greedy(first, [hf_reference[5]], [_greedy(12)])
    # Shares the first 32 tokens with `long`: served from the radix cache, into a reused request slot.
    variant = list(long[:32]) + [7, 8, 9, 10]
    ref, _ = hf_greedy(tiny_models.target, variant, 12)
    again = engine.generate([variant, long], [_greedy(12), _greedy(12)])
    check_greedy(again, [ref, hf_reference[5]], [_greedy(12), _greedy(12)])
    assert again[0]["meta_info"].get("cached_tokens", 0) > 0, again[0]["meta_info"]


@pytest.mark.parametrize("config", ["hybrid_dspark_static", "hybrid_dspark_cap"])
def test_penalties_in_the_static_and_cap_accept_verify_modes(engine_pool, prompts, hf_reference, tiny_models,
                                                             config):
    """The same checks in DSpark's other two verify modes: static (a fixed window, chunked prefill) and cap-accept
    (with fairness weights between tenants), whose accept runs through the same ``accept_and_finalize`` the
    penalties wrap. Next to the other static / cap-accept tests, so that their engines start once."""
    check_penalties(engine_pool.get(config), prompts, hf_reference, tiny_models.target, MAX_NEW,
                    min_steps=MAX_NEW // 8)


def test_without_ngram_equals_sglang_dspark_step_by_step(engine_pool, prompts, hf_reference):
    """enable_ngram=false: same outputs and the same per-request verify lengths as DSPARK (compact, SPS table)."""
    rows = [0, 1, 2, 3]
    sps = [_greedy(20) for _ in rows]
    steps, metas = {}, {}
    for name in ("dspark_compact", "hybrid_dspark_compact_no_ngram"):
        engine = engine_pool.get(name)
        outputs = engine.generate([prompts[i] for i in rows], sps)
        check_greedy(outputs, [hf_reference[i] for i in rows], sps)
        state = engine.server_info()["internal_states"][0]
        steps[name] = _steps(state["dspark_info_record"])
        metas[name] = [(o["meta_info"]["spec_verify_ct"], o["meta_info"]["spec_accept_length"]) for o in outputs]
    base, ours = steps["dspark_compact"], steps["hybrid_dspark_compact_no_ngram"]
    assert len(base) > 5 and ours == base, (base, ours)
    assert metas["hybrid_dspark_compact_no_ngram"] == metas["dspark_compact"]
    full = {bs * (DSPARK_GAMMA + 1) for bs, _, _ in base}
    assert any(v not in full for _, _, v in base), f"the SPS budget should trim some steps; saw {base}"


def test_ngram_chain_is_chosen_and_accepts_past_the_dspark_block(engine_pool, prompts, hf_reference):
    rows = _repeating_rows(prompts, hf_reference)
    assert len(rows) >= 2, "the tiny target should repeat itself on some prompts"
    engine = engine_pool.get("hybrid_dspark_compact")  # block 3, window 8
    sps = [_greedy(MAX_NEW) for _ in rows]
    outputs = engine.generate([prompts[i] for i in rows], sps)
    check_greedy(outputs, [hf_reference[i] for i in rows], sps)
    per_req = [o["meta_info"]["hybrid_spark"][-1] for o in outputs]
    assert sum(m["ngram_chosen_steps"] for m in per_req) > 0, per_req
    server = engine.server_info()["internal_states"][0]["hybrid_spark"]
    assert server["drafter"] == "dspark" and server["verify_mode"] == "compact"
    assert (server["model_chain_tokens"], server["verify_window_tokens"]) == (DSPARK_GAMMA, 8), server
    # One request accepted more drafts in one step than the DSpark block holds: more than gamma + 1 tokens.
    assert server["max_accepted_drafts_in_step"] > DSPARK_GAMMA, server
    assert server["accepted_ngram"] > 0 and server["verified_draft_tokens"] > 0, server
    # The n-gram tail after the 3-token block fills the other 4 columns, and the planner verified into it on some
    # steps (the output above is lossless with it; the tiny random drafter's tails are rarely accepted).
    assert server["model_tail_tokens"] == 8 - 1 - DSPARK_GAMMA and server["tail_chosen"] > 0, server
    # This engine warmed the step up at start-up (SGLANG_HYBRID_WARMUP=on): 1, the powers of two, the slot count.
    assert server["warmup_batch_sizes"] >= 2 and server["warmup_max_batch_size"] >= 2, server


@pytest.mark.parametrize("max_new", [3, 5, 6])
def test_max_new_tokens_inside_an_accepted_ngram_chain(engine_pool, prompts, hf_reference, max_new):
    rows = _repeating_rows(prompts, hf_reference)
    engine = engine_pool.get("hybrid_dspark_compact")
    # Warm the history: the same prompts continued past their repeats, then cut at max_new tokens.
    prompts_cut = [list(prompts[i]) + list(hf_reference[i][:12]) for i in rows]
    refs = [list(hf_reference[i][12:]) for i in rows]
    sps = [_greedy(max_new) for _ in rows]
    outputs = engine.generate(prompts_cut, sps)
    check_greedy(outputs, refs, sps)


def test_corpus_drafts_a_request_from_an_earlier_ones_output(engine_pool, prompts, hf_reference):
    """The corpus (shared on this engine) learns each request's output; the same prompts sent again, on requests
    whose own history holds no repeat, get corpus chains, accept more per step, and stay lossless."""
    repeating = set(_repeating_rows(prompts, hf_reference))
    rows = [i for i in range(len(prompts)) if i not in repeating][:4]
    engine = engine_pool.get("hybrid_dspark_compact")
    sps = [_greedy(MAX_NEW) for _ in rows]
    first = engine.generate([prompts[i] for i in rows], sps)
    check_greedy(first, [hf_reference[i] for i in rows], sps)
    before = engine.server_info()["internal_states"][0]["hybrid_spark"]
    second = engine.generate([prompts[i] for i in rows], sps)
    check_greedy(second, [hf_reference[i] for i in rows], sps)
    after = engine.server_info()["internal_states"][0]["hybrid_spark"]
    assert after["corpus_chosen"] > before["corpus_chosen"] and after["accepted_corpus"] > before["accepted_corpus"]
    assert after["price_sps2d"] == 1  # this engine also prices with the 2-D roofline table (SGLANG_HYBRID_SPS2D_TABLE)
    # The corpus's tail after the model chain is on (corpus_tail, the default; the window leaves a 4-token tail).
    assert after["model_tail_tokens"] == 4 and after["corpus_tail_chosen"] >= before["corpus_tail_chosen"] >= 0
    steps = [sum(o["meta_info"]["spec_verify_ct"] for o in out) for out in (first, second)]
    assert steps[1] < steps[0], f"the second round should take fewer verify steps: {steps}"


def test_penalised_requests_equal_plain_decoding_with_their_penalties(engine_pool, prompts, hf_reference,
                                                                      tiny_models):
    """SGLang 0.5.23's DSpark verify applies no frequency / presence / repetition penalty nor ``min_new_tokens``
    after a request's first token; HYBRID_SPARK applies them at every verify position (penalties.py): each
    penalised request's greedy output equals plain decoding's with its penalties, ``min_new_tokens`` holds a stop
    token back, and sampled penalised requests complete (``e2e_scenarios.check_penalties``)."""
    check_penalties(engine_pool.get("hybrid_dspark_compact"), prompts, hf_reference, tiny_models.target, MAX_NEW,
                    min_steps=MAX_NEW // 8)  # window 8: >= 4 steps


def test_penalised_sampling_follows_the_penalised_distribution(engine_pool, tiny_models):
    """Sampling with ``repetition_penalty`` 0.5 follows the exact penalised distribution (chi-square; the test
    rejects the draws without penalties, which SGLang's own DSPARK gives, with power >= 0.9)."""
    check_penalised_sampling(engine_pool.get("hybrid_dspark_compact"), tiny_models)


def test_retracted_requests_come_back_losslessly(engine_pool, prompts, hf_reference):
    """SGLang retracts decoding requests when the KV pool is full (SGLANG_TEST_RETRACT forces it every third step)
    and re-prefills them with prompt plus output so far: outputs stay equal to the reference (e2e_scenarios)."""
    rows = _repeating_rows(prompts, hf_reference)[:2] + [0, 1, 3, 6]
    check_retraction(engine_pool.get("hybrid_dspark_retract"), prompts, hf_reference, rows, MAX_NEW)


def test_without_the_overlap_scheduler_output_stays_lossless(engine_pool, prompts, hf_reference):
    """``--disable-overlap-schedule``: SGLang runs each step's result processing before the next step; the n-gram
    chains are still chosen and the output equals the reference."""
    rows = _repeating_rows(prompts, hf_reference)[:2] + [0, 1, 3]
    engine = engine_pool.get("hybrid_dspark_no_overlap")
    sps = [_greedy(MAX_NEW) for _ in rows]
    outputs = engine.generate([prompts[i] for i in rows], sps)
    check_greedy(outputs, [hf_reference[i] for i in rows], sps)
    info = engine.server_info()
    assert info["disable_overlap_schedule"] is True
    assert info["internal_states"][0]["hybrid_spark"]["ngram_chosen"] > 0


def test_penalties_without_overlap_and_beyond_the_table(engine_pool, prompts, hf_reference, tiny_models):
    """Without the overlap scheduler (SGLang then hands the verify its penalizer, whose counts DSpark never feeds)
    the penalties are applied once, as with it; and with option ``penalty_rows`` 2, two of the four penalised
    requests get rows and equal their penalised references, the others are refused (counted, warned) and decode
    unpenalised (the logit bias kept), as SGLang's DSpark does."""
    engine = engine_pool.get("hybrid_dspark_no_overlap")
    outputs, penalised, plain, before, after = penalised_batch(engine, prompts, hf_reference, tiny_models.target,
                                                               MAX_NEW, [5])
    got = [o["output_ids"] for o in outputs]
    assert sum(g == p for g, p in zip(got, penalised)) == 2 and sum(g == p for g, p in zip(got, plain)) == 2, got
    assert after["penalty_rows"] == 2 and after["penalty_rows_refused"] - before["penalty_rows_refused"] == 2
    assert after["penalty_steps_unapplied"] > before["penalty_steps_unapplied"]
    assert after["penalty_steps"] > before["penalty_steps"]
