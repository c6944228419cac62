"""The start-up warm-up (``sglang_hybrid/warmup.py``): it launches the step's kernels at every batch-size class
and leaves the step exactly as it found it, so serving after a warm-up equals serving without one."""

from __future__ import annotations

import pytest
import torch

from sglang_hybrid import step as step_mod
from sglang_hybrid.config import HybridConfig
from sglang_hybrid.step import HybridStep
from sglang_hybrid.warmup import warm_up, warmup_batch_sizes

GAMMA = 4


def _step(corpus: str = "shared", backend: str = "torch") -> HybridStep:
    cfg = HybridConfig(corpus=corpus, corpus_entries=1 << 12, model_ema=0.1)
    return HybridStep(cfg, num_slots=8, width=64, gamma=GAMMA, max_bs=6, device="cpu", verify_window=10,
                      kernel_backend=backend)


def _state(step: HybridStep) -> dict:
    """Every tensor and host scalar the step reaches through attributes, by attribute path (the selection's
    per-batch-size view cache, a dict the warm-up fills, holds only views of buffers compared here)."""
    out: dict = {}

    def walk(o, path: str, seen: set) -> None:
        seen.add(id(o))
        for k, v in vars(o).items():
            if isinstance(v, torch.Tensor):
                out[f"{path}.{k}"] = v.clone()
            elif isinstance(v, (bool, int, float)):
                out[f"{path}.{k}"] = v
            elif hasattr(v, "__dict__") and type(v).__module__.startswith("sglang_hybrid") and id(v) not in seen:
                walk(v, f"{path}.{k}", seen)

    walk(step, "step", set())
    assert "step.history.lens" in out and "step.stats.counters" in out
    return out


def _equal(a: dict, b: dict) -> list:
    assert a.keys() == b.keys()
    return [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]


def _serve(step: HybridStep, steps: int = 6) -> list:
    """Prefill three requests with repeating text, then decode steps; the proposals, as host lists."""
    g = torch.Generator().manual_seed(7)
    slots = torch.tensor([0, 3, 5], dtype=torch.int32)
    prompt = torch.randint(0, 6, (3, 40), generator=g, dtype=torch.int32)
    step.on_prefill(slots, prompt, torch.tensor([40, 33, 25], dtype=torch.int32), prompt[:, 5])
    out = []
    for _ in range(steps):
        model = torch.randint(0, 6, (3, GAMMA), generator=g, dtype=torch.int32)
        p = step.propose(slots, model, model_confidence=torch.rand(3, GAMMA, generator=g))
        committed = torch.randint(0, 6, (3, p.tokens.shape[1] + 1), generator=g, dtype=torch.int32)
        acc = torch.minimum(p.verify_len, torch.randint(0, 11, (3,), generator=g, dtype=torch.int32)) + 1
        step.record(slots, p, committed, acc)
        out.append((p.tokens.tolist(), p.verify_len.tolist(), p.choice.tolist()))
    return out


def test_batch_sizes_cover_every_compile_class() -> None:
    assert warmup_batch_sizes(1) == [1]
    assert warmup_batch_sizes(6) == [1, 2, 4, 6]
    assert warmup_batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert warmup_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="max_bs"):
        warmup_batch_sizes(0)


@pytest.mark.parametrize("corpus,backend", [("off", "torch"), ("shared", "torch"), ("shared", "triton")])
def test_warm_up_restores_every_bit_of_state(corpus: str, backend: str) -> None:
    """(``triton`` runs the kernels under the interpreter on a CPU: fewer sizes and steps, for time.)"""
    fresh, warmed = _step(corpus, backend), _step(corpus, backend)
    before = _state(warmed)
    assert _equal(before, _state(fresh)) == []
    sizes, secs = warm_up(warmed, [2] if backend == "triton" else None)
    assert sizes == ([2] if backend == "triton" else [1, 2, 4, 6]) and secs >= 0
    assert _equal(before, _state(warmed)) == []
    # ... and serving afterwards is the same, bit for bit, as on a step that never warmed up
    n = 2 if backend == "triton" else 6
    assert _serve(warmed, n) == _serve(fresh, n)
    assert _equal(_state(warmed), _state(fresh)) == []


def test_warm_up_refuses_a_step_that_holds_requests() -> None:
    """The workers warm up before the first request; the restore relies on it (histories start at column 0)."""
    s = _step()
    _serve(s, steps=1)
    before = _state(s)
    with pytest.raises(ValueError, match="before the first request"):
        warm_up(s)
    assert _equal(before, _state(s)) == []


def test_warm_up_launches_the_selection_at_each_size(monkeypatch) -> None:
    seen = []
    real = step_mod.select_chains

    def spy(model_tokens, *a, **k):
        seen.append(model_tokens.shape[0])
        return real(model_tokens, *a, **k)

    monkeypatch.setattr(step_mod, "select_chains", spy)
    s = _step("off")
    warm_up(s, [1, 2, 4])
    assert seen == [1, 2, 4]
    with pytest.raises(ValueError, match="batch sizes"):
        warm_up(s, [7])


def test_worker_style_inputs_int64_slices_and_window() -> None:
    """The EAGLE worker's layout (int64 slots, the model chain a slice of the draft-token rows, a window)."""
    s, fresh = _step("off"), _step("off")
    before = _state(s)

    def inputs(bs: int) -> dict:
        tokens = torch.zeros(bs, 11, dtype=torch.int64)
        return {"slots": torch.arange(bs, dtype=torch.int64), "model_tokens": tokens[:, 1 : 1 + GAMMA], "window": 8}

    assert warm_up(s, inputs=inputs)[0] == [1, 2, 4, 6]
    assert s.active_window == fresh.active_window and s.window_switches == 0  # host counters restored
    assert _equal(before, _state(s)) == []


@pytest.mark.parametrize("mode,runs", [("auto", False), ("on", True), ("off", False)])
def test_serving_entry_follows_the_option(mode: str, runs: bool, monkeypatch) -> None:
    """On a CPU: ``auto`` and ``off`` run nothing, ``on`` runs the warm-up."""
    from sglang_hybrid import warmup as wmod

    calls = []
    monkeypatch.setattr(wmod, "warm_up", lambda step, inputs=None: (calls.append(inputs), ([1], 0.0))[1])
    cfg = HybridConfig(warmup=mode)
    s = HybridStep(cfg, num_slots=2, width=32, gamma=GAMMA, max_bs=2, device="cpu", kernel_backend="torch")
    wmod.warm_up_for_serving(s, inputs="layout")
    assert calls == (["layout"] if runs else [])
    m = s.metrics()
    assert (m.get("warmup_batch_sizes"), m.get("warmup_max_batch_size")) == ((1, 1) if runs else (None, None))
