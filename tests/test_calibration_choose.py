"""``calibration/choose.py``: the better of two chains per request (the corpus candidate's and the tails' choice).

The Triton kernel (``choose_rows_triton``) equals the left-to-right reference (``choose_rows_ref``) bit for bit on
random inputs, both equal a brute-force loop, and all three functions (the torch path the CPU runs included)
agree exactly where every sum is exact (dyadic survivals), ties going to chain ``a``. On the ``kernel_device``
(``cpu`` under the Triton interpreter; ``cuda`` in ``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import os
import random

if "TRITON_INTERPRET" not in os.environ:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/conftest.py does it too)

import pytest
import torch

from sglang_hybrid.calibration.choose import choose_rows_ref, choose_rows_torch
from sglang_hybrid.calibration.choose_kernel import choose_rows_triton


def _case(rng: random.Random, bs: int, W: int, Wq: int, dyadic: bool, tie_rows: int = 0):
    """Inputs as the step holds them: rows ``[:bs]`` of wider buffers (row stride > width), survivals falling."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))

    def surv():
        q = torch.rand(bs, W, generator=g)
        if dyadic:
            q = torch.floor(q * 64) / 64
        s = torch.cumprod(q, 1) if not dyadic else q.sort(1, descending=True).values
        buf = torch.full((bs, W + 3), 7.0)  # wider rows: the kernel must honour the row stride
        buf[:, :W] = s
        return buf[:, :W]

    sa, sb = surv(), surv()
    for b in range(min(tie_rows, bs)):
        sb[b] = sa[b].flip(0) if dyadic else sa[b]  # equal sums (exact for dyadic values): chain a keeps it
    ta = torch.randint(0, 1000, (bs, W), generator=g, dtype=torch.int32)
    tb = torch.randint(0, 1000, (bs, W), generator=g, dtype=torch.int32)
    la = torch.randint(0, W + 1, (bs,), generator=g, dtype=torch.int32)
    lb = torch.randint(0, W + 1, (bs,), generator=g, dtype=torch.int32)
    qa, qb = torch.rand(bs, Wq, generator=g), torch.rand(bs, Wq, generator=g)
    return sa, sb, ta, tb, la, lb, qa, qb


def _run(fn, dev, case, w: int, with_len: bool, with_q: bool, alias: bool):
    """Call ``fn`` on copies of ``case`` on ``dev``; returns every output on the CPU."""
    sa, sb, ta, tb, la, lb, qa, qb = (t.clone().to(dev) for t in case)
    bs = sa.shape[0]
    e_a, e_b = torch.full((bs,), -1.0, device=dev), torch.full((bs,), -1.0, device=dev)
    pick = torch.zeros(bs, dtype=torch.bool, device=dev)
    tok_out = ta if alias else torch.full_like(ta, -9)
    len_out = torch.full_like(la, -9) if with_len else None
    q_out = (qa if alias else torch.full_like(qa, -9.0)) if with_q else None
    fn(sa, sb, w, e_a, e_b, pick, ta, tb, tok_out, la if with_len else None, lb if with_len else None, len_out,
       qa if with_q else None, qb if with_q else None, q_out)
    outs = [sa, e_a, e_b, pick, tok_out] + ([len_out] if with_len else []) + ([q_out] if with_q else [])
    return [t.cpu() for t in outs]


def _oracle(case, w: int):
    """Brute force, row by row, summing left to right in float32."""
    sa, sb, ta, tb, la, lb, qa, qb = case
    picks, surv, tok, ln, q = [], [], [], [], []
    for b in range(sa.shape[0]):
        ea = eb = torch.zeros((), dtype=torch.float32)
        for j in range(w):
            ea, eb = ea + sa[b, j], eb + sb[b, j]
        p = bool(eb > ea)
        picks.append(p)
        surv.append((sb if p else sa)[b].tolist())
        tok.append((tb if p else ta)[b].tolist())
        ln.append(int((lb if p else la)[b]))
        q.append((qb if p else qa)[b].tolist())
    return picks, surv, tok, ln, q


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_kernel_equals_the_reference_bit_for_bit_and_the_oracle(seed: int, kernel_device: torch.device) -> None:
    rng = random.Random(seed)
    for trial in range(8):
        bs = rng.choice([1, 3, 31, 32, 33, 70])  # one and several programs, a partial last block
        W = rng.choice([1, 4, 8, 16])
        w = rng.randint(0, W)  # the step's verify limit: only the first w columns are summed
        with_len, with_q, alias = trial % 2 == 0, trial % 3 == 0, trial % 4 < 2
        case = _case(rng, bs, W, rng.choice([1, 5, 9]), dyadic=False, tie_rows=2)
        ref = _run(choose_rows_ref, torch.device("cpu"), case, w, with_len, with_q, alias)
        got = _run(choose_rows_triton, kernel_device, case, w, with_len, with_q, alias)
        for x, y in zip(ref, got):
            assert torch.equal(x, y), (trial, x, y)
        picks, surv, tok, ln, q = _oracle(case, w)
        assert ref[3].tolist() == picks
        assert ref[0].tolist() == surv and ref[4].tolist() == tok
        if with_len:
            assert ref[5].tolist() == ln
        if with_q:
            assert ref[-1].tolist() == q
        assert not any(picks[:2])  # equal sums: chain a keeps the row


