"""Splices of the model chain (``calibration/splice.py``): the chain cut after its first ``k`` tokens and continued
by the request's own n-gram lookup, kept where its surplus at the last step's price beats the model chain's by
more than the margin.

The reference is a per-row loop that builds each splice's lookup from scratch: a fresh ``TokenHistory`` holding
``history ++ model[:k]`` (not ``run_after``), the calibration applied to that one row, and the surpluses summed in
float64. The step's buffers must give the same chosen point, tokens and survivals, leave the history unchanged,
and allocate nothing outside the kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration.echo import ModelEcho, lift_ref
from sglang_hybrid.calibration.splice import ModelSplice, make_step_splice, splice_points
from sglang_hybrid.ngram import NgramConfig, TokenHistory
from sglang_hybrid.sim.runner import load_calibration
from sglang_hybrid.step import sync_guard
from tests.alloc_probe import profile_call, tagged

GAMMA, WIDTH, SLOTS, ROW = 7, 16, 6, 128
CFG = NgramConfig(n_min=2, n_max=8, max_draft=WIDTH, window=0)


def _calibration():
    return load_calibration(None).to_device("cpu")


def _histories(rng: np.random.Generator) -> list[list[int]]:
    """Rows with repeated phrases, so that lookups after a model prefix find continuations."""
    rows = []
    for _ in range(SLOTS):
        phrase = list(rng.integers(3, 60, size=int(rng.integers(6, 14))))
        noise = list(rng.integers(3, 60, size=int(rng.integers(0, 5))))
        rows.append([int(t) for t in phrase + noise + phrase + noise[:2] + phrase[: int(rng.integers(1, 5))]])
    return rows


def _model_chains(rng: np.random.Generator, rows: list[list[int]]) -> torch.Tensor:
    """Half the rows continue the phrase the history ends in (a splice can then continue it), the rest are random."""
    out = torch.zeros(len(rows), GAMMA, dtype=torch.int32)
    for b, row in enumerate(rows):
        if b % 2 == 0:
            start = int(rng.integers(0, max(1, len(row) // 3)))
            chain = row[start : start + GAMMA]
            chain = chain + [3] * (GAMMA - len(chain))
            j = int(rng.integers(2, GAMMA))  # the model departs from the text at j
            chain[j] = 61 + b
        else:
            chain = [int(t) for t in rng.integers(3, 60, size=GAMMA)]
        out[b] = torch.tensor(chain, dtype=torch.int32)
    return out


def _table(rows: list[list[int]]) -> TokenHistory:
    h = TokenHistory(SLOTS, ROW, "cpu", backend="torch", max_draft=WIDTH)
    p = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.int32)
    for b, r in enumerate(rows):
        p[b, : len(r)] = torch.tensor(r, dtype=torch.int32)
    h.write_prompt(torch.arange(len(rows)), p, torch.tensor([len(r) for r in rows], dtype=torch.int32))
    return h


def _reference(rows, slots, calib, tokens, survival, model_surv, price, points, margin, draft_cfg, r=1.0):
    """Per row: the kept point, tokens and survivals, and the echo's reach, from scratch (``r``: the echo's odds
    ratio, ``lift_ref``)."""
    bs, w = tokens.shape
    point, reach = np.zeros(bs, dtype=np.int64), np.zeros(bs, dtype=np.int64)
    tok, sv = tokens.clone(), survival.clone()
    for b in range(bs):
        cands = []
        for k in points:
            h = _table([rows[int(slots[b])] + tokens[b, :k].tolist()])
            d = h.lookup(torch.tensor([0]), draft_cfg)
            q = torch.zeros(1, draft_cfg.max_draft)
            s = torch.zeros(1, draft_cfg.max_draft)
            calib.apply(d, torch.full((1, 1), -1, dtype=torch.int32), q, s)
            if int(d.length[0]) > 0:
                cands.append((k, d.tokens[0], s[0]))
                reach[b] = k
        rb = torch.tensor([reach[b]])
        sv[b] = lift_ref(survival[b : b + 1], rb, r)[0][0].float()
        msv = lift_ref(model_surv[b : b + 1], rb, r)[0][0].float()
        best = float(np.maximum(sv[b].double().numpy() - float(price), 0).sum()) + margin
        for k, dt, ds in cands:
            n = w - k
            ct = torch.cat([tokens[b, :k], dt[:n]])
            cs = torch.cat([msv[:k], ds[:n] * msv[k - 1]])
            cand = float(np.maximum(cs.double().numpy() - float(price), 0).sum())
            if cand > best:
                best, point[b], tok[b], sv[b] = cand, k, ct, cs
    return point, tok, sv, reach


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("margin", [0.0, 0.2])
@pytest.mark.parametrize("echo", [(0.0, 0.0), (1.0, 20.0)])
def test_splice_keeps_what_a_per_row_reference_keeps(seed, margin, echo):
    """With the echo's record empty (R = 1: nothing lifted) and at R = 7 (the prefixes before the reach lifted)."""
    rng = np.random.default_rng(seed)
    rows = _histories(rng)
    h = _table(rows)
    before = (h.tokens.clone(), h.lens.clone())
    calib = _calibration()
    slots = torch.tensor([4, 0, 5, 2, 1], dtype=torch.int64)
    bs = slots.shape[0]
    model = _model_chains(rng, [rows[int(s)] for s in slots])
    conf = torch.from_numpy(rng.uniform(0.3, 1.0, size=(bs, GAMMA)).astype(np.float32))
    model_surv = torch.cumprod(conf, 1)
    tokens = torch.zeros(bs, WIDTH, dtype=torch.int32)
    tokens[:, :GAMMA] = model
    tokens[:, GAMMA:] = torch.from_numpy(rng.integers(3, 60, size=(bs, WIDTH - GAMMA)).astype(np.int32))
    survival = torch.zeros(bs, WIDTH)
    survival[:, :GAMMA] = model_surv * 0.9  # the selection's view (e.g. the agreement's shared price) may differ
    survival[:, GAMMA:] = model_surv[:, -1:] * 0.5 ** torch.arange(1, WIDTH - GAMMA + 1)
    price = torch.tensor([float(rng.uniform(0.0, 0.15))])
    points = splice_points(GAMMA, 4)
    sp = ModelSplice(8, GAMMA, WIDTH, points, CFG, margin, "cpu")
    e = ModelEcho(8, GAMMA, WIDTH, "cpu")
    e.record.copy_(torch.tensor(echo))
    e.start(bs)
    tok, sv = sp.splice(h, slots, calib, tokens, survival, model_surv, price, echo=e)
    ref_point, ref_tok, ref_sv, ref_reach = _reference(rows, slots, calib, tokens, survival, model_surv, price,
                                                       points, margin, sp.cfg, r=float(e.ratio()))
    assert sp.point[:bs].tolist() == ref_point.tolist() and e.reach[:bs].tolist() == ref_reach.tolist()
    assert torch.equal(tok, ref_tok)
    torch.testing.assert_close(sv, ref_sv, rtol=0, atol=1e-6)
    spliced = ref_point > 0
    after = torch.arange(WIDTH).view(1, -1) >= torch.from_numpy(ref_point).view(-1, 1)
    assert torch.equal(sp.after[:bs], after & torch.from_numpy(spliced).view(-1, 1))
    lifted = torch.arange(WIDTH).view(1, -1) < torch.from_numpy(ref_reach).view(-1, 1)
    assert torch.equal(e.echoed[:bs], lifted & ~sp.after[:bs])  # the columns the echo's record scores
    assert (ref_reach > 0).any()
    assert torch.equal(h.tokens, before[0]) and torch.equal(h.lens, before[1])  # the history is unchanged
    if margin == 0.0:  # the inputs are built so that both outcomes occur
        assert spliced.any() and not spliced.all()


