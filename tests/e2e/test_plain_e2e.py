"""SGLang's plain decoding on CPU (triton attention under the Triton interpreter) against HF transformers.

These also validate the oracles the speculative tests use: the HF greedy references, the stop and abort
checks, and the exact sampling distribution (chi-square) on the plain path.
"""

from __future__ import annotations

import pytest
from e2e_sampling import chi_square
from e2e_scenarios import (
    ABORT_INDEX,
    ABORT_MAX_NEW,
    ABORT_PROMPTS,
    abort_batch,
    check_abort,
    check_greedy,
    check_stop_outputs,
    greedy_batch,
)

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("bs", [8, 1])
def test_plain_greedy_equals_hf(engine_pool, prompts, hf_reference, bs):
    input_ids, sps = greedy_batch(prompts, bs)
    outputs = engine_pool.get("plain").generate(input_ids, sps)
    check_greedy(outputs, hf_reference, sps)


def test_plain_stop_token_and_string(plain_stop_outputs, stop_batch, hf_reference):
    check_stop_outputs(plain_stop_outputs, stop_batch, hf_reference)


def test_plain_abort_in_the_middle_of_a_batch(engine_pool, prompts, hf_reference):
    input_ids, sps = abort_batch(prompts)
    outputs = engine_pool.get("plain").generate_with_abort(input_ids, sps, ABORT_INDEX, abort_after_tokens=3)
    check_abort(outputs, [hf_reference[i] for i in ABORT_PROMPTS], ABORT_INDEX, ABORT_MAX_NEW)


def test_plain_sampling_follows_target_distribution(engine_pool, sampling_case):
    case = sampling_case
    bins = case.bins
    assert case.power_vs_greedy >= 0.9 and case.power_vs_no_exclusion >= 0.9, case
    sp = dict(temperature=case.temperature, max_new_tokens=bins.depth, ignore_eos=True)
    outputs = engine_pool.get("plain").generate([list(case.prompt)] * case.n, sp)
    counts = bins.count([o["output_ids"] for o in outputs])
    stat, p, dof = chi_square(counts, bins, case.n)
    assert dof >= 3 and len(bins.leaves) >= 2, (dof, bins)
    assert p > 1e-3, f"chi-square {stat:.1f} on {dof} dof, p={p:.2e}; counts {counts}"
