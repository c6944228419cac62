"""ModelAgreement (calibration/agreement.py): n-gram tokens re-priced beside the model chain."""

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration.agreement import ModelAgreement, agreement_ref, share_ref, update_ref
from sglang_hybrid.config import HybridConfig
from sglang_hybrid.step import HybridStep


def _case(gen, bs, L, G, vocab, cond_lo=-0.1, cond_hi=1.1):
    tok = torch.randint(0, vocab, (bs, L), dtype=torch.int32, generator=gen)
    length = torch.randint(0, L + 1, (bs,), dtype=torch.int32, generator=gen)
    q = torch.rand(bs, L, generator=gen) * (torch.arange(L)[None] < length[:, None])
    mt = torch.randint(0, vocab, (bs, G + 2), dtype=torch.int32, generator=gen)  # extra columns are not read
    mc = cond_lo + (cond_hi - cond_lo) * torch.rand(bs, G + 2, generator=gen)
    return tok, length, q, mt, mc


def _run(tok, length, q, mt, mc, G, max_bs=8, backend="torch"):
    m = ModelAgreement(max_bs, q.shape[1], G, "cpu", backend=backend)
    q2, s2 = q.clone(), torch.full_like(q, -1.0)
    m.apply(tok, length, q2, s2, mt, mc)
    return q2, s2


# "triton": the kernels of agreement_kernel.py under the interpreter (tests/test_calibration_agreement_kernel.py
# compares them with the torch ops exactly, on the GPU too).
BACKENDS = pytest.mark.parametrize("backend", ["torch", "triton"])


@BACKENDS
@pytest.mark.parametrize("L,G", [(1, 1), (4, 7), (7, 7), (16, 7), (3, 1)])
def test_batched_ops_equal_the_definition_exactly(L, G, backend):
    gen = torch.Generator().manual_seed(L * 31 + G)
    for _ in range(60):
        bs = int(torch.randint(1, 9, (), generator=gen))
        # A tiny vocabulary, so chains agree for a few tokens and part at every position.
        tok, length, q, mt, mc = _case(gen, bs, L, G, vocab=2)
        q2, s2 = _run(tok, length, q, mt, mc, G, backend=backend)
        rq, rs = agreement_ref(tok, length, q, mt[:, :G], mc[:, :G])
        assert torch.equal(q2, rq)
        assert torch.equal(s2, rs)


@BACKENDS
def test_adversarial_rows_equal_the_definition_exactly(backend):
    L, G = 6, 4
    tok = torch.tensor([[5, 6, 7, 8, 9, 10]] * 6, dtype=torch.int32)
    mt = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [1, 6, 7, 8], [5, 6, 7, 8], [5, 6, 0, 8], [5, 6, 7, 8]],
                      dtype=torch.int32)
    length = torch.tensor([6, 0, 6, 2, 6, 6], dtype=torch.int32)
    q = torch.tensor([[0.0, 0.5, 1.0, 0.3, 0.2, 0.1]] * 6) * (torch.arange(L)[None] < length[:, None])
    mc = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.9, 0.9, 0.9, 0.9], [1.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0],
                       [0.5, 0.5, 1.0, 0.5], [2.0, -1.0, 0.5, 0.5]])
    q2, s2 = _run(tok, length, q, mt, mc, G, backend=backend)
    rq, rs = agreement_ref(tok, length, q, mt, mc)
    assert torch.equal(q2, rq) and torch.equal(s2, rs)
    assert q2[0, :4].tolist() == [1.0, 1.0, 1.0, 1.0] and q2[0, 4:].tolist() == q[0, 4:].tolist()  # all agree
    assert q2[1].tolist() == [0.0] * L  # no draft: nothing priced, even where the model is confident
    assert float(q2[2, 0]) == 0.0  # parts at token 0 against a certain model token: cannot be right
    assert q2[2, 1:].tolist() == q[2, 1:].tolist()  # after the first parting: the n-gram's own estimate
    assert q2[3, 2:].tolist() == [0.0] * 4  # past its length, agreement adds nothing
    assert float(q2[4, 2]) == 0.0 and q2[4, 3:].tolist() == q[4, 3:].tolist()
    assert float(q2[5, 0]) == 1.0 and float(q2[5, 1]) == float(q[5, 1])  # confidences clamped to [0, 1]


