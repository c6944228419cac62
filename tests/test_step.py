"""HybridStep: one decode step's lookup, calibration, selection and bookkeeping, as the worker calls it."""

import pytest
import torch

from sglang_hybrid.config import HybridConfig
from sglang_hybrid.step import HostSyncError, HybridStep, sync_guard
from tests.alloc_probe import profile_call, tagged

GAMMA = 4


def _step(**cfg):
    c = HybridConfig(**cfg)
    return HybridStep(c, num_slots=8, width=256, gamma=GAMMA, max_bs=4, device="cpu")


def _prefill(step, slots, rows):
    p = max(len(r) for r in rows)
    prompt = torch.zeros(len(rows), p, dtype=torch.int32)
    for i, r in enumerate(rows):
        prompt[i, : len(r)] = torch.tensor(r)
    lens = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    first = torch.tensor([r[-1] for r in rows], dtype=torch.int32)
    # The "first sampled token" repeats the last prompt token here to make the suffix match below.
    step.on_prefill(slots, prompt[:, :-1], lens - 1, first)


def test_repeated_content_chooses_the_ngram_chain_and_fresh_content_the_model_chain():
    # A weak model chain (as the online estimate becomes after rejections) against a calibrated 4-token match.
    step = _step(model_prior=0.3)
    slots = torch.tensor([3, 5])
    copy = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    rows = [copy + [50, 51] + copy[:4], list(range(100, 116))]  # row 0 repeats a span; row 1 never repeats
    _prefill(step, slots, rows)
    model = torch.tensor([[90, 91, 92, 93], [94, 95, 96, 97]], dtype=torch.int32)
    prop = step.propose(slots, model)
    assert prop.choice.tolist() == [1, 0]
    assert prop.tokens[0].tolist() == copy[4:8]  # the tokens that followed the earlier occurrence
    assert prop.tokens[1].tolist() == model[1].tolist()
    assert 1 <= int(prop.verify_len[0]) <= GAMMA and int(prop.verify_len[1]) >= 1


def test_record_appends_committed_tokens_and_counts_acceptance():
    step = _step(model_ema=0.5, model_prior=0.3)
    slots = torch.tensor([1, 2])
    copy = [20, 21, 22, 23, 24, 25, 26, 27]
    _prefill(step, slots, [copy + [7] + copy[:3], list(range(60, 72))])
    model = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32)
    prop = step.propose(slots, model)
    before = step.history.lens[slots].clone()
    committed = torch.tensor([[23, 24, 25, 99, 0], [5, 0, 0, 0, 0]], dtype=torch.int32)
    accept = torch.tensor([4, 1], dtype=torch.int32)  # row 0: 3 drafts + bonus; row 1: bonus only
    cond_before = step.model_cond.clone()
    step.record(slots, prop, committed, accept)
    assert (step.history.lens[slots] - before).tolist() == [4, 1]
    assert step.history.tokens[1, int(before[0]) : int(before[0]) + 4].tolist() == [23, 24, 25, 99]
    m = step.metrics()
    assert m["decode_steps"] == 1 and m["request_steps"] == 2
    assert m["accepted_ngram"] == 3 and m["accepted_model"] == 0
    assert m["ngram_chosen"] == 1
    # The model chain of row 1 was rejected at its first token: position 1's estimate dropped.
    assert step.model_cond[0] < cond_before[0]
    assert step.request_metrics(1)["accepted_ngram"] == 3 and step.request_metrics(2)["verify_steps"] == 1


def test_ngram_disabled_equals_model_only():
    step = _step(enable_ngram=False)
    slots = torch.tensor([0])
    copy = [30, 31, 32, 33, 34, 35]
    _prefill(step, slots, [copy + [1] + copy[:3]])
    prop = step.propose(slots, torch.tensor([[4, 5, 6, 7]], dtype=torch.int32))
    assert prop.choice.tolist() == [0] and prop.tokens[0].tolist() == [4, 5, 6, 7]


