"""The replay simulator: the declared acceptance model, the NGRAM policy against a pure-Python replay, the
hybrid with its n-gram drafter off against DSpark, determinism, trace replay and the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sglang_hybrid.selection.sps import SpsTable
from sglang_hybrid.sim import simulate_cli
from sglang_hybrid.sim.acceptance import AcceptanceModel, accepted_prefix, expected_length, solve_curve
from sglang_hybrid.sim.jsonl import read_workload, write_workload
from sglang_hybrid.sim.policies import DSparkPolicy
from sglang_hybrid.sim.report import run_report
from sglang_hybrid.sim.runner import SimOptions, simulate
from sglang_hybrid.sim.simulator import Request, run_policy
from sglang_hybrid.sim.trace import ModelDraws, TraceFormatError, load_trace
from sglang_hybrid.tokenizer import load_tokenizer

DATA = Path(__file__).resolve().parent.parent / "sglang_hybrid" / "data" / "workloads"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def short_code(tok):
    """The shipped code-edit records with the shortest prompt + output (kept small for speed)."""
    recs = read_workload(DATA / "code_edit.jsonl")
    return sorted(recs, key=lambda r: len(r.prompt) + len(r.output))[:6]


@pytest.fixture(scope="module")
def chat():
    return read_workload(DATA / "chat.jsonl")


def test_acceptance_curves():
    for target in (5.0, 3.7, 1.5):
        cond = solve_curve(target, 7, 0.97)
        assert abs(expected_length(cond) - target) < 1e-9
        assert all(a >= b for a, b in zip(cond, cond[1:]))
    m = AcceptanceModel.for_kind("code-edit")
    c1, u1 = m.draw(3, 5, 100)
    c2, u2 = m.draw(3, 5, 100)
    assert np.array_equal(c1, c2) and np.array_equal(u1, u2)
    assert not np.array_equal(c1, m.draw(4, 5, 100)[0])
    c = np.array([[0.9, 0.9, 0.9], [0.5, 0.5, 0.5]], dtype=np.float32)
    u = np.array([[0.1, 0.95, 0.0], [0.4, 0.4, 0.4]], dtype=np.float32)
    assert accepted_prefix(c, u).tolist() == [1, 3]
    with pytest.raises(ValueError, match="target_length"):
        solve_curve(9.0, 7)


def _random_requests(model: AcceptanceModel, n: int, length: int, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        conf, u = model.draw(seed, i, length)
        reqs.append(Request(i, f"r{i}", rng.integers(1, 5000, 32, dtype=np.int32),
                            rng.integers(1, 5000, length, dtype=np.int32), conf, accepted_prefix(conf, u)))
    return reqs


@pytest.mark.parametrize("kind", ["code-edit", "chat"])
def test_dspark_reproduces_declared_acceptance(kind):
    """With a flat SPS table the DSpark budget admits every draft token, so the mean accepted length per step
    must match the declared model's full-gamma expectation (within 2%)."""
    model = AcceptanceModel.for_kind(kind)
    flat = SpsTable((1,), (100.0,), 8192)
    reqs = _random_requests(model, 16, 3000)
    res = run_policy(DSparkPolicy(7, flat, lag=2), reqs, 16, flat, gamma=7, vocab_size=5000, measure="all")
    assert res.request_steps > 8000
    assert res.verified_per_step == 8.0  # every request verifies its whole chain (7 drafts + root)
    assert abs(res.accepted_per_step / model.expected_length() - 1) < 0.02
    # and the per-token acceptance of verified drafts matches the curve's mean
    target = (model.expected_length() - 1) / 7
    assert abs(res.draft_accepted / res.draft_verified - target) < 0.02


def _ngram_lookup(h: list[int], n_min: int, n_max: int, max_draft: int) -> list[int]:
    """Pure-Python prompt lookup (the semantics of ``sglang_hybrid/ngram/reference.py``, window 0)."""
    T = len(h)
    best_m, best_e = 0, -1
    for e in range(T - 1):
        m = 0
        while m < n_max and e - m >= 0 and h[e - m] == h[T - 1 - m]:
            m += 1
        if m >= best_m and m > 0:
            best_m, best_e = m, e
    if best_m < n_min:
        return []
    return h[best_e + 1: min(best_e + 1 + max_draft, T)]