def test_for_record_hides_spliced_chains_from_the_model_chains_records():
    """A request that verified a spliced chain reads choice 2 and at most k verified tokens; the others as given."""
    sp = ModelSplice(4, GAMMA, WIDTH, (3, 5), CFG, 0.2, "cpu")
    sp.point[:4] = torch.tensor([0, 3, 5, 5], dtype=torch.int32)
    sp._spliced[:4] = sp.point[:4] > 0
    choice = torch.tensor([0, 0, 1, 0], dtype=torch.int32)
    vlen = torch.tensor([7, 9, 9, 2], dtype=torch.int64)
    c, v = sp.for_record(choice, vlen)
    assert c.tolist() == [0, 2, 1, 2] and v.tolist() == [7, 3, 9, 2]
    assert choice.tolist() == [0, 0, 1, 0] and vlen.tolist() == [7, 9, 9, 2]  # the inputs are not changed


def test_splice_allocates_nothing_outside_the_kernels():
    rng = np.random.default_rng(3)
    rows = _histories(rng)
    h = _table(rows)
    calib = _calibration()

    h._lookup, h._append, h._stash, h._restore = (tagged(h._lookup), tagged(h._append), tagged(h._stash),
                                                  tagged(h._restore))
    calib._fn = tagged(calib._fn)
    slots = torch.tensor([0, 1, 2])
    model = _model_chains(rng, rows[:3])
    tokens = torch.zeros(3, WIDTH, dtype=torch.int32)
    tokens[:, :GAMMA] = model
    model_surv = torch.cumprod(torch.full((3, GAMMA), 0.8), 1)
    survival = torch.zeros(3, WIDTH)
    survival[:, :GAMMA] = model_surv
    price = torch.tensor([0.05])
    choice, vlen = torch.zeros(3, dtype=torch.int32), torch.full((3,), 6, dtype=torch.int32)
    committed = model.clone()
    echo = ModelEcho(4, GAMMA, WIDTH, "cpu")
    sp = ModelSplice(4, GAMMA, WIDTH, splice_points(GAMMA, 4), CFG, 0.2, "cpu")
    h.reserve_after(GAMMA)

    def one_step():  # under the host-sync guard, as the step runs it (the CPU-only argument checks are off)
        with sync_guard(True):
            echo.start(3)
            sp.splice(h, slots, calib, tokens, survival, model_surv, price, echo=echo)
            echo.score(committed, vlen)
            sp.for_record(choice, vlen)

    one_step()  # warm-up: the per-batch-size views are made once
    launches, outside = profile_call(one_step)
    assert launches == 20  # 4 splice points x (stash, append, lookup, restore, calibration)
    assert outside == [], outside


