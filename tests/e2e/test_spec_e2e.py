"""Speculative decoding in the real SGLang engine on CPU is lossless (STANDALONE, EAGLE3, topk 1, 3 steps,
4 draft tokens; more configurations can be added to ``engine_harness.LOSSLESS_SPEC_CONFIGS``).

Greedy: token ids equal the HF greedy references (which the plain engine is checked against in
test_plain_e2e.py) for batch sizes 1..8, mixed prompt lengths, max_new_tokens 1, 2, 4 (the verify width) and
more, requests finishing at different steps, stop token ids, stop strings, and an abort in the middle of a
batch. Sampling: the first three sampled tokens follow the target distribution (chi-square against the exact
HF probabilities). Tests are grouped per configuration, so each engine starts once.
"""

from __future__ import annotations

import pytest
from e2e_sampling import chi_square
from e2e_scenarios import (
    ABORT_INDEX,
    LOGPROB_MAX_NEW,
    LOGPROB_ROWS,
    LOGPROB_TOP,
    ABORT_MAX_NEW,
    ABORT_PROMPTS,
    abort_batch,
    check_abort,
    check_greedy,
    check_stop_outputs,
    greedy_batch,
    spec_counters,
)
from engine_harness import LOSSLESS_SPEC_CONFIGS

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=LOSSLESS_SPEC_CONFIGS)
def spec_config(request):
    return request.param


@pytest.mark.parametrize("bs", [1, 2, 3, 4, 5, 6, 7, 8])
def test_spec_greedy_equals_reference(engine_pool, spec_config, prompts, hf_reference, bs):
    input_ids, sps = greedy_batch(prompts, bs)
    outputs = engine_pool.get(spec_config).generate(input_ids, sps)
    check_greedy(outputs, hf_reference, sps)
    counters = spec_counters(outputs)
    assert counters["verify_ct"] > 0
    if bs == 8:  # the drafters are useful: drafts get accepted, sometimes several in one step
        assert counters["correct_drafts"] > 0, counters
        if "dspark" not in spec_config:
            # The random tiny DSpark block accepts at most one draft per step on these short requests; its long
            # accepts come from the n-gram chain (test_dspark_e2e.py asserts more than gamma + 1 in one step).
            assert counters["max_accepted_in_a_step"] >= 2, counters


def test_spec_stop_token_and_string(engine_pool, spec_config, stop_batch, plain_stop_outputs, hf_reference):
    outputs = engine_pool.get(spec_config).generate(stop_batch.input_ids, stop_batch.sampling_params)
    check_stop_outputs(outputs, stop_batch, hf_reference)
    for out, ref in zip(outputs, plain_stop_outputs):
        assert out["output_ids"] == ref["output_ids"]
        assert out["text"] == ref["text"]
        assert out["meta_info"]["finish_reason"] == ref["meta_info"]["finish_reason"]


def test_spec_abort_in_the_middle_of_a_batch(engine_pool, spec_config, prompts, hf_reference):
    input_ids, sps = abort_batch(prompts)
    outputs = engine_pool.get(spec_config).generate_with_abort(input_ids, sps, ABORT_INDEX, abort_after_tokens=3)
    check_abort(outputs, [hf_reference[i] for i in ABORT_PROMPTS], ABORT_INDEX, ABORT_MAX_NEW)


def test_spec_logprobs_equal_plain_decoding(engine_pool, spec_config, prompts, plain_logprob_outputs):
    """``return_logprob`` with the top 2: each output token's logprob and the top tokens equal plain decoding's (the
    verify computes them from the target's logits at every accepted position, whichever drafter proposed it)."""
    sp = dict(temperature=0, max_new_tokens=LOGPROB_MAX_NEW, ignore_eos=True)
    outputs = engine_pool.get(spec_config).generate([prompts[i] for i in LOGPROB_ROWS], sp,
                                                    top_logprobs_num=LOGPROB_TOP)
    for i, (out, ref) in enumerate(zip(outputs, plain_logprob_outputs)):
        assert out["output_ids"] == ref["output_ids"], i
        ours, theirs = out["meta_info"]["output_token_logprobs"], ref["meta_info"]["output_token_logprobs"]
        assert [t[1] for t in ours] == [t[1] for t in theirs] == out["output_ids"], i
        assert max(abs(a[0] - b[0]) for a, b in zip(ours, theirs)) < 1e-4, (i, ours, theirs)
        tops, ref_tops = out["meta_info"]["output_top_logprobs"], ref["meta_info"]["output_top_logprobs"]
        assert len(tops) == len(ref_tops) == LOGPROB_MAX_NEW, i
        for pos, (a, b) in enumerate(zip(tops, ref_tops)):
            assert [t[1] for t in a] == [t[1] for t in b] and len(a) == LOGPROB_TOP, (i, pos, a, b)
            assert max(abs(x[0] - y[0]) for x, y in zip(a, b)) < 1e-4, (i, pos, a, b)


def test_spec_sampling_follows_target_distribution(engine_pool, spec_config, sampling_case):
    case = sampling_case
    bins = case.bins
    assert case.power_vs_greedy >= 0.9 and case.power_vs_no_exclusion >= 0.9, case
    sp = dict(temperature=case.temperature, max_new_tokens=bins.depth, ignore_eos=True)
    outputs = engine_pool.get(spec_config).generate([list(case.prompt)] * case.n, sp)
    counts = bins.count([o["output_ids"] for o in outputs])
    stat, p, dof = chi_square(counts, bins, case.n)
    assert dof >= 3 and len(bins.leaves) >= 2, (dof, bins)
    assert p > 1e-3, f"{spec_config}: chi-square {stat:.1f} on {dof} dof, p={p:.2e}; counts {counts}"
    assert spec_counters(outputs)["verify_ct"] > 0