def test_decode_step_makes_no_host_sync(monkeypatch):
    monkeypatch.setenv("SGLANG_HYBRID_SYNC_GUARD", "1")
    step = _step()
    slots = torch.tensor([0, 1])
    _prefill(step, slots, [[1, 2, 3, 1, 2], [4, 5, 6, 4, 5]])
    prop = step.propose(slots, torch.zeros(2, GAMMA, dtype=torch.int32))
    step.record(slots, prop, torch.zeros(2, GAMMA + 1, dtype=torch.int32), torch.ones(2, dtype=torch.int32))
    with pytest.raises(HostSyncError):
        with sync_guard(True):
            torch.ones(1).item()


def _wide_step(window, **cfg):
    return HybridStep(HybridConfig(**cfg), num_slots=8, width=256, gamma=GAMMA, max_bs=4, device="cpu",
                      verify_window=window)


def test_wide_verify_window_lets_ngram_chains_run_past_the_model_chain():
    step = _wide_step(10, model_prior=0.3)
    assert step.width == 10 and step.ngram_cfg.max_draft == 10
    slots = torch.tensor([3, 5])
    copy = list(range(10, 30))
    _prefill(step, slots, [copy + [50, 51] + copy[:4], list(range(100, 116))])
    model = torch.tensor([[90, 91, 92, 93], [94, 95, 96, 97]], dtype=torch.int32)
    prop = step.propose(slots, model)
    assert prop.tokens.shape == (2, 10)
    assert prop.choice.tolist() == [1, 0]
    assert prop.tokens[0].tolist() == copy[4:14]  # ten tokens: longer than the 4-token model chain
    assert int(prop.verify_len[0]) > GAMMA
    # The model chain never verifies past its own gamma tokens, whatever the window.
    assert prop.tokens[1, :GAMMA].tolist() == model[1].tolist() and 1 <= int(prop.verify_len[1]) <= GAMMA
    committed = torch.zeros(2, 11, dtype=torch.int32)
    committed[0, :8] = torch.tensor(copy[4:11] + [7])
    committed[1, :3] = torch.tensor([94, 95, 1])
    step.record(slots, prop, committed, torch.tensor([8, 3], dtype=torch.int32))
    m = step.metrics()
    assert m["accepted_ngram"] == 7 and m["accepted_model"] == 2
    assert (m["model_chain_tokens"], m["ngram_chain_tokens"], m["verify_window_tokens"]) == (GAMMA, 10, 11)


def test_max_draft_below_the_window_caps_the_ngram_chain():
    step = _wide_step(10, max_draft=6)
    assert step.ngram_cfg.max_draft == 6 and step.width == 6
    with pytest.raises(ValueError, match="verify_window"):
        _wide_step(GAMMA - 1)