def test_the_parting_token_is_calibrated_when_the_drafters_err_independently():
    """Brute force over a declared world: each drafter is right with its own probability, independently, and two
    wrong tokens never coincide (the simulator's model). Among rows whose chains part at token 0, the re-priced
    q'_0 must match the observed rate bucket by bucket; the n-gram's own q_0 would not."""
    rng = np.random.default_rng(7)
    n, L, G = 200_000, 3, 3
    q0 = rng.uniform(0.05, 0.95, n).astype(np.float32)
    c0 = rng.uniform(0.05, 0.95, n).astype(np.float32)
    ng_right = rng.random(n) < q0
    m_right = rng.random(n) < c0
    ref = 1
    tok = torch.zeros(n, L, dtype=torch.int32)
    tok[:, 0] = torch.from_numpy(np.where(ng_right, ref, 2).astype(np.int32))
    mt = torch.zeros(n, G, dtype=torch.int32)
    mt[:, 0] = torch.from_numpy(np.where(m_right, ref, 3).astype(np.int32))
    q = torch.zeros(n, L)
    q[:, 0] = torch.from_numpy(q0)
    mc = torch.zeros(n, G)
    mc[:, 0] = torch.from_numpy(c0)
    length = torch.ones(n, dtype=torch.int32)
    q2, _ = _run(tok, length, q, mt, mc, G, max_bs=n)
    parted = (tok[:, 0] != mt[:, 0]).numpy()
    pred = q2[:, 0].numpy()
    edges = np.linspace(0, 1, 11)
    checked = 0
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = parted & (pred >= lo) & (pred < hi)
        if m.sum() < 2000:
            continue
        checked += 1
        assert abs(ng_right[m].mean() - pred[m].mean()) < 0.02, (lo, hi)
    assert checked >= 4
    assert abs(ng_right[parted].mean() - q0[parted].mean()) > 0.1  # the n-gram's q alone is far off there
    agreed = ~parted
    assert ng_right[agreed].all()  # in this world agreement means both are right; q' never claims more than 1
    assert (pred[agreed] >= np.maximum(q0, c0)[agreed] - 1e-7).all()


def test_apply_checks_shapes():
    m = ModelAgreement(4, 5, 3, "cpu")
    with pytest.raises(ValueError, match="columns"):
        m.apply(torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), torch.zeros(2, 4),
                torch.zeros(2, 4), torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="model chain"):
        m.apply(torch.zeros(2, 5, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), torch.zeros(2, 5),
                torch.zeros(2, 5), torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=">= 1"):
        ModelAgreement(0, 5, 3, "cpu")


COPY = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
ROW = COPY + [50, 51] + COPY[:4]  # ends with a 4-token match of the span's start: the draft is 14 15 16 17 ...


def _step(**cfg):
    """A step whose slot 1 holds ``ROW``."""
    step = HybridStep(HybridConfig(**cfg), num_slots=4, width=128, gamma=4, max_bs=2, device="cpu")
    step.on_prefill(torch.tensor([1]), torch.tensor([ROW[:-1]], dtype=torch.int32),
                    torch.tensor([len(ROW) - 1], dtype=torch.int32), torch.tensor([ROW[-1]], dtype=torch.int32))
    return step


def test_a_confident_model_token_that_disagrees_keeps_the_model_chain():
    """The step: a 4-token history match whose first token a confident model disagrees with. Priced alone the
    n-gram chain wins against a doubtful model tail; beside the model it is worth little and loses."""
    slots = torch.tensor([1])
    model = torch.tensor([[90, 91, 92, 93]], dtype=torch.int32)
    conf = torch.tensor([[0.97, 0.3, 0.3, 0.3]])
    choices = {}
    for on in (False, True):
        step = _step(model_agreement=on, model_tail=0)
        prop = step.propose(slots, model, conf)
        choices[on] = int(prop.choice[0])
        if on:
            assert float(step.ngram_surv[0, 0]) < 0.05  # q (1 - 0.97) / (1 - 0.97 q)
    assert choices == {False: 1, True: 0}


def test_an_agreeing_ngram_chain_carries_the_models_confidence_on_the_shared_tokens():
    slots = torch.tensor([1])
    model = torch.tensor([[14, 15, 92, 93]], dtype=torch.int32)  # agrees with the draft 14 15 16 17 on two tokens
    conf = torch.tensor([[0.99, 0.98, 0.5, 0.5]])
    step = _step(model_tail=0)
    step.propose(slots, model, conf)
    q = step.q[0]
    assert float(q[0]) >= 0.99 - 1e-6 and float(q[1]) >= 0.98 - 1e-6
    off = _step(model_tail=0, model_agreement=False)
    off.propose(slots, model, conf)
    assert float(q[0]) > float(off.q[0, 0])
    assert float(q[2]) < float(off.q[0, 2])  # parts at token 2 from a coin-flip model token: lowered
    assert float(q[3]) == float(off.q[0, 3])  # after the parting: unchanged


