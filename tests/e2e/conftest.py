"""Shared fixtures of the end-to-end tests: tiny models, the engine pool, prompts and HF references.

- ``tiny_models``: the offline tiny models (``tiny_models.build_tiny_models``; cached on disk).
- ``engine_pool``: an ``engine_harness.EnginePool``; ``engine_pool.get(name)`` starts (once) and returns the
  engine of a registered configuration (``engine_harness.register_config`` adds more, e.g. HYBRID_SPARK runs).
  At most two engines run at a time; all are shut down at the end of the session.
- ``prompts`` / ``hf_reference``: the deterministic prompts and their HF greedy continuations (``HF_HORIZON``
  tokens), the oracle every greedy output is compared with; ``stop_batch`` / ``plain_stop_outputs``: the
  stop-condition batch and the plain engine's outputs on it; ``sampling_case``: the sampling oracle.
The terminal summary lists each engine's start time and the wall time of every call made to it.
"""

from __future__ import annotations

import os
import sys
from typing import List

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from e2e_sampling import SamplingCase, pick_sampling_case  # noqa: E402
from e2e_scenarios import (  # noqa: E402
    LOGPROB_MAX_NEW,
    LOGPROB_ROWS,
    LOGPROB_TOP,
    StopCase,
    hf_greedy,
    make_prompts,
    stop_case,
)
from engine_harness import EnginePool  # noqa: E402
from tiny_models import TinyModels, build_tiny_models  # noqa: E402

HF_HORIZON = 40

_POOLS: List[EnginePool] = []


@pytest.fixture(scope="session")
def tiny_models() -> TinyModels:
    return build_tiny_models()


@pytest.fixture(scope="session")
def engine_pool(tiny_models: TinyModels):
    pool = EnginePool(tiny_models, max_alive=2)
    _POOLS.append(pool)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def prompts(tiny_models: TinyModels) -> List[List[int]]:
    return make_prompts(tiny_models.target, tiny_models.spec.vocab_size, horizon=HF_HORIZON)


@pytest.fixture(scope="session")
def hf_reference(tiny_models: TinyModels, prompts: List[List[int]]) -> List[List[int]]:
    """HF greedy continuation (``HF_HORIZON`` tokens, no EOS stop) of every prompt."""
    return [hf_greedy(tiny_models.target, p, HF_HORIZON)[0] for p in prompts]


@pytest.fixture(scope="session")
def stop_batch(tiny_models: TinyModels, prompts, hf_reference) -> StopCase:
    from tiny_models import load_tokenizer

    return stop_case(prompts, hf_reference, load_tokenizer(tiny_models))


@pytest.fixture(scope="session")
def plain_stop_outputs(engine_pool: EnginePool, stop_batch: StopCase) -> List[dict]:
    """The plain engine's outputs on the stop-condition batch (the reference for the speculative engines)."""
    return engine_pool.get("plain").generate(stop_batch.input_ids, stop_batch.sampling_params)


@pytest.fixture(scope="session")
def plain_logprob_outputs(engine_pool: EnginePool, prompts) -> List[dict]:
    """The plain engine's greedy outputs with logprobs (the top ``LOGPROB_TOP`` too) on prompts ``LOGPROB_ROWS``."""
    sp = dict(temperature=0, max_new_tokens=LOGPROB_MAX_NEW, ignore_eos=True)
    return engine_pool.get("plain").generate([prompts[i] for i in LOGPROB_ROWS], sp, top_logprobs_num=LOGPROB_TOP)


@pytest.fixture(scope="session")
def sampling_case(tiny_models: TinyModels) -> SamplingCase:
    """The prompt of the sampling tests and the exact binned distribution of its first tokens
    (``e2e_sampling``)."""
    return pick_sampling_case(tiny_models.target, tiny_models.spec.vocab_size)


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: D103
    lines = []
    for pool in _POOLS:
        for name, starts in pool.timings.items():
            lines.append(f"engine {name}: start {', '.join(f'{s:.1f} s' for s in starts)}")
        for handle in pool.handles():
            for fn, dt in handle.call_log:
                lines.append(f"  {handle.config.name}.{fn}: {dt:.1f} s")
    if lines:
        terminalreporter.section("sglang engine timings")
        for line in lines:
            terminalreporter.write_line(line)
