"""``calibration/tail_kernel.py``: ``ModelTail.update``'s flags as one Triton launch, against the torch method (the
reference and the CPU's path) bit for bit, and both against a plain-Python oracle. On the ``kernel_device``
(``cpu`` under the Triton interpreter; ``cuda`` in ``scripts/gpu_check.sh``)."""

from __future__ import annotations

import os
import random

if "TRITON_INTERPRET" not in os.environ:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/conftest.py does it too)

import pytest
import torch

from sglang_hybrid.calibration.tail import ModelTail
from sglang_hybrid.ngram.config import NgramConfig


def _tail(dev, gamma: int, max_bs: int, backend: str) -> ModelTail:
    return ModelTail(max_bs + 2, max_bs, gamma, NgramConfig(n_min=2, n_max=4, max_draft=5), dev, online=False,
                     backend=backend)


def _flags(t: ModelTail, bs: int, cused):
    v = t._views(bs)
    out = [v.eq, v.whole, v.n, t.counters.rows(bs)[0], v.is_model] + ([cused] if cused is not None else [])
    return [x.cpu().clone() for x in out]


@pytest.mark.parametrize("gamma", [1, 3, 7])
@pytest.mark.parametrize("seed", [0, 1])
def test_kernel_equals_the_torch_method_and_an_oracle(gamma: int, seed: int, kernel_device: torch.device) -> None:
    """Batches across programs, committed rows that agree with the model chain wholly, partly or not at all,
    counts under gamma and int32 / int64, choices 0 / 1 / 2, verified around gamma, each part on and off."""
    rng = random.Random(seed * 10 + gamma)
    dev = kernel_device
    for trial in range(8):
        bs = rng.choice([1, 5, 32, 33, 70])
        online, count, with_c = trial % 2 == 0, trial % 4 < 2 or trial == 7, trial % 3 != 0
        if not (online or count):
            online = True
        K = gamma + rng.randint(1, 6)
        model = torch.randint(0, 3, (bs, gamma), dtype=torch.int32)
        wide = torch.randint(0, 3, (bs, K + 4), dtype=torch.int32)  # rows wider than committed: a row stride
        for b in range(bs):
            if rng.random() < 0.5:
                wide[b, :gamma] = model[b]
        committed = wide[:, :K]
        if trial in (2, 4) and bs > 1:  # a column stride too (the torch path takes any layout; so must the kernel)
            committed = wide.t().contiguous().t()[:, :K]
            assert committed.stride(1) != 1
        cdt = torch.int64 if trial % 2 else torch.int32
        counts = torch.randint(0, K + 1, (bs,), dtype=cdt)
        choice = torch.randint(0, 3, (bs,), dtype=torch.int32)
        verified = torch.randint(0, K + 1, (bs,), dtype=cdt)
        pick = torch.rand(bs) < 0.5
        got = []
        for d, backend in ((torch.device("cpu"), "torch"), (dev, "triton")):
            t = _tail(d, gamma, 80, backend)
            v = t._views(bs)
            v.tok_model.copy_(model.to(d))
            v.pick.copy_(pick.to(d))
            for buf in (v.eq, v.whole, v.is_model, t.counters.rows(bs)[0]):
                buf.fill_(True)
            v.n.fill_(-7)
            cused = torch.ones(bs, dtype=torch.bool, device=d) if count and with_c else None
            t._flags(committed.to(d), counts.to(d), choice.to(d) if count else None,
                     verified.to(d) if count else None, online, cused)
            got.append(_flags(t, bs, cused))
        for a, b in zip(*got):
            assert torch.equal(a, b), (trial, a, b)
        eq, whole, n, used, ism = got[0][:5]
        for b in range(bs):
            w = committed[b, :gamma].tolist() == model[b].tolist()
            if online:
                assert bool(whole[b]) == w and int(n[b]) == (max(int(counts[b]) - gamma, 0) if w else 0)
            else:
                assert int(n[b]) == -7 and bool(whole[b])  # untouched
            if count:
                u = int(verified[b]) > gamma and int(choice[b]) == 0
                assert bool(used[b]) == u and bool(ism[b]) == (int(choice[b]) == 0)
                if with_c:
                    assert bool(got[0][5][b]) == (u and bool(pick[b]))
            else:
                assert bool(used[b]) and bool(ism[b])  # untouched