@BACKENDS
@pytest.mark.parametrize("L,G,M", [(1, 1, 1), (4, 7, 7), (7, 7, 7), (16, 7, 16), (3, 5, 5)])
def test_share_and_update_equal_their_definitions(L, G, M, backend):
    """``share`` on random chains (a 2-token vocabulary: long shared prefixes and partings everywhere), with a
    record that has evidence either way; then ``update`` against random commits. ``share`` exactly, the record to
    float32 rounding."""
    gen = torch.Generator().manual_seed(100 * L + 10 * G + M)
    for trial in range(40):
        bs = int(torch.randint(1, 9, (), generator=gen))
        tok, length, q, mt, mc = _case(gen, bs, L, G, vocab=2)
        surv = torch.cumprod(q, 1)
        msurv = torch.cumprod(torch.rand(bs, M, generator=gen), 1)
        m = ModelAgreement(8, L, G, "cpu", decay=0.99, backend=backend)
        m.record.copy_(torch.rand(2, generator=gen) * 5)
        r = m.ratio().clone()
        rs, rms, rp, shared = share_ref(tok, length, surv, mt, mc, msurv, r, G)
        s2, ms2 = surv.clone(), msurv.clone()
        m.share(tok, length, s2, mt, mc, ms2)
        assert torch.equal(s2, rs) and torch.equal(ms2, rms), trial
        assert torch.equal(m._p[:bs], rp)
        K = int(torch.randint(1, G + 3, (), generator=gen))
        committed = torch.randint(0, 2, (bs, K), dtype=torch.int32, generator=gen)
        counts = torch.randint(1, K + 1, (bs,), dtype=torch.int32, generator=gen)
        want = update_ref(m.record, rp, shared, mt, committed, counts, 0.99)
        m.update(committed, counts)
        assert torch.allclose(m.record.double(), want, rtol=1e-5, atol=1e-5), (trial, m.record, want)


def test_share_learns_what_agreement_is_worth_and_prices_both_chains_alike():
    """A traffic where every shared token is accepted: the record's odds ratio grows, the shared tokens' price
    rises towards 1 on both chains, and the columns after them keep their conditionals, but for the model's
    token where the chains part. A traffic where they all fail pulls it down."""
    L, G = 6, 4
    tok = torch.tensor([[5, 6, 7, 8, 9, 10]], dtype=torch.int32)
    mt = torch.tensor([[5, 6, 1, 2]], dtype=torch.int32)  # shares 2 tokens, parts at token 2
    length = torch.tensor([6], dtype=torch.int32)
    mc = torch.tensor([[0.6, 0.5, 0.9, 0.9]])
    q = torch.tensor([[0.4, 0.7, 0.5, 0.5, 0.5, 0.5]])

    def priced(m):
        s, ms = torch.cumprod(q, 1), torch.cumprod(mc, 1)
        m.share(tok, length, s, mt, mc, ms)
        return s, ms

    for committed, direction in ((torch.tensor([[5, 6, 3]], dtype=torch.int32), 1),
                                 (torch.tensor([[4, 0, 0]], dtype=torch.int32), -1)):
        m = ModelAgreement(1, L, G, "cpu")
        s0, ms0 = priced(m)
        assert float(s0[0, 0]) == pytest.approx(0.6) and float(ms0[0, 1]) == pytest.approx(0.6 * 0.7)  # max(q, c)
        for _ in range(200):
            priced(m)
            m.update(committed, torch.tensor([3], dtype=torch.int32))
        s, ms = priced(m)
        cond = s[0] / torch.cat([torch.ones(1), s[0, :-1]])
        mcond = ms[0] / torch.cat([torch.ones(1), ms[0, :-1]])
        assert torch.allclose(cond[:2], mcond[:2])  # one price per shared token, on both chains
        assert torch.allclose(cond[2:], q[0, 2:]) and torch.allclose(mcond[3:], mc[0, 3:])
        # where they part, the model's token too is priced as one of two that cannot both be right
        q0 = 0.5 / (1 - 0.9 + 0.5 * 0.9)
        assert float(mcond[2]) == pytest.approx(0.9 * (1 - q0) / (1 - q0 * 0.9), rel=1e-5)
        if direction > 0:
            assert float(cond[0]) > 0.95 and float(cond[1]) > 0.95
        else:
            assert float(cond[0]) < 0.2


def test_the_step_scores_the_shared_tokens_after_verify():
    """HybridStep: propose shares the agreeing prefix, record scores it (only it) against the commit."""
    slots = torch.tensor([1])
    model = torch.tensor([[14, 15, 92, 93]], dtype=torch.int32)  # shares 14 15 with the draft 14 15 16 17
    step = _step(model_tail=0)
    assert torch.equal(step.agreement.record, torch.zeros(2))
    prop = step.propose(slots, model, torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    step.record(slots, prop, torch.tensor([[14, 15, 16, 0, 0]], dtype=torch.int32),
                torch.tensor([3], dtype=torch.int32))
    e, o = step.agreement.record.tolist()
    assert e == 0.0 and o > 0.0  # both shared tokens accepted: evidence that agreement is worth more
    p = step.agreement._p[0].tolist()
    assert p[2:] == [0.0, 0.0] and o == pytest.approx((1 - p[0]) + (1 - p[1]), rel=1e-5)
