"""``StepStats.update``'s per-request kernel (``sglang_hybrid/stats_kernel.py``) against its torch reference
(``StepStats._elems_torch``, the code the CPU runs) exactly, both against a plain-Python oracle, and ``StepStats``
with the kernel against the torch path over many steps (counters, per-slot statistics, the model chain's refit).

Inputs: accept lengths of 0 (nothing committed), 1 (the bonus only) and past the verify window, verify lengths
from 0, choices other than 0 / 1, int32 and int64, strided inputs, batches of one and across several programs
(``BLOCK_B`` 32). Runs on ``kernel_device`` (``scripts/gpu_check.sh`` runs it compiled on CUDA).
"""

from __future__ import annotations

import pytest
import torch

from sglang_hybrid.stats import StepStats
from sglang_hybrid.stats_kernel import BLOCK_B, stats_elems_triton

GAMMA = 5


def _stats(dev, bs, backend="torch", ema=0.3):
    return StepStats(num_slots=bs + 3, max_bs=bs, gamma=GAMMA, model_prior=0.6, model_ema=ema,
                     device=torch.device(dev), backend=backend)


def _inputs(gen, dev, bs, k):
    dt = torch.int64 if k % 2 else torch.int32
    acc = torch.randint(0, GAMMA + 4, (bs,), generator=gen).to(dt)
    vlen = torch.randint(0, GAMMA + 2, (bs,), generator=gen).to(dt)
    choice = torch.randint(0, 3 if k == 2 else 2, (bs,), generator=gen).to(dt)
    if k == 3:  # every other element of a longer tensor
        acc, vlen, choice = (torch.stack([t, t.flip(0)], 1).reshape(-1)[::2] for t in (acc, vlen, choice))
    return [t.to(dev) for t in (acc, vlen, choice)]


def _outs(dev, bs):
    return (torch.full((bs,), -5, dtype=torch.int64, device=dev), torch.full((bs,), -5, dtype=torch.int64, device=dev),
            torch.full((bs, 7), -5, dtype=torch.int64, device=dev), torch.full((bs, GAMMA), -1.0, device=dev),
            torch.full((bs, GAMMA), -1.0, device=dev))


def _oracle(acc_in, vlen_in, choice):
    """Plain Python: each request's row of ``_SUMMED`` and its tried / accepted positions."""
    rows, tried, ok = [], [], []
    for a, v, c in zip(acc_in.tolist(), vlen_in.tolist(), choice.tolist()):
        acc, ng = max(a - 1, 0), int(c == 1)
        rows.append([acc, v, 1, ng, acc * ng, acc * (1 - ng), v * (1 - ng), v * ng, v])
        t = [float(not ng and v >= j + 1 and acc >= j) for j in range(GAMMA)]
        tried.append(t)
        ok.append([float(t[j] and acc >= j + 1) for j in range(GAMMA)])
    return rows, tried, ok


@pytest.mark.parametrize("bs", [1, 6, BLOCK_B + 1, 2 * BLOCK_B + 7])
def test_kernel_equals_the_torch_ops_and_the_oracle(kernel_device, bs):
    gen = torch.Generator().manual_seed(bs)
    st = _stats(kernel_device, bs)
    for k in range(4):
        acc_in, vlen_in, choice = _inputs(gen, kernel_device, bs, k)
        for refit in (True, False):
            got = []
            for fn in (st._elems_torch, stats_elems_triton):
                outs = _outs(kernel_device, bs)
                fn(acc_in, vlen_in, choice, *outs, refit)
                got.append(outs)
            for name, a, b in zip(("acc", "vlen", "per_req", "tried", "ok"), *got):
                if name in ("tried", "ok") and not refit:
                    assert (b == -1.0).all(), name  # not written without the refit
                    continue
                assert torch.equal(a, b), (name, k, refit)
            rows, tried, ok = _oracle(acc_in.cpu(), vlen_in.cpu(), choice.cpu())
            acc, vlen, pr, tf, of = (t.cpu() for t in got[1])
            assert [[x, y] + r for x, y, r in zip(acc.tolist(), vlen.tolist(), pr.tolist())] == rows, k
            if refit:
                assert tf.tolist() == tried and of.tolist() == ok, k


def test_step_stats_with_the_kernel_follow_the_torch_path(kernel_device):
    dev = kernel_device
    gen = torch.Generator().manual_seed(3)
    bs = 6
    sts = [_stats(dev, bs, b) for b in ("torch", "triton")]
    assert [s.backend for s in sts] == ["torch", "triton"]
    for step in range(20):
        slots = torch.randperm(bs + 3, generator=gen)[:bs].to(dev)
        acc, vlen, choice = _inputs(gen, dev, bs, step % 4)
        for s in sts:
            s.update(slots, vlen, choice, acc)
    for name in ("counters", "slot_stats", "model_cond", "max_accepted", "max_verified"):
        assert torch.equal(getattr(sts[0], name), getattr(sts[1], name)), name
    assert int(sts[0].counters.sum()) > 0
    assert not torch.equal(sts[0].model_cond, torch.full((GAMMA,), 0.6, device=dev))  # the refit moved


@pytest.mark.parametrize("bs", [1, 6, 127, 128, 129, 300])
def test_reduce_kernel_equals_the_torch_ops_and_the_oracle(kernel_device, bs):
    """``stats_reduce_triton`` against ``StepStats._reduce_torch`` bit for bit over 6 steps (one and several loop
    blocks; repeated slots, whose per-slot rows add up), and both against plain Python."""
    dev = kernel_device
    gen = torch.Generator().manual_seed(100 + bs)
    from sglang_hybrid.stats import _SUMMED, C_STEPS, SLOT_STAT_NAMES
    from sglang_hybrid.stats_kernel import stats_reduce_triton

    sts = [_stats(dev, bs, b) for b in ("torch", "triton")]
    want_c, want_slot, want_ma, want_mv = [0] * 8, [[0] * 4 for _ in range(bs + 3)], 0, 0
    for step in range(6):
        acc = torch.randint(0, 30, (bs,), generator=gen, dtype=torch.int64)
        vlen = torch.randint(0, 40, (bs,), generator=gen, dtype=torch.int64)
        pr = torch.randint(0, 50, (bs, 7), generator=gen, dtype=torch.int64)
        slots = torch.randint(0, bs + 3, (bs,), generator=gen, dtype=torch.int64 if step % 2 else torch.int32)
        for s, fn in zip(sts, (sts[0]._reduce_torch, lambda *a: stats_reduce_triton(sts[1], *a))):
            s.price.fill_(0.25 * step)
            fn(*(t.to(dev) for t in (slots, acc, vlen, pr)))
        for name in ("counters", "slot_stats", "max_accepted", "max_verified", "_stage"):
            assert torch.equal(getattr(sts[0], name), getattr(sts[1], name)), (name, step)
        col = pr.sum(0).tolist()
        for j, k in enumerate(_SUMMED):
            want_c[k] += col[j]
        want_c[C_STEPS] += 1
        for b, sl in enumerate(slots.tolist()):
            for j in range(len(SLOT_STAT_NAMES)):
                want_slot[sl][j] += int(pr[b, j])
        want_ma, want_mv = max(want_ma, int(acc.max())), max(want_mv, int(vlen.max()))
        st = sts[1]
        assert st.counters.tolist() == want_c and st.slot_stats.tolist() == want_slot
        assert st.max_accepted.tolist() == [want_ma] and st.max_verified.tolist() == [want_mv]
        assert st._stage.tolist() == [float(x) for x in want_c] + [0.25 * step, float(want_ma), float(want_mv)]
