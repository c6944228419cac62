"""``calibration/counters_kernel.py``: ``ChainCounters.add`` as one Triton launch, against its torch method (the
reference and the CPU's path) bit for bit, and both against a plain-Python oracle. On the ``kernel_device``
(``cpu`` under the Triton interpreter; ``cuda`` in ``scripts/gpu_check.sh``)."""

from __future__ import annotations

import os
import random

if "TRITON_INTERPRET" not in os.environ:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/conftest.py does it too)

import pytest
import torch

from sglang_hybrid.calibration.counters import ChainCounters
from sglang_hybrid.calibration.counters_kernel import chain_counters_add_triton


def _step(cc: ChainCounters, used: list[bool], counts: torch.Tensor) -> None:
    u = cc.rows(len(used))[0]
    u.copy_(torch.tensor(used, dtype=torch.bool))
    cc.add(counts.to(cc.counters.device))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_equals_the_torch_method_and_an_oracle_over_many_steps(seed: int, kernel_device: torch.device) -> None:
    """Batches of 1 to 600 (one and several loop blocks, a partial last one), int32 and int64 counts, counts under
    the offset and negative (clamped to 0), all / none / some requests marked; every buffer equal after every
    step, and the running counters equal the oracle's."""
    rng = random.Random(seed)
    offset = rng.choice([1, 8])
    ref = ChainCounters(600, "cpu", ("n", "acc"), offset=offset, backend="torch")
    ker = ChainCounters(600, kernel_device, ("n", "acc"), offset=offset, backend="triton")
    want = [0, 0]
    for step in range(12):
        bs = rng.choice([1, 3, 255, 256, 257, 600])
        used = [rng.random() < p for p in [rng.choice([0.0, 0.5, 1.0])] * bs]
        dtype = torch.int32 if step % 2 else torch.int64
        counts = torch.tensor([rng.randint(-3, offset + 20) for _ in range(bs)], dtype=dtype)
        _step(ref, used, counts)
        _step(ker, used, counts)
        for a, b in zip(ref.rows(bs) + (ref._step, ref.counters), ker.rows(bs) + (ker._step, ker.counters)):
            assert torch.equal(a, b.cpu()), (step, a, b)
        want[0] += sum(used)
        want[1] += sum(max(c - offset, 0) for c, u in zip(counts.tolist(), used) if u)
        assert ref.counters.tolist() == want
        if kernel_device.type == "cuda":
            torch.cuda.synchronize()
        assert ker.counts() == {"n": want[0], "acc": want[1]}


def test_strided_inputs_and_an_empty_batch(kernel_device: torch.device) -> None:
    """A mask and counts that are every other element of wider tensors; a batch of 0 changes nothing."""
    dev = kernel_device
    ref = ChainCounters(4, "cpu", ("n", "acc"), offset=1, backend="torch")
    ker = ChainCounters(4, dev, ("n", "acc"), offset=1, backend="triton")
    used = torch.tensor([True, False, False, False, True, True, True, True], dtype=torch.bool)[::2]
    counts = torch.tensor([5, 0, 9, 0, 1, 0, 3, 0], dtype=torch.int32)[::2]
    for cc, d in ((ref, "cpu"), (ker, dev)):
        used_i, acc = cc.rows(4)[1], cc.rows(4)[2]
        cc._add(used.to(d), used_i, acc, counts.to(d))
    assert ref.counters.tolist() == ker.counters.cpu().tolist() == [3, 4 + 2]  # rows 0, 2, 3: 4 + 0 + 2
    chain_counters_add_triton(ker, torch.zeros(0, dtype=torch.bool, device=dev),
                              torch.zeros(0, dtype=torch.int64, device=dev), torch.zeros(0, dtype=torch.int64, device=dev),
                              torch.zeros(0, dtype=torch.int32, device=dev))
    assert ker.counters.cpu().tolist() == [3, 6]