def test_make_step_splice_and_its_errors():
    assert make_step_splice(0, 0.2, width=WIDTH, gamma=GAMMA, lookup_cfg=CFG, max_bs=2, device="cpu") is None
    assert make_step_splice(4, 0.2, width=WIDTH, gamma=1, lookup_cfg=CFG, max_bs=2, device="cpu") is None
    sp = make_step_splice(20, 0.2, width=WIDTH, gamma=GAMMA, lookup_cfg=CFG, max_bs=2, device="cpu")
    assert sp.points == (1, 2, 3, 4, 5, 6) and sp.cfg.max_draft == WIDTH - 1
    with pytest.raises(ValueError, match="model_splices"):
        splice_points(GAMMA, -1)
    with pytest.raises(ValueError, match="splice_margin"):
        ModelSplice(2, GAMMA, WIDTH, (3,), CFG, -0.1, "cpu")
    with pytest.raises(ValueError, match="points"):
        ModelSplice(2, GAMMA, WIDTH, (GAMMA,), CFG, 0.2, "cpu")
    with pytest.raises(ValueError, match="columns"):
        sp.splice(None, torch.tensor([0]), None, torch.zeros(1, GAMMA, dtype=torch.int32), torch.zeros(1, GAMMA),
                  torch.zeros(1, GAMMA), torch.zeros(1))


