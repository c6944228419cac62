"""Prompts, HF-transformers references and the sampling oracle for the end-to-end tests (test process side).

- :func:`make_prompts`: deterministic token-id prompts of mixed lengths, some with planted repeats (so n-gram
  drafters find matches), kept only where the HF greedy continuation has clear top-2 logit margins, so an
  argmax can never flip between HF, SGLang's plain path and SGLang's verify path on float rounding.
- :func:`hf_greedy`: greedy continuations and their smallest top-2 margins, from ``LlamaForCausalLM``.
- the batches of the greedy, stop and abort scenarios, and the checks shared by the plain and the speculative
  tests. The sampling oracle is in ``e2e_sampling.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from tests.oracles.penalty_oracle import penalise

FIRST_TOKEN = 3  # ids 0, 1, 2 are the special tokens (bos, eos, pad)
EOS_ID = 1
PROMPT_LENGTHS = (5, 9, 17, 24, 33, 40, 12, 7, 28, 14)
MIN_MARGIN = 0.02


@functools.lru_cache(maxsize=4)
def hf_model(path: str):
    """The HF ``LlamaForCausalLM`` at ``path`` (fp32, eval), cached per process."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()


@torch.no_grad()
def hf_greedy(model_path: str, prompt: Sequence[int], max_new_tokens: int) -> Tuple[List[int], float]:
    """Greedy continuation (no EOS stop) of ``prompt`` and the smallest top-2 logit margin along it."""
    model = hf_model(model_path)
    out: List[int] = []
    margin = float("inf")
    step_input, past = torch.tensor([list(prompt)]), None
    for _ in range(max_new_tokens):
        res = model(step_input, past_key_values=past, use_cache=True)
        past = res.past_key_values
        top = torch.topk(res.logits[0, -1], 2)
        margin = min(margin, float(top.values[0] - top.values[1]))
        out.append(int(top.indices[0]))
        step_input = torch.tensor([[out[-1]]])
    return out, margin


def hf_penalised(model_path: str, prompt: Sequence[int], max_new_tokens: int, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, repetition_penalty: float = 1.0,
                 logit_bias: Optional[Dict[str, float]] = None, min_new_tokens: int = 0,
                 stop_token_ids: Sequence[int] = ()) -> List[int]:
    """Greedy continuation with SGLang's sampling penalties applied exactly at every token: the output's token
    counts ``n`` give ``- frequency * n - presence * [n > 0]`` (one additive term, as SGLang sums them), then
    positive logits divided by ``repetition`` where ``n > 0`` (negative ones multiplied), then ``logit_bias``
    added; ``stop_token_ids`` held back (``-inf``) while the output is shorter than ``min_new_tokens`` (no stopping
    here: the caller cuts at a stop token). (SGLang's plain decoding without the overlap scheduler does exactly
    this; with it, SGLang 0.5.23 feeds the penalizers one token late: README, Limits.)"""
    model = hf_model(model_path)
    out: List[int] = []
    step_input, past = torch.tensor([list(prompt)]), None
    bias = torch.zeros(model.config.vocab_size)
    for tok, b in (logit_bias or {}).items():
        bias[int(tok)] = b
    penalty = {"frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
               "repetition_penalty": repetition_penalty}
    for _ in range(max_new_tokens):
        res = model(step_input, past_key_values=past, use_cache=True)
        past = res.past_key_values
        logits = penalise(res.logits[0, -1].float(), out, penalty) + bias
        if len(out) < min_new_tokens:
            logits[list(stop_token_ids)] = float("-inf")
        out.append(int(logits.argmax()))
        step_input = torch.tensor([[out[-1]]])
    return out


