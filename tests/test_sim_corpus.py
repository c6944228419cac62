"""The simulator's hybrid with the cross-request corpus: later requests draft what earlier ones produced."""

from __future__ import annotations

import pytest

from sglang_hybrid.sim.jsonl import Record
from sglang_hybrid.sim.runner import SimOptions, simulate

ANSWER = ("The quarterly report shows that revenue grew by twelve percent, driven mostly by the new subscription "
          "tier, while operating costs stayed flat because the migration to the shared cluster finished early. ")


def _records():
    # Six chat requests with different questions whose answers share one long boilerplate paragraph (which no
    # prompt contains), run one at a time: only a cross-request source can draft it.
    return [Record(f"r{i}", "chat", f"Question {i}: summarise document number {i * 37}.",
                   f"Answer {i}. " + ANSWER + f"Details for item {i * 11} follow.") for i in range(6)]


@pytest.fixture(scope="module")
def runs():
    return {c: simulate(_records(), SimOptions(batch_size=1, policies=("hybrid",), corpus=c, measure="all",
                                               corpus_entries=1 << 14))["policies"]["hybrid"]
            for c in ("off", "shared")}


def test_the_corpus_lets_later_requests_draft_an_earlier_answer(runs):
    off, shared = runs["off"], runs["shared"]
    assert shared["ngram_chosen_frac"] > off["ngram_chosen_frac"] + 0.05
    assert shared["accepted_per_step"] > off["accepted_per_step"]
    assert shared["steps"] < off["steps"]


def test_only_off_and_shared_are_simulated():
    with pytest.raises(ValueError, match="corpus"):
        SimOptions(batch_size=1, corpus="tenant").validate()


def test_the_corpus_tail_continues_model_chains_with_an_earlier_answer():
    """With the corpus's tail (the default) a model chain is extended by what the corpus holds after it, here the
    boilerplate paragraph that only earlier answers contain, and the simulator counts those steps as the worker's
    metrics do. Without it only the n-gram tail (the request's own history) extends model chains. (On this small
    set the main corpus chain drafts the same paragraph a step later, so the step counts tie.)"""
    res = {t: simulate(_records(), SimOptions(batch_size=1, policies=("hybrid",), corpus="shared", measure="all",
                                               corpus_entries=1 << 14, corpus_tail=t))["policies"]["hybrid"]
           for t in (True, False)}
    on, off = res[True], res[False]
    assert on["chains"]["corpus_tail_chosen"] > 0 and on["chains"]["accepted_corpus_tail"] > 0
    assert on["chains"]["tail_chosen"] >= on["chains"]["corpus_tail_chosen"]
    assert "corpus_tail_chosen" not in off["chains"]
    assert on["output_tokens"] == off["output_tokens"]  # the same answers either way (every token verified)