# ---------------------------------------------------------------- the echo's probes (calibration/echo.py)


def _probe_reach_brute(seq: list[int], n: int, window: int) -> bool:
    """Whether the last ``n`` tokens of ``seq`` occurred before (an end ``e <= len - 2`` in the scanned window)."""
    t = len(seq)
    if t < n + 1:
        return False
    lo = max(0, t - 1 - window) if window else 0
    return any(e - n + 1 >= 0 and seq[e - n + 1 : e + 1] == seq[t - n :] for e in range(lo, t - 1))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("window", [0, 6])
def test_probes_reach_what_a_brute_force_scan_finds_and_what_the_splices_lookups_find(seed, window):
    """``ModelEcho.probe``: the reach is the largest probe point ``k`` where the last ``n_min`` tokens of
    ``history ++ model[:k]`` occurred before, in the lookup's window (a plain scan; histories of 0 and 1 token
    included), the same reach the splices' full lookups give at those points; the history is unchanged."""
    rng = np.random.default_rng(seed)
    rows = _histories(rng)
    rows[3], rows[5] = [], rows[5][:1]  # adversarial: no history, one token
    h = _table(rows)
    before = (h.tokens.clone(), h.lens.clone())
    cfg = NgramConfig(n_min=int(rng.integers(1, 4)), n_max=8, max_draft=WIDTH, window=window)
    slots = torch.tensor([4, 0, 5, 2, 1, 3], dtype=torch.int64)
    bs = slots.shape[0]
    model = _model_chains(rng, [rows[int(s)] for s in slots])
    points = (2, 3, 5, 6)
    echo = ModelEcho(8, GAMMA, WIDTH, "cpu", points=points, lookup_cfg=cfg)
    start = torch.tensor([0, 0, 0, 2, 0, 0], dtype=torch.int32)  # row 3: the tail's lookup matched (reach gamma)
    echo.start(bs, start)
    echo.probe(h, slots, model)
    ref = [GAMMA if int(start[b]) > 0 else max([k for k in points if _probe_reach_brute(
        rows[int(slots[b])] + model[b, :k].tolist(), cfg.n_min, window)], default=0) for b in range(bs)]
    assert echo.reach[:bs].tolist() == ref
    assert 0 < sum(r > 0 for r in ref) < bs  # both outcomes occur
    assert torch.equal(h.tokens, before[0]) and torch.equal(h.lens, before[1])
    full = ModelEcho(8, GAMMA, WIDTH, "cpu")
    full.start(bs, start)
    tokens = torch.zeros(bs, WIDTH, dtype=torch.int32)
    tokens[:, :GAMMA] = model
    surv = torch.cumprod(torch.full((bs, WIDTH), 0.8), 1)
    ModelSplice(8, GAMMA, WIDTH, points, cfg, 0.2, "cpu").splice(h, slots, _calibration(), tokens, surv,
                                                                  surv[:, :GAMMA], torch.tensor([0.05]), echo=full)
    assert torch.equal(full.reach[:bs], echo.reach[:bs])


def test_probes_allocate_nothing_outside_the_kernels():
    rng = np.random.default_rng(4)
    rows = _histories(rng)
    h = _table(rows)
    h._probe = tagged(h._probe)
    slots = torch.tensor([0, 1, 2])
    model = _model_chains(rng, rows[:3])
    echo = ModelEcho(4, GAMMA, WIDTH, "cpu", points=(4, 5, 6), lookup_cfg=CFG)

    def one_step():
        with sync_guard(True):
            echo.start(3)
            echo.probe(h, slots, model)

    one_step()
    launches, outside = profile_call(one_step)
    assert launches == 1  # one probe kernel for the 3 points
    assert outside == [], outside
