"""Entry point (group ``sglang.srt.plugins``): registers ``HYBRID_SPARK`` in every SGLang process.

SGLang's scheduler processes are spawned, so only an installed entry point reaches them; ``register`` runs in
the launcher, the scheduler, the detokenizer and the data-parallel controller alike.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_hybrid")

_STATE = {"registered": False, "problems": None}


def register() -> bool:
    """Check the host API, apply CPU fixes where relevant, register the algorithm. Returns True if registered."""
    if _STATE["registered"]:
        return True
    from .cpu_compat import apply_cpu_compat
    from .hooks import SUPPORTED_SGLANG, check_host_api, sglang_version

    apply_cpu_compat()
    problems = check_host_api()
    _STATE["problems"] = problems
    if problems:
        logger.error(
            "sglang-hybrid: HYBRID_SPARK NOT registered: installed sglang %s differs from the API it was built "
            "for (sglang %s): %s",
            sglang_version(),
            SUPPORTED_SGLANG,
            "; ".join(problems),
        )
        return False
    from .wide_chain import apply_wide_chain_hooks

    apply_wide_chain_hooks()
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from .algo import ALGO_NAME, HybridSparkAlgo, worker_factory

    if get_spec(ALGO_NAME) is None:
        SpeculativeAlgorithm.register(ALGO_NAME, supports_overlap=True, spec_class=HybridSparkAlgo)(worker_factory)
    _STATE["registered"] = True
    from .startup_check import plugin_reach_problem

    reach = plugin_reach_problem()
    if reach:
        # Registered by hand in this process, but SGLang's spawned scheduler will not follow.
        logger.warning("%s (HYBRID_SPARK is registered in this process only, not in SGLang's scheduler)", reach)
    return True