@pytest.mark.parametrize("seed", [0, 1])
def test_torch_path_reference_and_kernel_agree_exactly_on_exact_sums(seed: int, kernel_device: torch.device) -> None:
    """Dyadic survivals (multiples of 1/64, at most 16 of them) add exactly in any order, so the torch path (the
    CPU's ``torch.sum``) must equal the reference and the kernel everywhere, ties included."""
    rng = random.Random(100 + seed)
    for trial in range(6):
        bs, W = rng.choice([2, 17, 40]), rng.choice([4, 16])
        case = _case(rng, bs, W, 3, dyadic=True, tie_rows=bs // 2)
        w = rng.randint(1, W)
        outs = [_run(fn, dev, case, w, True, True, trial % 2 == 0)
                for fn, dev in ((choose_rows_torch, torch.device("cpu")), (choose_rows_ref, torch.device("cpu")),
                                (choose_rows_triton, kernel_device))]
        for x, y, z in zip(*outs):
            assert torch.equal(x, y) and torch.equal(y, z)


def test_torch_path_picks_as_the_reference_away_from_ties() -> None:
    """Random float32 survivals: the torch path's sums may round apart from the left-to-right ones, so its picks
    must match the reference's wherever the two sums are apart by more than rounding."""
    rng = random.Random(7)
    for _ in range(10):
        case = _case(rng, 64, 16, 2, dyadic=False)
        a = _run(choose_rows_torch, torch.device("cpu"), case, 16, True, False, False)
        b = _run(choose_rows_ref, torch.device("cpu"), case, 16, True, False, False)
        far = (b[1] - b[2]).abs() > 1e-5
        assert torch.equal(a[3][far], b[3][far])
        assert torch.allclose(a[1], b[1], atol=1e-6) and torch.allclose(a[2], b[2], atol=1e-6)


def test_bad_buffers_are_refused_and_an_empty_batch_is_a_no_op(kernel_device: torch.device) -> None:
    dev = kernel_device
    sa, sb = torch.rand(3, 4, device=dev), torch.rand(3, 4, device=dev)
    e_a, e_b, pick = torch.zeros(3, device=dev), torch.zeros(3, device=dev), torch.zeros(3, dtype=torch.bool, device=dev)
    ta = torch.zeros(3, 4, dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="w=5 outside"):
        choose_rows_triton(sa, sb, 5, e_a, e_b, pick, ta, ta.clone(), ta.clone())
    with pytest.raises(ValueError, match="tok_b has shape"):
        choose_rows_triton(sa, sb, 4, e_a, e_b, pick, ta, ta[:, :3].clone(), ta.clone())
    strided = torch.zeros(4, 3, dtype=torch.int32, device=dev).t()  # column stride 3
    with pytest.raises(ValueError, match="tok_out needs unit column stride"):
        choose_rows_triton(sa, sb, 4, e_a, e_b, pick, ta, ta.clone(), strided)
    empty = [torch.zeros(0, 4, device=dev), torch.zeros(0, 4, device=dev), 4, torch.zeros(0, device=dev),
             torch.zeros(0, device=dev), torch.zeros(0, dtype=torch.bool, device=dev)]
    et = torch.zeros(0, 4, dtype=torch.int32, device=dev)
    choose_rows_triton(*empty, et, et, et)  # nothing to do, nothing raised