@pytest.mark.parametrize("width", [12, 17])  # 17: a 16-token chain accepted whole commits 17 tokens (its bonus too)
def test_ngram_policy_equals_bruteforce_replay(short_code, tok, width):
    opts = SimOptions(batch_size=3, policies=("ngram",), measure="all", ngram_width=width)
    res = simulate(short_code, opts)["policies"]["ngram"]
    width = opts.ngram_width
    steps = produced = verified = accepted = 0
    for r in short_code:
        prompt = tok.encode(r.prompt, add_special_tokens=False).ids
        out = tok.encode(r.output, add_special_tokens=False).ids
        h, pos = prompt + out[:1], 1
        while pos < len(out):
            draft = _ngram_lookup(h, opts.n_min, opts.n_max, width - 1)
            acc = 0
            while acc < len(draft) and pos + acc < len(out) and draft[acc] == out[pos + acc]:
                acc += 1
            n = min(acc + 1, len(out) - pos)
            h += out[pos: pos + n]
            pos += n
            steps += 1
            produced += n
            verified += len(draft)
            accepted += acc
    assert res["output_tokens"] == produced
    assert res["accepted_per_step"] == round(produced / steps, 4)
    assert res["verified_per_step"] == width
    assert res["draft_acceptance"] == round(accepted / verified, 4)
    assert produced / steps > 2.0  # code edits copy the prompt: the n-gram drafter has a lot to find


def test_hybrid_without_ngram_equals_dspark(chat):
    """Batch 24 with the roofline table makes the budget bind (the step is compute-bound past ~184 tokens)."""
    recs = chat[:40]
    base = SimOptions(batch_size=24, dspark_lag=0, measure="all", enable_ngram=False)
    res = simulate(recs, base)
    d, h = res["policies"]["dspark"], res["policies"]["hybrid"]
    assert d["verified_per_step"] < 7.5  # the budget cut some draft tokens
    for key in ("accepted_per_step", "verified_per_step", "theta", "throughput", "steps", "output_tokens",
                "draft_acceptance"):
        assert d[key] == h[key], key
    assert h["ngram_chosen_frac"] == 0.0
    # with the n-gram drafter on, the hybrid differs (it does find n-gram chains)
    on = simulate(recs, dataclasses.replace(base, policies=("hybrid",), enable_ngram=True))
    assert on["policies"]["hybrid"]["ngram_calibration"]["drafts"] > 0


def test_fixed_window_hybrid_pays_the_whole_window_and_chains_run_past_gamma(short_code):
    """The EAGLE-family worker's cost model: every request verifies max(gamma, max_draft) + 1 tokens a step."""
    base = SimOptions(batch_size=2, max_requests=4, gamma=3, policies=("hybrid",), measure="all",
                      hybrid_verify="fixed")
    narrow = simulate(short_code, base)["policies"]["hybrid"]
    wide = simulate(short_code, dataclasses.replace(base, max_draft=10))["policies"]["hybrid"]
    assert narrow["verified_per_step"] == 4.0 and wide["verified_per_step"] == 11.0
    # Code edits copy the prompt: n-gram chains longer than the 3-token model chain are verified and accepted.
    assert wide["accepted_per_step"] > 4.0 and wide["accepted_per_step"] > narrow["accepted_per_step"]
    with pytest.raises(ValueError, match="hybrid_verify"):
        simulate(short_code, dataclasses.replace(base, hybrid_verify="tree"))


def test_simulation_is_deterministic(short_code):
    opts = SimOptions(batch_size=2, max_requests=3)
    a, b = simulate(short_code, opts), simulate(short_code, opts)
    assert a["policies"] == b["policies"] and a["ratios"] == b["ratios"]
    c = simulate(short_code, dataclasses.replace(opts, seed=1, policies=("dspark",)))
    assert c["policies"]["dspark"] != a["policies"]["dspark"]