def _candidate(g: torch.Generator, length: int, vocab: int, planted: bool) -> List[int]:
    if not planted or length < 12:
        return torch.randint(FIRST_TOKEN, vocab, (length,), generator=g).tolist()
    span = max(3, length // 4)
    a = torch.randint(FIRST_TOKEN, vocab, (span,), generator=g).tolist()
    rest = torch.randint(FIRST_TOKEN, vocab, (length - 2 * span,), generator=g).tolist()
    cut = len(rest) // 2
    return a + rest[:cut] + a + rest[cut:]  # the span ``a`` occurs twice


def make_prompts(
    model_path: str,
    vocab: int,
    lengths: Sequence[int] = PROMPT_LENGTHS,
    horizon: int = 16,
    seed: int = 1234,
    min_margin: float = MIN_MARGIN,
) -> List[List[int]]:
    """One prompt per entry of ``lengths`` (every other one with a planted repeated span), each drawn from a
    seeded stream until its HF greedy continuation over ``horizon`` tokens has top-2 margins >= ``min_margin``."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i, length in enumerate(lengths):
        for _attempt in range(50):
            cand = _candidate(g, length, vocab, planted=i % 2 == 1)
            _, margin = hf_greedy(model_path, cand, horizon)
            if margin >= min_margin:
                prompts.append(cand)
                break
        else:
            raise RuntimeError(f"no prompt of length {length} with greedy margins >= {min_margin} in 50 draws")
    return prompts


# ------------------------------------------------------------------------------------------------------------
# scenario builders shared by the plain and the speculative tests
# ------------------------------------------------------------------------------------------------------------

GREEDY_MAX_NEW = (16, 1, 2, 4, 12, 3, 16, 9)  # request i of every greedy batch; 4 = the verify width


def greedy_batch(prompts: List[List[int]], bs: int) -> Tuple[List[List[int]], List[dict]]:
    """The first ``bs`` prompts with mixed ``max_new_tokens`` (requests finish at different steps)."""
    if not 1 <= bs <= len(GREEDY_MAX_NEW):
        raise ValueError(f"bs must be in 1..{len(GREEDY_MAX_NEW)}, got {bs}")
    sps = [dict(temperature=0.0, max_new_tokens=GREEDY_MAX_NEW[i], ignore_eos=True) for i in range(bs)]
    return [list(p) for p in prompts[:bs]], sps


def first_new_token_index(ids: Sequence[int], start: int = 3) -> int:
    """The first index ``j >= start`` whose token does not occur in ``ids[:j]``."""
    for j in range(start, len(ids)):
        if ids[j] not in ids[:j]:
            return j
    raise ValueError("no token that is new from the start index on")


def stop_string_window(tokenizer, ids: Sequence[int], start: int = 4, width: int = 2) -> str:
    """Decoded text of a window of ``ids`` (from ``start``) that is clean (no replacement character, at least
    two non-space characters), used as a stop string."""
    for s in range(start, len(ids) - width):
        text = tokenizer.decode(list(ids[s : s + width]))
        if "\ufffd" not in text and len(text.strip()) >= 2:
            return text
    raise ValueError("no clean decoded window for a stop string")


@dataclass(frozen=True)
class StopCase:
    """A batch of three requests: one with a stop token id, one with a stop string, one without stops."""

    input_ids: List[List[int]]
    sampling_params: List[dict]
    stop_token: int
    stop_token_index: int  # where the stop token first appears in the unconstrained greedy output
    stop_string: str


def stop_case(prompts: List[List[int]], reference: List[List[int]], tokenizer) -> StopCase:
    """Build the stop-condition batch from the prompts and their greedy references."""
    j = first_new_token_index(reference[0])
    if EOS_ID in reference[0][: j + 1]:
        raise ValueError("the stop-token request would stop at EOS first; pick another prompt")
    text = stop_string_window(tokenizer, reference[6])
    sps = [
        # ignore_eos would also disable stop_token_ids (Req._check_token_based_finish)
        dict(temperature=0.0, max_new_tokens=16, ignore_eos=False, stop_token_ids=[reference[0][j]]),
        dict(temperature=0.0, max_new_tokens=16, ignore_eos=True, stop=[text]),
        dict(temperature=0.0, max_new_tokens=12, ignore_eos=True),
    ]
    return StopCase(
        input_ids=[list(prompts[0]), list(prompts[6]), list(prompts[3])],
        sampling_params=sps,
        stop_token=reference[0][j],
        stop_token_index=j,
        stop_string=text,
    )


# The logprob scenario (test_spec_e2e.py): greedy, these prompts, this many tokens, the top logprobs.
LOGPROB_ROWS, LOGPROB_MAX_NEW, LOGPROB_TOP = (0, 1, 2, 3), 12, 2

ABORT_PROMPTS = (1, 2, 4, 5)
ABORT_INDEX = 1  # position in the batch of the request that gets aborted
ABORT_MAX_NEW = 24


def abort_batch(prompts: List[List[int]]) -> Tuple[List[List[int]], List[dict]]:
    """Four long requests; the one at ``ABORT_INDEX`` is aborted once it has produced a few tokens."""
    sps = [dict(temperature=0.0, max_new_tokens=ABORT_MAX_NEW, ignore_eos=True) for _ in ABORT_PROMPTS]
    return [list(prompts[i]) for i in ABORT_PROMPTS], sps


# ------------------------------------------------------------------------------------------------------------
# checks shared by the plain and the speculative tests
# ------------------------------------------------------------------------------------------------------------


def check_greedy(outputs: List[dict], reference: List[List[int]], sampling_params: List[dict]) -> None:
    """Every output equals the greedy reference truncated to its ``max_new_tokens`` and finished by length."""
    assert len(outputs) == len(sampling_params)
    for i, (out, sp) in enumerate(zip(outputs, sampling_params)):
        n = sp["max_new_tokens"]
        assert out["output_ids"] == reference[i][:n], f"request {i}: {out['output_ids']} != {reference[i][:n]}"
        assert out["meta_info"]["finish_reason"]["type"] == "length", (i, out["meta_info"]["finish_reason"])


def check_stop_outputs(outputs: List[dict], case: StopCase, reference: List[List[int]]) -> None:
    """Oracle checks of the stop batch that need no engine reference."""
    a, b, c = outputs
    j = case.stop_token_index
    assert a["output_ids"] == reference[0][: j + 1], (a["output_ids"], reference[0][: j + 1])
    assert a["meta_info"]["finish_reason"] == {"type": "stop", "matched": case.stop_token}, a["meta_info"]
    assert b["meta_info"]["finish_reason"] == {"type": "stop", "matched": case.stop_string}, b["meta_info"]
    assert len(b["output_ids"]) < case.sampling_params[1]["max_new_tokens"]
    assert c["output_ids"] == reference[3][: case.sampling_params[2]["max_new_tokens"]]


def check_abort(outputs: List[dict], reference_rows: List[List[int]], abort_index: int, max_new: int) -> None:
    """Requests other than ``abort_index`` equal their references; the aborted one stopped early with an
    ``abort`` finish reason and a prefix of its reference."""
    for i, out in enumerate(outputs):
        ref = reference_rows[i][:max_new]
        if i == abort_index:
            assert out["abort_sent"], "the abort was never sent (the request finished first)"
            assert out["meta_info"]["finish_reason"]["type"] == "abort", out["meta_info"]["finish_reason"]
            assert len(out["output_ids"]) < max_new
            assert out["output_ids"] == ref[: len(out["output_ids"])]
        else:
            assert out["output_ids"] == ref, f"request {i} changed by the abort of request {abort_index}"
            assert out["meta_info"]["finish_reason"]["type"] == "length"


def spec_counters(outputs: List[dict]) -> Dict[str, int]:
    """Summed speculative counters of a batch (``spec_*`` meta_info fields; absent for 1-token requests)."""
    total = {"verify_ct": 0, "correct_drafts": 0, "proposed_drafts": 0, "max_accepted_in_a_step": 0}
    for out in outputs:
        m = out["meta_info"]
        total["verify_ct"] += int(m.get("spec_verify_ct") or 0)
        total["correct_drafts"] += int(m.get("spec_num_correct_drafts") or 0)
        total["proposed_drafts"] += int(m.get("spec_num_proposed_drafts") or 0)
        hist = m.get("spec_correct_drafts_histogram") or []
        nz = [k for k, v in enumerate(hist) if v]
        total["max_accepted_in_a_step"] = max(total["max_accepted_in_a_step"], max(nz) if nz else 0)
    return total


def repeats(ids: Sequence[int], n: int = 3) -> bool:
    """Whether some n-gram of ``ids`` occurs twice (the output copies itself: an n-gram drafter can help)."""
    seen = set()
    for i in range(len(ids) - n + 1):
        key = tuple(ids[i : i + n])
        if key in seen:
            return True
        seen.add(key)
    return False


def repeating_rows(prompts: List[List[int]], reference: List[List[int]], max_new: int, n: int = 3) -> List[int]:
    """Indices of the prompts whose text plus the first ``max_new`` reference tokens repeat an ``n``-gram."""
    return [i for i, (p, r) in enumerate(zip(prompts, reference)) if repeats(list(p) + list(r[:max_new]), n)]


def check_retraction(engine, prompts: List[List[int]], reference: List[List[int]], rows: List[int], max_new: int) -> None:
    """On an engine that runs SGLang's retraction test switch (``SGLANG_TEST_RETRACT``): greedy requests that SGLang
    retracts and re-prefills (prompt plus output so far) end equal to their references; some retraction happened;
    the n-gram chain was still chosen and accepted; and the engine goes on serving."""
    sps = [dict(temperature=0, max_new_tokens=max_new, ignore_eos=True) for _ in rows]
    outputs = engine.generate([prompts[i] for i in rows], sps)
    check_greedy(outputs, [reference[i] for i in rows], sps)
    retractions = [o["meta_info"].get("num_retractions", 0) for o in outputs]
    assert sum(retractions) >= 2, f"SGLang should have retracted some requests: {retractions}"
    server = engine.server_info()["internal_states"][0]["hybrid_spark"]
    assert server["accepted_ngram"] > 0 and server["ngram_chosen"] > 0, server
    again = engine.generate([prompts[rows[0]]], sps[:1])
    check_greedy(again, [reference[rows[0]]], sps[:1])


# ------------------------------------------------------------------------------------------------------------
# sampling penalties (sglang_hybrid/penalties.py) on a HYBRID_SPARK engine
# ------------------------------------------------------------------------------------------------------------

# Penalised requests (one with a logit bias) for prompts 0-3: they leave their unpenalised greedy output within 32
# tokens under these penalties (at the 22nd, 12th, 28th and 23rd token).
PENALTIES = (dict(frequency_penalty=2.0), dict(presence_penalty=2.0), dict(repetition_penalty=2.0),
             dict(frequency_penalty=1.5, logit_bias={"77": 6.0}))


def _greedy_sp(max_new: int) -> dict:
    return {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}


def _hybrid_metrics(engine) -> dict:
    return engine.server_info()["internal_states"][0]["hybrid_spark"]


def penalised_batch(engine, prompts, hf_reference, target: str, max_new: int, extra_rows, tail=((), ())):
    """Send prompts 0-3 with ``PENALTIES``, ``extra_rows`` greedy (checked against ``hf_reference``) and ``tail``
    (rows, sampling params: the caller checks them) in one batch; return (outputs of 0-3 and of the tail, penalised
    references, unpenalised references (the logit bias kept), metrics before, metrics after)."""
    rows = [0, 1, 2, 3]
    extra_sps = [_greedy_sp(max_new) for _ in extra_rows]
    sps = [dict(_greedy_sp(max_new), **p) for p in PENALTIES] + extra_sps + list(tail[1])
    penalised = [hf_penalised(target, prompts[i], max_new, **p) for i, p in zip(rows, PENALTIES)]
    plain = [hf_penalised(target, prompts[i], max_new, logit_bias=p.get("logit_bias")) for i, p in zip(rows, PENALTIES)]
    assert all(a != b for a, b in zip(penalised, plain)), "the penalties must change every penalised output"
    before = _hybrid_metrics(engine)
    outputs = engine.generate([prompts[i] for i in rows + list(extra_rows) + list(tail[0])], sps)
    after = _hybrid_metrics(engine)
    n = len(rows) + len(extra_rows)
    check_greedy(outputs[len(rows):n], [hf_reference[i] for i in extra_rows], extra_sps)
    return outputs[: len(rows)] + outputs[n:], penalised, plain, before, after


def check_penalties(engine, prompts, hf_reference, target: str, max_new: int, min_steps: int) -> None:
    """Penalised requests beside an unpenalised one equal their exact penalised references (``hf_penalised``, the
    logit bias too) while n-gram chains are still chosen; a request whose second greedy token is a stop token runs
    past it under ``min_new_tokens`` 4 and stops where plain decoding does; a batch without penalties is not
    penalised; sampled penalised requests complete (the target's rejection sampling on the penalised logits)."""
    stop = hf_reference[6][1]
    held = dict(_greedy_sp(max_new), min_new_tokens=4, stop_token_ids=[stop])
    outputs, penalised, _plain, before, after = penalised_batch(engine, prompts, hf_reference, target, max_new, [5],
                                                                tail=([6], [held]))
    assert [o["output_ids"] for o in outputs[:4]] == penalised
    ref = hf_penalised(target, prompts[6], max_new, min_new_tokens=4, stop_token_ids=[stop])
    cut = next((k + 1 for k in range(4, max_new) if ref[k] == stop), max_new)
    assert ref[:2] != hf_reference[6][:2] and outputs[4]["output_ids"] == ref[:cut], (outputs[4]["output_ids"], ref)
    assert after["penalty_steps"] - before["penalty_steps"] >= min_steps
    assert after["penalty_steps_unapplied"] == before["penalty_steps_unapplied"]
    assert after["penalty_rows"] == 64 and after["penalty_rows_refused"] == before["penalty_rows_refused"]
    assert after["ngram_chosen"] > before["ngram_chosen"]
    again = engine.generate([prompts[5]], [_greedy_sp(max_new)])
    check_greedy(again, [hf_reference[5]], [_greedy_sp(max_new)])
    final = _hybrid_metrics(engine)
    assert final["penalty_steps"] == after["penalty_steps"], "a batch without penalties was penalised"
    sampled = [dict(temperature=1.0, max_new_tokens=max_new, ignore_eos=True, **p) for p in PENALTIES]
    outs = engine.generate([prompts[i] for i in range(4)], sampled)
    assert all(len(o["output_ids"]) == max_new for o in outs)
    assert _hybrid_metrics(engine)["penalty_steps"] > final["penalty_steps"]


def check_penalised_sampling(engine, tiny_models) -> None:
    """Sampling with ``repetition_penalty`` 0.5 (seen tokens favoured): the first three tokens of 120 identical
    requests follow the exact penalised distribution (chi-square, e2e_sampling); the prompt is chosen so that the
    test rejects, with power >= 0.9, the same draws without penalties."""
    from e2e_sampling import chi_square, pick_penalised_sampling_case

    penalty = dict(repetition_penalty=0.5)
    case = pick_penalised_sampling_case(tiny_models.target, tiny_models.spec.vocab_size, penalty)
    assert case.power_vs_greedy >= 0.9 and case.power_vs_no_exclusion >= 0.9, case
    before = _hybrid_metrics(engine)["penalty_steps"]
    sp = dict(temperature=case.temperature, max_new_tokens=case.bins.depth, ignore_eos=True, **penalty)
    outputs = engine.generate([list(case.prompt)] * case.n, sp)
    counts = case.bins.count([o["output_ids"] for o in outputs])
    stat, p, dof = chi_square(counts, case.bins, case.n)
    assert dof >= 3, (dof, case.bins)
    assert p > 1e-3, f"chi-square {stat:.1f} on {dof} dof, p={p:.2e}; counts {counts}"
    assert _hybrid_metrics(engine)["penalty_steps"] > before
