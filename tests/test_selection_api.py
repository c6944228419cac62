"""select_chains: dispatch, host-side validation naming the argument, buffers, no host synchronisation."""

from __future__ import annotations

import contextlib
import os

if (os.environ.get("HYBRID_TEST_DEVICE", "cpu") or "cpu").startswith("cpu"):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/conftest.py does it too)

import numpy as np
import pytest
import torch

from sglang_hybrid.selection import (
    SelectionArgumentError,
    SelectionBuffers,
    SelectionOutput,
    SelectionWorkspace,
    select_chains,
    select_chains_ref,
)
from tests.oracles.selection_oracle import random_instance, random_sps_curve

FIELDS = ("choice", "verify_len", "tokens", "survival", "price", "budget_used")


def _inst(bs=3, G=4, L=6, seed=0):
    return random_instance(np.random.default_rng(seed), bs=bs, gamma=G, ngram_width=L)


def test_backends_agree_and_return_out(kernel_device):
    """auto / torch / triton on ``kernel_device`` (auto = Triton on CUDA, torch on CPU) against the CPU reference."""
    mt, ms, nt, ns, nl = _inst()
    ref = SelectionBuffers(3, 6).view(3)
    select_chains_ref(mt, ms, nt, ns, nl, torch.tensor([6], dtype=torch.int32), None, ref)
    args = [t.to(kernel_device) for t in (mt, ms, nt, ns, nl)]
    budget = torch.tensor([6], dtype=torch.int32, device=kernel_device)
    for backend in ("auto", "torch", "triton"):
        out = SelectionBuffers(3, 6, kernel_device).view(3)
        assert select_chains(*args, budget, None, out, backend=backend) is out
        for f in FIELDS:
            assert torch.equal(getattr(out, f).cpu(), getattr(ref, f)), (backend, f)


def test_buffers_views_share_storage():
    buf = SelectionWorkspace(8, 5)
    v3, v8 = buf.view(3), buf.view(8)
    assert buf.view(3) is v3
    assert v3.tokens.shape == (3, 5) and v3.choice.shape == (3,) and v3.price.shape == (1,)
    assert v3.tokens.data_ptr() == v8.tokens.data_ptr() and v3.tokens.is_contiguous()
    for bad in (0, 9):
        with pytest.raises(ValueError, match="bs must be in"):
            buf.view(bad)
    with pytest.raises(ValueError, match="max_bs"):
        SelectionBuffers(0, 4)
    assert isinstance(SelectionOutput.empty(2, 3), SelectionOutput)


def _call(**over):
    mt, ms, nt, ns, nl = _inst()
    args = dict(model_tokens=mt, model_surv=ms, ngram_tokens=nt, ngram_surv=ns, ngram_len=nl,
                budget=torch.tensor([4], dtype=torch.int32), sps=None, out=SelectionBuffers(3, 6).view(3))
    kw = {k: over.pop(k) for k in ("num_iters", "survival_eps", "max_verify_len", "backend") if k in over}
    args.update(over)
    return select_chains(*args.values(), **kw)


def _out(**fields):
    o = SelectionBuffers(3, 6).view(3)
    return SelectionOutput(**{f: fields.get(f, getattr(o, f)) for f in FIELDS})


@pytest.mark.parametrize(
    "over,needle",
    [
        (dict(model_tokens=torch.zeros(3, 4, dtype=torch.int64)), "'model_tokens' must have dtype torch.int32"),
        (dict(model_tokens=torch.zeros(3, dtype=torch.int32)), "'model_tokens' must be 2-D"),
        (dict(model_tokens=torch.zeros(0, 4, dtype=torch.int32)), "'model_tokens' must have at least one row"),
        (dict(model_surv=torch.zeros(3, 5)), "'model_surv' must have the shape of model_tokens"),
        (dict(model_surv=torch.zeros(3, 4, dtype=torch.float64)), "'model_surv' must have dtype torch.float32"),
        (dict(ngram_tokens=torch.zeros(2, 6, dtype=torch.int32)), "'ngram_tokens' must have bs=3 rows"),
        (dict(ngram_surv=torch.zeros(3, 5)), "'ngram_surv' must have the shape of ngram_tokens"),
        (dict(ngram_len=torch.zeros(3, dtype=torch.int64)), "'ngram_len' must have dtype torch.int32"),
        (dict(ngram_len=torch.zeros(4, dtype=torch.int32)), "'ngram_len' must have shape (3,)"),
        (dict(budget=None), "exactly one must be given"),
        (dict(sps=torch.ones(40)), "exactly one must be given"),
        (dict(budget=torch.tensor([4])), "'budget' must have dtype torch.int32"),
        (dict(budget=torch.tensor([4, 5], dtype=torch.int32)), "'budget' must have shape (1,)"),
        (dict(budget=None, sps=torch.ones(21)), "'sps' must have at least bs*(1+Lm)+1 = 22"),
        (dict(budget=None, sps=torch.ones(22, dtype=torch.float64)), "'sps' must have dtype torch.float32"),
        (dict(model_surv=torch.zeros(3, 4, device="meta")), "'model_surv' must be on cpu"),
        (dict(out="nope"), "'out' must be a SelectionOutput"),
        (dict(out=SelectionBuffers(3, 7).view(3)), "'out.tokens' must have shape (3, 6)"),
        (dict(out=SelectionBuffers(4, 6).view(4)), "'out.choice' must have shape (3,)"),
        (dict(out=_out(survival=torch.zeros(6, 3).t())), "'out.survival' must be contiguous"),
        (dict(out=_out(price=torch.zeros(1, dtype=torch.float64))), "'out.price' must have dtype torch.float32"),
        (dict(num_iters=-1), "'num_iters'"),
        (dict(num_iters=1.5), "'num_iters'"),
        (dict(survival_eps=-0.1), "'survival_eps'"),
        (dict(survival_eps=float("nan")), "'survival_eps'"),
        (dict(max_verify_len=7), "'max_verify_len' must be an int in [0, Lm=6]"),
        (dict(max_verify_len=-1), "'max_verify_len'"),
        (dict(backend="cuda"), "'backend' must be one of"),
    ],
)
def test_validation_names_the_argument(over, needle):
    with pytest.raises(SelectionArgumentError) as e:
        _call(**over)
    assert needle in str(e.value), str(e.value)


def test_triton_backend_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SelectionArgumentError, match="'backend'='triton' needs CUDA tensors"):
        _call(backend="triton")


@contextlib.contextmanager
def _no_host_reads():
    names = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def raiser(name):
        def f(*a, **k):
            raise AssertionError(f"host read: Tensor.{name}")
        return f

    try:
        for n in names:
            setattr(torch.Tensor, n, raiser(n))
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.Tensor, n, fn)


@pytest.mark.parametrize("mode", ["budget", "sps"])
def test_reference_never_reads_device_data_on_the_host(mode):
    rng = np.random.default_rng(3)
    mt, ms, nt, ns, nl = random_instance(rng, bs=5, gamma=4, ngram_width=6)
    budget = torch.tensor([7], dtype=torch.int32) if mode == "budget" else None
    sps = None if mode == "budget" else random_sps_curve(rng, 5 * 7 + 1)
    out = SelectionBuffers(5, 6).view(5)
    with _no_host_reads():
        select_chains(mt, ms, nt, ns, nl, budget, sps, out, backend="torch")
    ref = SelectionBuffers(5, 6).view(5)
    select_chains_ref(mt, ms, nt, ns, nl, budget, sps, ref)
    assert all(torch.equal(getattr(out, f), getattr(ref, f)) for f in FIELDS)
