"""Grammar-constrained requests under HYBRID_SPARK (xgrammar backend, real SGLang engine on CPU).

SGLang's EAGLE V2 verify builds the grammar's vocabulary mask from the verify input after the worker has
merged the chosen chain into it (``run_eagle_verify``: ``GrammarTree.from_device``), so the n-gram chain is
checked by the grammar like the model chain. These runs check that a batch mixing constrained and free
requests neither crashes nor changes output: greedy ids equal plain decoding's under the same constraint, and
the constrained texts match their regex (in full, or as a prefix when cut by ``max_new_tokens``).
"""

from __future__ import annotations

import pytest
import regex
from engine_harness import EngineConfig, get_config, register_config

pytestmark = pytest.mark.e2e

_XGRAMMAR = (("grammar_backend", "xgrammar"),)
register_config(EngineConfig("plain_grammar", engine_kwargs=_XGRAMMAR))
register_config(
    EngineConfig("hybrid_spark_grammar", algorithm="HYBRID_SPARK", draft="standalone", engine_kwargs=_XGRAMMAR,
                 env=(("SGLANG_HYBRID_SYNC_GUARD", "1"),))
)
# On DSpark (compact, window 8, the corpus on): DSpark's verify masks each position from the grammar walked along
# the verified chain, which is the merged one (the n-gram chain where it was chosen).
_dspark = get_config("hybrid_dspark_compact")
register_config(EngineConfig("hybrid_dspark_grammar", algorithm=_dspark.algorithm, draft=_dspark.draft,
                             engine_kwargs=_dspark.engine_kwargs + _XGRAMMAR, env=_dspark.env))

# Repetitive by construction: the n-gram drafter finds matches inside the constrained output itself.
REGEX = r"(def (add|scale)\(a, b\):\n    return a [+*] b\n){2,4}"
MAX_NEW = 48


@pytest.mark.parametrize("config", ["hybrid_spark_grammar", "hybrid_dspark_grammar"])
def test_grammar_requests_are_lossless_and_match_their_constraint(engine_pool, prompts, config):
    rows = list(range(4))
    input_ids = [prompts[i] for i in rows]
    sps = [
        {"temperature": 0, "max_new_tokens": MAX_NEW, "regex": REGEX},
        {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},  # a free request in the same batch
        {"temperature": 0, "max_new_tokens": MAX_NEW, "regex": REGEX},
        {"temperature": 0, "max_new_tokens": MAX_NEW, "regex": r"[a-z]{3,12}( [a-z]{3,12}){3}"},
    ]
    plain = engine_pool.get("plain_grammar").generate(input_ids, sps)
    hybrid = engine_pool.get(config).generate(input_ids, sps)
    for i, (p, h, sp) in enumerate(zip(plain, hybrid, sps)):
        assert h["output_ids"] == p["output_ids"], (i, h["output_ids"], p["output_ids"])
        if "regex" in sp:
            # Cut by max_new_tokens: a prefix of the language; finished by the grammar: a whole match.
            cut = h["meta_info"]["finish_reason"]["type"] == "length"
            assert regex.fullmatch(sp["regex"], h["text"], partial=cut), (i, h["meta_info"]["finish_reason"], h["text"])
    per_req = [o["meta_info"]["hybrid_spark"][-1] for o in hybrid]
    assert sum(m["verify_steps"] for m in per_req) > 0
    assert per_req[0]["ngram_chosen_steps"] + per_req[2]["ngram_chosen_steps"] > 0, per_req
