"""HYBRID_SPARK inside the real SGLang engine on CPU: the n-gram chain is chosen where the output repeats,
accepts several tokens there, and the output stays identical to the HF greedy reference.

The losslessness suite of ``test_spec_e2e.py`` runs on the ``hybrid_spark_*`` configurations too (they are in
``engine_harness.LOSSLESS_SPEC_CONFIGS``), with ``SGLANG_HYBRID_SYNC_GUARD=1``: any host read of tensor data
inside the HYBRID_SPARK decode step raises, so those runs also prove the step never synchronises.
"""

from __future__ import annotations

from typing import List

import pytest
from e2e_scenarios import check_greedy, check_penalised_sampling, check_penalties, check_retraction, repeating_rows

pytestmark = pytest.mark.e2e

MAX_NEW = 40


def _repeating_prompts(prompts: List[List[int]], reference: List[List[int]]) -> List[int]:
    return repeating_rows(prompts, reference, MAX_NEW)


@pytest.mark.parametrize("config", ["hybrid_spark_standalone", "hybrid_spark_ngram_only", "hybrid_spark_wide"])
def test_ngram_chain_is_chosen_on_repeats_and_accepts_several_tokens(engine_pool, prompts, hf_reference, config):
    rows = _repeating_prompts(prompts, hf_reference)
    assert len(rows) >= 2, "the tiny target should repeat itself on some prompts"
    input_ids = [prompts[i] for i in rows]
    sps = [{"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True} for _ in rows]
    engine = engine_pool.get(config)
    outputs = engine.generate(input_ids, sps)
    check_greedy(outputs, [hf_reference[i] for i in rows], sps)
    per_req = [o["meta_info"]["hybrid_spark"][-1] for o in outputs]
    ngram_steps = sum(m["ngram_chosen_steps"] for m in per_req)
    accepted = sum(m["accepted_ngram"] for m in per_req)
    assert ngram_steps > 0, per_req
    # Accept length on n-gram steps (accepted drafts + the bonus token) exceeds 1.
    assert (accepted + ngram_steps) / ngram_steps > 1.0, per_req
    server = engine.server_info()["internal_states"][0]["hybrid_spark"]
    assert server["ngram_chosen"] >= ngram_steps and server["accepted_ngram"] >= accepted
    assert 0.0 <= server["ngram_win_rate"] <= 1.0 and server["mean_accept_length"] >= 1.0
    # the state's device memory, counted at start-up (memory.py); the token history is part of it
    assert server["device_bytes"] > server["device_bytes_history"] > 0, server
    if config == "hybrid_spark_wide":
        # 2 model draft steps, a verify window of 8: n-gram steps accepting more than 2 drafts on average
        # means some n-gram chain was verified and accepted past the model chain's length.
        steps = 2
        assert accepted / ngram_steps > steps, per_req
        assert server["proposed_ngram"] > steps * server["ngram_chosen"], server
        assert (server["model_chain_tokens"], server["verify_window_tokens"]) == (steps, 8), server
        # warmed up at start-up (SGLANG_HYBRID_WARMUP=on for this engine), and served losslessly after it
        assert server["warmup_batch_sizes"] >= 2 and server["warmup_max_batch_size"] >= 2, server
    else:
        assert "warmup_batch_sizes" not in server, server  # the default (auto) warms up on a GPU only


def test_penalised_requests_equal_plain_decoding_with_their_penalties(engine_pool, prompts, hf_reference,
                                                                      tiny_models):
    """On an EAGLE-family draft SGLang applies penalties "relaxed" (the output's counts at every position of the
    window, one output token counted a step: README, Limits); HYBRID_SPARK takes them over on the rows it holds a
    penalty row for and applies them exactly at every verify position (penalties.py), so each penalised request's
    greedy output equals plain decoding's with its penalties, ``min_new_tokens`` included, on the 8-token window
    (``e2e_scenarios.check_penalties``)."""
    check_penalties(engine_pool.get("hybrid_spark_wide"), prompts, hf_reference, tiny_models.target, 32,
                    min_steps=32 // 8)


def test_penalised_sampling_follows_the_penalised_distribution(engine_pool, tiny_models):
    """Sampling with ``repetition_penalty`` 0.5 on the wide window follows the exact penalised distribution."""
    check_penalised_sampling(engine_pool.get("hybrid_spark_wide"), tiny_models)


def _narrow_steps_by_batch(engine, batch_sizes, prompts, hf_reference):
    """Greedy batches of the given sizes, each checked against HF; the server's cumulative narrow-window step
    count after each, and its last metrics."""
    narrow = []
    for bs in batch_sizes:
        rows = list(range(bs))
        sps = [{"temperature": 0, "max_new_tokens": 24, "ignore_eos": True} for _ in rows]
        outputs = engine.generate([prompts[i] for i in rows], sps)
        check_greedy(outputs, [hf_reference[i] for i in rows], sps)
        server = engine.server_info()["internal_states"][0]["hybrid_spark"]
        narrow.append(server["narrow_window_steps"])
    return narrow, server


def test_auto_narrow_threshold_comes_from_the_sps_table_and_stays_lossless(engine_pool, prompts, hf_reference):
    """hybrid_spark_auto_narrow: SGLANG_HYBRID_NARROW_ABOVE=auto with a steep SPS table. At the model chain's prior
    acceptance the 8-token window does not pay above one request (auto_narrow_above gives 1), so a single request
    verifies wide and a batch of 4 starts narrow; the metrics report the threshold and both estimates."""
    engine = engine_pool.get("hybrid_spark_auto_narrow")
    narrow, server = _narrow_steps_by_batch(engine, (1, 4), prompts, hf_reference)
    assert server["narrow_above_auto"] == 1 and server["narrow_above"] >= 1, server
    assert narrow[0] == 0 and narrow[1] > 0, narrow
    assert server["accept_per_step_wide"] >= 1.0 and server["accept_per_step_narrow"] >= 1.0, server
    assert server["verify_window_tokens"] == 8, server


def test_window_narrows_above_the_batch_threshold_and_stays_lossless(engine_pool, prompts, hf_reference):
    """hybrid_spark_switch: window 8 while at most 2 requests run, 3 (steps + 1) above, chosen every step."""
    engine = engine_pool.get("hybrid_spark_switch")
    narrow, server = _narrow_steps_by_batch(engine, (1, 4, 2, 6), prompts, hf_reference)
    # Batches of 1 and 2 never narrow; batches of 4 and 6 start narrow (and widen again as requests finish).
    assert narrow[0] == 0 and narrow[1] > 0 and narrow[2] == narrow[1] and narrow[3] > narrow[2], narrow
    assert server["window_switches"] >= 4 and server["verify_window_tokens"] == 8, server


def test_retracted_requests_come_back_losslessly(engine_pool, prompts, hf_reference):
    """The EAGLE-family worker (wide window) under SGLang's forced retraction (see ``e2e_scenarios.check_retraction``)."""
    rows = _repeating_prompts(prompts, hf_reference)[:2] + [0, 1, 3, 6]
    check_retraction(engine_pool.get("hybrid_spark_retract"), prompts, hf_reference, rows, MAX_NEW)