def test_trace_replay(tmp_path):
    model = AcceptanceModel.for_kind("chat")
    lines = [
        {"id": "a", "pos": 0, "conf": [0.9] * 7, "verified": 5, "accepted": 2},  # rejection seen: exactly 2
        {"id": "a", "pos": 3, "conf": [0.2] * 7, "verified": 7, "accepted": 7},  # all verified and accepted
        {"id": "a", "pos": 5, "conf": [1.0] * 7, "verified": 3, "accepted": 3},  # censored: >= 3, then drawn
    ]
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    draws = ModelDraws(model, 0, load_trace(p, 7))
    conf, acc = draws.for_request(0, "a", 8)
    assert acc[0] == 2 and acc[3] == 7 and acc[5] == 7  # conf 1.0 past the censored part: all accepted
    assert np.allclose(conf[1], 0.9) and np.allclose(conf[4], 0.2)  # earlier record lends its confidences
    assert draws.coverage == {"exact": 3, "earlier": 5, "declared": 0}
    draws.for_request(1, "unknown", 4)
    assert draws.coverage["declared"] == 4
    p.write_text(json.dumps({"id": "a", "pos": 0, "conf": [0.5] * 7, "verified": 2, "accepted": 3}) + "\n")
    with pytest.raises(TraceFormatError, match=":1:"):
        load_trace(p, 7)