def test_dspark_shaped_merge_feeds_sglangs_dspark_planner():
    """DSpark hands over draft tokens [bs, gamma] (int64) and confidence-head estimates [bs, gamma]; the merge
    returns the chosen chains and their per-token confidence, which SGLang's DSpark planner then allocates."""
    from sglang.kernels.ops.speculative.dspark.dspark_schedule import schedule_verify_lens_topk_from_survival
    from sglang.srt.speculative.dspark_components.dspark_planner import DSparkScheduleConfig

    step = _wide_step(8)
    slots = torch.tensor([0, 1, 2])
    copy = list(range(40, 60))
    _prefill(step, slots, [copy + [1, 2] + copy[:5], list(range(100, 112)), list(range(200, 214))])
    model = torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14], [15, 16, 17, 18]], dtype=torch.int64)
    conf = torch.tensor([[0.3, 0.2, 0.2, 0.2], [0.9, 0.8, 0.7, 0.6], [0.5, 0.5, 0.4, 0.3]])
    prop = step.propose(slots, model, model_confidence=conf)
    assert prop.choice.tolist() == [1, 0, 0]  # a long calibrated copy beats a weak model chain; no match elsewhere
    assert prop.tokens[0].tolist() == copy[5:13]
    merged = step.conditional_confidence(prop)
    assert merged.shape == (3, 8)
    # Model rows keep the drafter's own tokens and confidence; nothing past its gamma tokens.
    assert prop.tokens[1:, :GAMMA].tolist() == model[1:].tolist()
    assert torch.allclose(merged[1:, :GAMMA], conf[1:], atol=1e-6) and float(merged[1:, GAMMA:].abs().sum()) == 0
    # The n-gram row carries the calibrated survivals, as conditionals.
    assert torch.allclose(torch.cumprod(merged[0], 0), prop.survival[0], atol=1e-6)
    assert float(prop.survival[0, 5]) > float(torch.cumprod(conf[0], 0)[-1])
    # SGLang's own DSpark allocation on the merged survivals: the copy gets the longest verify.
    lens = schedule_verify_lens_topk_from_survival(
        survival_probs=torch.cumprod(merged, 1), budget=12, cfg=DSparkScheduleConfig(gamma=8))
    assert int(lens[0]) == int(lens.max()) and int(lens[0]) > GAMMA + 1
    # Without an n-gram match anywhere the merge is the identity on DSpark's inputs.
    only_model = _wide_step(8, enable_ngram=False)
    _prefill(only_model, slots, [copy + [1, 2] + copy[:5], list(range(100, 112)), list(range(200, 214))])
    p2 = only_model.propose(slots, model, model_confidence=conf)
    assert p2.choice.tolist() == [0, 0, 0]
    assert torch.allclose(only_model.conditional_confidence(p2)[:, :GAMMA], conf, atol=1e-6)


@pytest.mark.parametrize("splices", [0, 3])
def test_decode_step_allocates_nothing_outside_the_kernels(monkeypatch, splices):
    """propose / record / conditional_confidence run as the worker runs them (host-sync guard on, so the CPU-only
    argument checks are off) with the Triton kernels under the interpreter. The profiler records every tensor
    allocation; the ones made inside a kernel launch are the interpreter's own copies (on CUDA a launch
    allocates nothing), so only allocations outside the kernels count, and there must be none."""
    import os

    from sglang_hybrid import step as step_mod

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py before triton is imported)")
    monkeypatch.setenv("SGLANG_HYBRID_SYNC_GUARD", "1")
    s = HybridStep(HybridConfig(model_ema=0.1, model_splices=splices), num_slots=8, width=256, gamma=GAMMA, max_bs=4,
                   device="cpu", verify_window=8, kernel_backend="triton")

    s.history._lookup, s.history._append = tagged(s.history._lookup), tagged(s.history._append)
    s.history._stash, s.history._restore = tagged(s.history._stash), tagged(s.history._restore)
    s.history._probe = tagged(s.history._probe)
    s.calib_dev._fn = tagged(s.calib_dev._fn)
    assert s.online is not None and s.online.deferred is not None and s.online.deferred.backend == "triton"
    s.online.deferred._elems = tagged(s.online.deferred._elems)
    for rec in (s.online, s.tail.online):  # the online records' kernels
        assert rec._apply_kernel is not None
        rec._apply_kernel, rec._update_elems = tagged(rec._apply_kernel), tagged(rec._update_elems)
    ag = s.agreement  # the model-agreement kernels
    assert ag is not None and ag.backend == "triton"
    ag._apply_elems, ag._share_elems, ag._update_elems = (tagged(ag._apply_elems), tagged(ag._share_elems),
                                                         tagged(ag._update_elems))
    s.stats._elems, s.stats._reduce = tagged(s.stats._elems), tagged(s.stats._reduce)  # the counters' kernels
    assert s.tail.counters.backend == "triton"
    s.tail.counters._add = tagged(s.tail.counters._add)  # the tail's chain counters
    s.tail._flags = tagged(s.tail._flags)  # the tail's after-verify flags
    monkeypatch.setattr(step_mod, "select_chains", tagged(step_mod.select_chains))
    slots = torch.tensor([0, 1, 2])
    _prefill(s, slots, [list(range(10, 40)) + list(range(10, 14)), list(range(50, 80)), list(range(90, 99)) * 3])
    model = torch.randint(3, 100, (3, GAMMA), dtype=torch.int32)
    conf = torch.rand(3, GAMMA)
    committed = torch.randint(3, 100, (3, 9), dtype=torch.int32)
    accept = torch.tensor([3, 1, 5], dtype=torch.int32)

    planner_out = torch.zeros(3, 8)
    wide_conf = torch.rand(3, 8)
    verified = torch.tensor([8, 2, 5], dtype=torch.int32)

    def one_step():
        p = s.propose(slots, model)
        s.record(slots, p, committed, accept)
        p = s.propose(slots, model, model_confidence=conf)
        s.conditional_confidence(p)
        s.planner_confidence(p, wide_conf, planner_out)
        s.record(slots, p, committed, accept, verified_len=verified)

    one_step()  # warm-up: per-batch-size constants (the fixed budget) are made once
    launches, outside = profile_call(one_step)
    # 2 x (lookup, calibration, online apply, selection, append, deferred scoring) + 2 x the tail after the model
    # chain (stash, append, lookup, restore, calibration, online apply, online update): verify_window 8 > gamma
    # leaves it 8 - gamma columns; 2 x the model agreement's apply, share and update; 2 x the counters'
    # per-request and batch kernels; 2 x the tail's flags and chain counters; with splices, 2 x 3 points x (stash,
    # append, lookup, restore, calibration); without them, 2 x the echo's probe kernel (the same 3 points).
    assert s.tail is not None and (s.splice is not None) == (splices > 0)
    assert s.echo.points == ((1, 2, 3) if splices == 0 else ())
    assert launches == 40 + (30 if splices > 0 else 2)
    assert outside == [], outside