def test_cli_json_table_and_plot(tmp_path, capsys, chat):
    wl = tmp_path / "w.jsonl"
    write_workload(wl, chat[:8])
    png = tmp_path / "r.png"
    rc = simulate_cli.main(["--workload", str(wl), "--batch-size", "2", "--json", "--max-requests", "6",
                            "--measure", "all", "--plot", str(png), "--no-progress"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for pol in ("dspark", "ngram", "hybrid"):
        assert set(out["policies"][pol]) >= {"accepted_per_step", "verified_per_step", "theta", "throughput"}
    assert set(out["ratios"]) == {"hybrid_over_dspark", "hybrid_over_ngram"}
    assert out["subsampled"] and out["requests"] == 6
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert simulate_cli.main(["--workload", str(wl), "--batch-size", "2", "--policy", "ngram", "--measure",
                              "all", "--no-progress"]) == 0
    assert "ngram" in capsys.readouterr().out
    assert simulate_cli.main(["--workload", str(tmp_path / "missing.jsonl"), "--no-progress"]) == 2


def test_report_on_small_workloads(tmp_path, chat):
    wl = tmp_path / "c.jsonl"
    write_workload(wl, chat[:5])
    runs = run_report([2], max_requests=4, workloads={"chat": wl}, log=lambda m: None,
                      base=SimOptions(batch_size=2, policies=("ngram", "hybrid")))
    assert len(runs) == 1 and runs[0]["subsampled"] and "hybrid_over_ngram" in runs[0]["ratios"]


def test_steady_measure_needs_a_queue(chat):
    with pytest.raises(ValueError, match="steady"):
        simulate(chat[:4], SimOptions(batch_size=4, policies=("ngram",)))
    r = simulate(chat[:12], SimOptions(batch_size=4, policies=("ngram",)))
    assert r["policies"]["ngram"]["mean_batch"] == 4.0


def test_report_in_two_processes_equals_one(tmp_path, chat):
    wl = tmp_path / "c.jsonl"
    write_workload(wl, chat[:6])
    kw = dict(max_requests=5, workloads={"chat": wl}, log=lambda m: None,
              base=SimOptions(batch_size=2, policies=("dspark", "hybrid")))
    one = run_report([2, 3], jobs=1, **kw)
    two = run_report([2, 3], jobs=2, **kw)
    assert [r["batch_size"] for r in two] == [2, 3]
    for a, b in zip(one, two):
        assert a["policies"] == b["policies"] and a["ratios"] == b["ratios"]


def test_model_tail_is_checked_token_by_token_and_lengthens_a_strong_model_chain(short_code):
    """A near-perfect model chain on code edits: the n-gram tail after it (simulated against the reference outputs
    like any chain) adds accepted tokens per step; with ``model_tail`` 0 the hybrid is what it was."""
    base = SimOptions(batch_size=2, max_requests=4, policies=("hybrid",), measure="all", accept_length=6.5,
                      concentration=float("inf"))
    off = simulate(short_code, dataclasses.replace(base, model_tail=0))["policies"]["hybrid"]
    on = simulate(short_code, base)["policies"]["hybrid"]
    assert base.model_tail > 0 and on["output_tokens"] == off["output_tokens"]
    assert on["accepted_per_step"] > off["accepted_per_step"] and on["steps"] < off["steps"]
    assert on["verified_per_step"] > off["verified_per_step"]  # the tail's tokens were verified
    with pytest.raises(ValueError, match="model_tail"):
        simulate(short_code, dataclasses.replace(base, model_tail=-1))


def test_model_splices_are_checked_token_by_token_and_change_the_steps(short_code):
    """Splices (``calibration/splice.py``, simulator only): the model chain cut after token k and continued by
    the request's own n-gram. The replay verifies them against the reference like any chain, so the output is the
    same; on code edits they change how many tokens each step accepts. Bad values are refused."""
    base = SimOptions(batch_size=2, max_requests=4, policies=("hybrid",), measure="all")
    off = simulate(short_code, base)["policies"]["hybrid"]
    on = simulate(short_code, dataclasses.replace(base, model_splices=4, splice_margin=0.0))["policies"]["hybrid"]
    assert base.model_splices == 0 and on["output_tokens"] == off["output_tokens"]
    assert on["accepted_per_step"] != off["accepted_per_step"]
    # The echo (calibration/echo.py, on by default) learns from the traffic and moves the steps too.
    mute = simulate(short_code, dataclasses.replace(base, model_splices=4, splice_margin=0.0, model_echo=False))
    mute = mute["policies"]["hybrid"]
    assert base.model_echo and mute["output_tokens"] == off["output_tokens"]
    assert mute["steps"] != on["steps"]
    for bad in (dict(model_splices=-1), dict(splice_margin=-0.5)):
        with pytest.raises(ValueError, match="model_splices and splice_margin"):
            simulate(short_code, dataclasses.replace(base, **bad))


def test_echo_probes_change_the_steps_not_the_output(chat):
    """The echo's probes (``ModelEcho.probe``, option ``echo_probes``, 4 by default): lookups that only extend the
    echo's reach. The output is the same; the steps move (on the first 8 chat records). A negative count is
    refused."""
    base = SimOptions(batch_size=4, max_requests=8, policies=("hybrid",), measure="all")
    on = simulate(chat[:8], base)["policies"]["hybrid"]
    off = simulate(chat[:8], dataclasses.replace(base, echo_probes=0))["policies"]["hybrid"]
    assert base.echo_probes == 4 and on["output_tokens"] == off["output_tokens"]
    assert on["steps"] != off["steps"]
    with pytest.raises(ValueError, match="echo_probes"):
        simulate(chat[:8], dataclasses.replace(base, echo_probes=-1))


def test_history_wrong_tokens_copy_what_follows_the_right_prefix():
    """``wrong_tokens="history"``: after the model's right prefix the chain copies what the history says follows it
    (here ``5 6 7`` after ``... 4``); where the lookup finds nothing, or its first token would be right, the
    wrong tokens stay ``ref + 1``."""
    from sglang_hybrid.ngram import NgramConfig, NgramDraft, TokenHistory
    from sglang_hybrid.sim.simulator import _history_wrong

    h = TokenHistory(4, 64, "cpu", backend="torch", max_batch_size=4, max_draft=8)
    rows = [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2], [1, 2, 3, 4, 5, 6, 7, 8, 1, 2], [9, 9, 8, 8]]
    p = torch.zeros(3, 10, dtype=torch.int32)
    for i, r in enumerate(rows):
        p[i, : len(r)] = torch.tensor(r)
    h.write_prompt(torch.arange(3), p, torch.tensor([len(r) for r in rows], dtype=torch.int32))
    h.reserve_after(4)
    ref = np.array([[3, 4, 20, 21], [3, 4, 5, 6], [1, 2, 3, 4]])
    acc = np.array([2, 2, 1])
    shift = ref + 1
    out = NgramDraft.zeros(4, 4, "cpu")
    w = _history_wrong(h, torch.arange(3), ref, acc, shift, NgramConfig(max_draft=4), out)
    assert w[0].tolist() == [4, 5, 5, 6]  # columns 2, 3: the history's 5 6 after "3 4" (before acc: ignored)
    assert w[1].tolist() == shift[1].tolist()  # the history's next token (5) is the reference's: shift
    assert w[2].tolist() == shift[2].tolist()  # "9 9 8 8 1" occurs nowhere before: shift
    assert h.lens[:3].tolist() == [10, 10, 4]  # the history is unchanged


def test_history_wrong_tokens_move_the_hybrid_not_dspark_or_the_output(chat):
    base = SimOptions(batch_size=4, max_requests=8, policies=("dspark", "hybrid"), measure="all")
    a = simulate(chat[:8], base)["policies"]
    b = simulate(chat[:8], dataclasses.replace(base, wrong_tokens="history"))["policies"]
    assert a["dspark"] == b["dspark"]  # DSpark accepts its drawn length whatever its wrong tokens are
    assert a["hybrid"]["output_tokens"] == b["hybrid"]["output_tokens"]
    assert a["hybrid"]["steps"] != b["hybrid"]["steps"]
    with pytest.raises(ValueError, match="wrong_tokens"):
        simulate(chat[:8], dataclasses.replace(base, wrong_tokens="random"))


def test_mixed_workload_reports_each_kind(short_code, chat):
    """A workload that mixes kinds is also reported per kind: the per-kind request-steps, tokens and
    request-seconds add up to the totals, each kind's speed is its tokens over its requests' running time, and
    the hybrid's per-kind ratio over DSpark says which kind its budget favours. One kind alone: no split."""
    from sglang_hybrid.sim.table import format_run

    recs = [r for pair in zip(short_code[:4], chat[:4]) for r in pair]
    opts = SimOptions(batch_size=1, measure="all", policies=("dspark", "hybrid"))
    # Batch 1: each step runs one request, so a kind's request-seconds are exactly its own steps' times.
    from sglang_hybrid.sim.runner import load_sps, make_policy, prepare_requests, run_built

    sps = load_sps(opts.sps_table)
    reqs, vocab, _ = prepare_requests(recs, opts)
    assert [r.kind for r in reqs] == [r.kind for r in recs]
    res = run_built(make_policy("hybrid", opts, sps), reqs, vocab, opts, sps)
    assert set(res.kinds) == {"chat", "code-edit"}
    assert sum(v[0] for v in res.kinds.values()) == res.request_steps == res.steps
    assert sum(v[1] for v in res.kinds.values()) == res.output_tokens
    assert sum(v[2] for v in res.kinds.values()) == pytest.approx(res.step_seconds, rel=1e-12)
    for k, (rs, t, sec) in res.kinds.items():
        s = res.kind_summary()[k]
        assert s["accepted_per_step"] == round(t / rs, 4)
        assert s["tokens_per_second_per_request"] == round(t / sec, 2)

    out = simulate(recs, dataclasses.replace(opts, batch_size=2))
    by = {p: out["policies"][p]["by_kind"] for p in ("dspark", "hybrid")}
    assert set(by["dspark"]) == set(by["hybrid"]) == {"chat", "code-edit"}
    for k, q in out["ratios_by_kind"].items():
        assert q["hybrid_over_dspark"] == pytest.approx(
            by["hybrid"][k]["tokens_per_second_per_request"] / by["dspark"][k]["tokens_per_second_per_request"],
            abs=1e-3)
    # Code edits copy their prompt, so the hybrid's n-gram chains speed them up far more than chat.
    assert out["ratios_by_kind"]["code-edit"]["hybrid_over_dspark"] > out["ratios_by_kind"]["chat"]["hybrid_over_dspark"]
    assert "chat requests, each one's speed: hybrid/dspark = " in format_run(out)

    single = simulate(chat[:6], dataclasses.replace(opts, batch_size=2))
    assert "ratios_by_kind" not in single and "by_kind" not in single["policies"]["hybrid"]