def test_a_narrower_step_window_cuts_the_chains_and_is_counted():
    step = _wide_step(10, model_prior=0.3)
    slots = torch.tensor([3])
    copy = list(range(10, 30))
    _prefill(step, slots, [copy + [50, 51] + copy[:4]])
    model = torch.tensor([[90, 91, 92, 93]], dtype=torch.int32)
    wide = step.propose(slots, model)
    assert wide.tokens.shape == (1, 10) and int(wide.verify_len[0]) > GAMMA
    narrow = step.propose(slots, model, window=GAMMA)  # the step's verify window was narrowed to gamma
    assert narrow.tokens.shape == (1, GAMMA) and int(narrow.verify_len[0]) <= GAMMA
    assert narrow.tokens[0].tolist() == copy[4:8]  # still the n-gram chain, cut to the window
    m = step.metrics()
    assert (m["active_window_tokens"], m["window_switches"], m["narrow_window_steps"]) == (GAMMA + 1, 1, 1)
    step.propose(slots, model, window=10)
    m = step.metrics()
    assert (m["active_window_tokens"], m["window_switches"], m["narrow_window_steps"]) == (11, 2, 1)


def test_planner_confidence_keeps_dsparks_own_rows_and_gives_ngram_rows_their_calibrated_acceptance():
    """What the DSpark worker hands DSpark's planner: the model rows exactly as DSpark produced them (columns past
    the model block zeroed), the n-gram rows as per-token calibrated acceptance up to the chain's length."""
    step = _wide_step(8)
    slots = torch.tensor([0, 1, 2])
    copy = list(range(40, 60))
    _prefill(step, slots, [copy + [1, 2] + copy[:5], list(range(100, 112)), list(range(200, 214))])
    model = torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14], [15, 16, 17, 18]], dtype=torch.int64)
    conf = torch.tensor([[0.3, 0.2, 0.2, 0.2], [0.9, 0.8, 0.7, 0.6], [0.5, 0.5, 0.4, 0.3]])
    wide = torch.cat([conf, torch.full((3, 4), 0.9)], dim=1)  # DSpark drafts the whole 8-token window
    prop = step.propose(slots, model, model_confidence=conf)
    assert prop.choice.tolist() == [1, 0, 0]
    out = torch.full((3, 8), -1.0)
    res = step.planner_confidence(prop, wide, out)
    assert res.data_ptr() == out.data_ptr()
    assert out[1:, :GAMMA].tolist() == conf[1:].tolist()  # bit-exact: DSpark's own numbers
    assert float(out[1:, GAMMA:].abs().sum()) == 0.0  # past the model block: not the model chain
    n = int(step._ngram_len[0])
    assert n == 8
    q = step.q[0, :n]
    assert torch.allclose(out[0, :n], q, atol=1e-6)
    assert torch.allclose(torch.cumprod(out[0], 0), step.ngram_surv[0, :8], atol=1e-6)
    # The n-gram drafter off: the identity on DSpark's inputs (what makes it equal built-in DSPARK).
    off = _wide_step(4, enable_ngram=False)
    _prefill(off, slots, [copy + [1, 2] + copy[:5], list(range(100, 112)), list(range(200, 214))])
    p2 = off.propose(slots, model, model_confidence=conf)
    out2 = torch.zeros(3, 4)
    assert off.planner_confidence(p2, conf, out2).tolist() == conf.tolist()


def test_model_tail_extends_a_confident_model_chain_with_what_followed_it_in_the_history():
    """The model chain drafts tokens the history already holds: the n-gram tail after it (``lookup_after``) fills
    the columns past gamma, priced at the model chain's survival times its own; the planner sees the tail's
    calibrated per-token acceptance there; with ``model_tail`` 0 the chain stops at gamma."""
    copy = list(range(10, 30))
    rows = [copy + [50, 51], list(range(100, 116))]  # row 0: the model chain re-drafts copy[:4]; row 1: fresh
    slots = torch.tensor([3, 5])
    model = torch.tensor([copy[:4], [94, 95, 96, 97]], dtype=torch.int64)
    conf = torch.full((2, GAMMA), 0.97)
    step = _wide_step(10)
    assert step.tail is not None and step.tail.tail == 10 - GAMMA
    _prefill(step, slots, rows)
    prop = step.propose(slots, model, model_confidence=conf)
    assert prop.choice.tolist() == [0, 0]  # no n-gram chain: the histories' ends ([50, 51]) never repeat
    assert prop.tokens[0].tolist() == copy[:4] + copy[4:10]
    assert int(prop.verify_len[0]) > GAMMA  # the tail pays at this survival
    s_model = float(torch.cumprod(conf[0], 0)[-1])
    assert torch.allclose(prop.survival[0, GAMMA:], s_model * step.tail.surv[0], atol=1e-6)
    assert prop.tokens[1, :GAMMA].tolist() == [94, 95, 96, 97] and int(prop.verify_len[1]) <= GAMMA
    assert float(prop.survival[1, GAMMA:].abs().sum()) == 0.0  # no tail where the history has no continuation
    wide = torch.cat([conf, torch.full((2, 10 - GAMMA), 0.9)], dim=1)
    out = torch.zeros(2, 10)
    step.planner_confidence(prop, wide, out)
    assert out[0, :GAMMA].tolist() == conf[0].tolist()
    assert torch.allclose(out[0, GAMMA:], step.tail.q[0], atol=0) and float(out[1, GAMMA:].abs().sum()) == 0.0
    assert torch.allclose(torch.cumprod(out[0], 0), prop.survival[0], atol=1e-6)
    off = _wide_step(10, model_tail=0)
    assert off.tail is None
    _prefill(off, slots, rows)
    p0 = off.propose(slots, model, model_confidence=conf)
    assert int(p0.verify_len.max()) <= GAMMA and float(p0.survival[:, GAMMA:].abs().sum()) == 0.0


def test_model_tail_is_scored_only_where_the_whole_model_chain_was_committed():
    copy = list(range(10, 30))
    slots = torch.tensor([3, 5])
    step = _wide_step(10)
    _prefill(step, slots, [copy + [50, 51], copy + [50, 51]])
    model = torch.tensor([copy[:4], copy[:4]], dtype=torch.int64)
    prop = step.propose(slots, model, model_confidence=torch.full((2, GAMMA), 0.97))
    committed = torch.zeros(2, 11, dtype=torch.int32)
    committed[0, :8] = torch.tensor(copy[:4] + copy[4:7] + [7])  # model chain whole, 3 tail tokens, a bonus
    # Slot 5 committed 7 tokens that leave the model chain at its second token (as an n-gram chain would): its
    # tail followed a context the target never produced, so it must not be scored against columns 4-6.
    committed[1, :7] = torch.tensor([copy[0], 77, 78, 79, 80, 81, 5])
    step.record(slots, prop, committed, torch.tensor([8, 7], dtype=torch.int32))
    rec = step.tail.online
    # Slot 3: tail tokens 0-2 accepted, token 3 failed against the bonus (4 tried); slot 5: nothing scored.
    assert float(rec.observed[3].sum()) > 0 and float(rec.expected[3, 3]) > 0
    assert float(rec.expected[3, 4:].abs().sum()) == 0.0
    assert float(rec.observed[5].abs().sum()) == 0.0 and float(rec.expected[5].abs().sum()) == 0.0
    assert step.history.lens[3] == len(copy) + 2 + 8  # the committed tokens, not the tail, reached the history
    # Metrics: both requests verified into their tails; the counter takes the committed tokens past gamma + 1 on
    # such steps (3 on slot 3; 2 on slot 5, whose hand-made commit the verify itself could not have produced).
    m = step.metrics()
    assert int(prop.verify_len[0]) > GAMMA and int(prop.verify_len[1]) > GAMMA
    assert (m["model_tail_tokens"], m["tail_chosen"], m["accepted_tail"]) == (10 - GAMMA, 2, 3 + 2)


def test_model_splice_continues_the_model_chain_from_where_the_history_picks_it_up():
    """Option ``model_splices`` (calibration/splice.py): the model chain starts a phrase the history holds, then
    leaves it with two unsure tokens. Neither the n-gram lookup (the history ends in tokens seen nowhere else) nor
    the tail after the model chain finds anything; the splice after the model's second token does, and the
    chain verified is ``model[:2] ++`` the phrase. DSpark's planner reads the splice's own estimates past the
    splice point, and after verify the chain counts as neither the tail nor the n-gram chain."""
    copy = list(range(10, 30))
    slots = torch.tensor([3])
    model = torch.tensor([[10, 11, 99, 98]], dtype=torch.int32)
    conf = torch.tensor([[0.95, 0.95, 0.2, 0.2]])
    off = _wide_step(10)
    _prefill(off, slots, [copy + [50, 51]])
    assert off.splice is None and off.propose(slots, model, model_confidence=conf).tokens[0, :GAMMA].tolist() == \
        model[0].tolist()
    step = _wide_step(10, model_splices=3)
    assert step.splice.points == (1, 2, 3)
    _prefill(step, slots, [copy + [50, 51]])
    prop = step.propose(slots, model, model_confidence=conf)
    assert int(prop.choice[0]) == 0 and int(step.splice.point[0]) == 2
    assert prop.tokens[0, : int(prop.verify_len[0])].tolist() == copy[: int(prop.verify_len[0])]
    assert int(prop.verify_len[0]) > GAMMA
    out = torch.zeros(1, 10)
    step.planner_confidence(prop, torch.cat([conf, torch.full((1, 6), 0.9)], 1), out)
    assert out[0, :2].tolist() == conf[0, :2].tolist()
    assert torch.equal(out[0, 2:], step.splice.cond[0, 2:10]) and float(out[0, 2]) > 0
    committed = torch.tensor([copy[:8] + [7]], dtype=torch.int32)
    step.record(slots, prop, committed, torch.tensor([9], dtype=torch.int32))
    m = step.metrics()
    assert (m["tail_chosen"], m["model_splice_points"]) == (0, 3)
    assert step.history.lens[3] == len(copy) + 2 + 9


def test_model_echo_lifts_the_model_prefix_the_history_holds_and_learns_from_the_outcome():
    """Option ``model_echo`` (calibration/echo.py): the model chain copies a phrase the history holds, at an unsure
    0.5 per token, so every splice lookup matches (reach 3; the tail is off here). Once the traffic's record says
    echoes are right (R = 17.3), DSpark's planner and the selection see the lifted prefix; the record then scores
    the three echoed tokens. With ``model_echo`` off the planner reads the drafter's own confidences."""
    copy = list(range(10, 30))
    slots = torch.tensor([3])
    model = torch.tensor([copy[:GAMMA]], dtype=torch.int32)
    conf = torch.full((1, GAMMA), 0.5)
    wide = torch.cat([conf, torch.full((1, 6), 0.9)], 1)
    survs, outs = [], []
    for echo in (False, True):
        step = _wide_step(10, model_splices=3, model_echo=echo, model_tail=0)
        _prefill(step, slots, [copy + [50, 51]])
        if echo:
            step.echo.record.copy_(torch.tensor([1.0, 50.0]))
        prop = step.propose(slots, model, model_confidence=conf)
        out = torch.zeros(1, 10)
        step.planner_confidence(prop, wide, out)
        survs.append(prop.survival[0, :GAMMA].tolist())
        outs.append(out[0, :GAMMA].tolist())
    assert step.echo.reach[0] == 3 and step.echo.echoed[0, :GAMMA].tolist() == [True, True, True, False]
    assert outs[0] == conf[0].tolist()
    r = (50.0 + step.cfg.online_strength) / (1.0 + step.cfg.online_strength)  # R = (O + s) / (E + s)
    assert all(x == pytest.approx(r * 0.5 / (1 + 0.5 * (r - 1)), rel=1e-5) for x in outs[1][:3])
    assert outs[1][3] == pytest.approx(0.5, rel=1e-5)
    assert all(a > 1.8 * b for a, b in zip(survs[1][:3], survs[0][:3]))  # the selection prices it so too
    before = step.echo.record.clone()
    committed = torch.tensor([copy[:GAMMA] + [7]], dtype=torch.int32)
    step.record(slots, prop, committed, torch.tensor([GAMMA + 1], dtype=torch.int32))
    decay = float(step.echo._decay_by_bs[1])
    # the three echoed tokens accepted at p = 0.5: O += 1.5, E += 0
    torch.testing.assert_close(step.echo.record, before * decay + torch.tensor([0.0, 1.5]))
    rec = step.echo.record.tolist()
    st = step.cfg.online_strength
    assert step.metrics()["model_echo_ratio"] == pytest.approx((rec[1] + st) / (rec[0] + st), rel=1e-6)


def test_model_echo_reads_the_tails_lookup_without_splices():
    """Splices off (the default): the tail's lookup after the whole model chain is the echo's only lookup. A model
    chain that copies the history is echoed whole (reach gamma) and all its tokens are lifted; one that does not
    is left as the drafter said. No lookup is added: the tail runs its own anyway."""
    copy = list(range(10, 30))
    slots = torch.tensor([1, 2])
    model = torch.tensor([copy[:GAMMA], [90, 91, 92, 93]], dtype=torch.int32)
    conf = torch.full((2, GAMMA), 0.5)
    step = _wide_step(10)
    assert step.splice is None and step.tail is not None and step.echo is not None
    _prefill(step, slots, [copy + [50, 51], copy + [50, 51]])
    step.echo.record.copy_(torch.tensor([1.0, 50.0]))
    prop = step.propose(slots, model, model_confidence=conf)
    assert step.echo.reach[:2].tolist() == [GAMMA, 0]
    out = torch.zeros(2, 10)
    step.planner_confidence(prop, torch.cat([conf, torch.full((2, 6), 0.9)], 1), out)
    r = (50.0 + step.cfg.online_strength) / (1.0 + step.cfg.online_strength)
    assert out[0, :GAMMA].tolist() == pytest.approx([r * 0.5 / (1 + 0.5 * (r - 1))] * GAMMA, rel=1e-5)
    assert out[1, :GAMMA].tolist() == conf[1].tolist()
    assert step.metrics()["model_echo_ratio"] == 1.0  # nothing scored yet
    assert _wide_step(10, model_echo=False).echo is None and _wide_step(10, model_echo=False).metrics()[
        "model_echo_ratio"] == 0.0
    assert _wide_step(10, model_tail=0, echo_probes=0).echo is None  # no lookup after the model chain: no echo


def test_echo_probes_extend_the_reach_to_the_model_prefix_the_history_holds():
    """Option ``echo_probes`` (``ModelEcho.probe``): with the tail off, the probes after the model chain's first
    1, 2 and 3 tokens are the echo's lookups. A chain that copies the history for two tokens and then leaves it
    is echoed as far as the probe after its second token (reach 2): those two are lifted, the rest are not. The
    probes draft nothing: the chain verified is the model's own."""
    copy = list(range(10, 30))
    slots = torch.tensor([3])
    model = torch.tensor([[10, 11, 99, 98]], dtype=torch.int32)
    conf = torch.full((1, GAMMA), 0.5)
    step = _wide_step(10, model_tail=0, echo_probes=3)
    assert step.splice is None and step.tail is None and step.echo.points == (1, 2, 3)
    _prefill(step, slots, [copy + [50, 51]])
    step.echo.record.copy_(torch.tensor([1.0, 50.0]))
    prop = step.propose(slots, model, model_confidence=conf)
    assert step.echo.reach[0] == 2 and step.echo.echoed[0, :GAMMA].tolist() == [True, True, False, False]
    assert int(prop.choice[0]) == 0 and prop.tokens[0, :GAMMA].tolist() == model[0].tolist()
    out = torch.zeros(1, 10)
    step.planner_confidence(prop, torch.cat([conf, torch.full((1, 6), 0.9)], 1), out)
    r = (50.0 + step.cfg.online_strength) / (1.0 + step.cfg.online_strength)
    assert out[0, :2].tolist() == pytest.approx([r * 0.5 / (1 + 0.5 * (r - 1))] * 2, rel=1e-5)
    assert out[0, 2:GAMMA].tolist() == pytest.approx([0.5, 0.5], rel=1e-5)
    assert step.metrics()["echo_probe_points"] == 3
    assert _wide_step(10, model_tail=0, echo_probes=1).echo.points == (3,)
    with pytest.raises(ValueError, match="echo_probes"):
        HybridConfig(echo_probes=-1).validate()


def test_prefill_hook_rebuilds_a_retracted_requests_history_from_prompt_and_output():
    """SGLang re-prefills a retracted request with its prompt plus the output it had produced (``Req.output_ids``
    kept); the workers' prefill hook must start the history row from both, then the new sampled token, keeping the
    newest ``width`` tokens of a longer row. A row built from the prompt alone would draft nothing for it."""
    from types import SimpleNamespace

    from sglang_hybrid.ngram.config import NgramConfig
    from sglang_hybrid.sglang_plugin.common import write_prefill_history

    step = HybridStep(HybridConfig(), num_slots=4, width=16, gamma=GAMMA, max_bs=4, device="cpu")
    fresh = SimpleNamespace(origin_input_ids=[40, 41, 42], output_ids=[])
    retracted = SimpleNamespace(origin_input_ids=[5, 6, 7, 8, 9], output_ids=[30, 31, 32, 5, 6])
    long = SimpleNamespace(origin_input_ids=list(range(100, 120)), output_ids=[60, 61, 100, 101])  # 24 > width 16
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False), reqs=[fresh, retracted, long],
                            req_pool_indices=torch.tensor([0, 2, 3]))
    write_prefill_history(step, batch, torch.tensor([43, 7, 102], dtype=torch.int32), "cpu")
    assert step.history.lens[[0, 2, 3]].tolist() == [4, 11, 17]  # lengths count every token written
    draft = step.history.lookup(torch.tensor([0, 2, 3]), NgramConfig(n_min=2, n_max=4, max_draft=4))
    assert draft.tokens[1].tolist() == [8, 9, 30, 31] and int(draft.length[1]) == 4  # after "5 6 7"
    # The long row keeps its newest 16 tokens (109..119 60 61 100 101 102): the prompt's "100 101 102" fell off the
    # ring, so nothing is drafted; the fresh row has no repeat either.
    assert draft.length[[0, 2]].tolist() == [0, 0]
