"""``sglang_hybrid/graphs.py``: the decode step replayed as graphs equals the eager step, bit for bit.

On a CPU a stand-in capture (its replay runs the captured call again) checks what the wrapper adds: static
copies of the inputs laid out as the caller's, one pair of graphs per call shape, and the host bookkeeping of a
replay. On CUDA (``HYBRID_TEST_DEVICE=cuda``, run by ``scripts/gpu_check.sh``) the same comparison runs with
real CUDA graphs; on a CPU that test says it needs a GPU and does not run."""

from __future__ import annotations

import pytest
import torch

from sglang_hybrid.config import HybridConfig, HybridConfigError
from sglang_hybrid.graphs import GraphedStep, SharedPoolCapture, for_serving
from sglang_hybrid.step import HybridStep

GAMMA = 4


class _Replay:
    """A stand-in graph: replay runs the captured call's device work again, and (like a CUDA graph) none of its
    host-side effects: the step's host counters are put back."""

    def __init__(self, fn, step):
        self.fn, self.step, self.replays = fn, step, 0

    def replay(self):
        self.replays += 1
        st = self.step
        saved = {k: getattr(st, k) for k in st.HOST_COUNTERS}
        self.fn()
        for k, v in saved.items():
            setattr(st, k, v)


def _stand_in(step):
    return lambda fn: _Replay(fn, step)


def _step(device, corpus: str = "shared") -> HybridStep:
    cfg = HybridConfig(corpus=corpus, corpus_entries=1 << 12, model_ema=0.1)
    backend = "torch" if torch.device(device).type == "cpu" else "auto"
    return HybridStep(cfg, num_slots=8, width=64, gamma=GAMMA, max_bs=6, device=device, verify_window=10,
                      kernel_backend=backend)


def _state(step: HybridStep) -> dict:
    out = {"lens": step.history.lens, "tokens": step.history.tokens, "counters": step.stats.counters,
           "slot_stats": step.stats.slot_stats, "model_cond": step.stats.model_cond, "price": step.price,
           "host": torch.tensor([step.active_window, step.window_switches, step.narrow_steps, step._steps_host])}
    if step.corpus is not None:
        out.update(tag=step.corpus.tag, cnt=step.corpus.cnt)
    if step.online is not None:
        out.update(expected=step.online.expected, observed=step.online.observed)
    return {k: v.detach().cpu().clone() for k, v in out.items()}


def _run(runner, step: HybridStep, device, seed: int = 3) -> list:
    """Prefill 5 requests, then decode steps over changing batches (sizes 3, 5, 2), windows (10, 7) and
    input layouts (int64 slots, a sliced token tensor): the proposals, as host lists."""
    dev = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    slots_all = torch.tensor([0, 2, 3, 5, 7], dtype=torch.int32)
    prompt = torch.randint(0, 5, (5, 40), generator=g, dtype=torch.int32)
    step.on_prefill(slots_all.to(dev), prompt.to(dev), torch.tensor([40, 33, 25, 38, 12], dtype=torch.int32).to(dev),
                    prompt[:, 3].to(dev))
    out = []
    plan = [(3, 10, torch.int32), (3, 10, torch.int32), (5, 10, torch.int64), (3, 7, torch.int32),
            (5, 10, torch.int64), (3, 10, torch.int32), (2, 10, torch.int32), (5, 10, torch.int64),
            (3, 7, torch.int32), (3, 10, torch.int32)]
    for bs, window, sdt in plan:
        slots = slots_all[:bs].to(device=dev, dtype=sdt)
        rows = torch.randint(0, 5, (bs, GAMMA + 3), generator=g, dtype=torch.int64).to(dev)
        model = rows[:, 1 : 1 + GAMMA]  # a slice, as the EAGLE worker passes it
        conf = torch.rand(bs, GAMMA, generator=g).to(dev)
        p = runner.propose(slots, model, model_confidence=conf, window=window)
        w = p.tokens.shape[1]
        acc = torch.randint(0, w + 1, (bs,), generator=g, dtype=torch.int32).to(dev)
        acc = torch.minimum(acc, p.verify_len) + 1
        committed = torch.randint(0, 5, (bs, w + 1), generator=g, dtype=torch.int64).to(dev)
        snapshot = (p.tokens.cpu().tolist(), p.verify_len.cpu().tolist(), p.choice.cpu().tolist())
        runner.record(slots, p, committed, acc)
        out.append(snapshot)
    return out


def _compare(device, capture) -> GraphedStep:
    eager, graphed = _step(device), _step(device)
    runner = GraphedStep(graphed, capture=capture(graphed))
    a = _run(eager, eager, device)
    b = _run(runner, graphed, device)
    assert a == b
    sa, sb = _state(eager), _state(graphed)
    assert [k for k in sa if not torch.equal(sa[k], sb[k])] == []
    return runner


def test_stand_in_capture_equals_eager_and_replays() -> None:
    runner = _compare("cpu", _stand_in)
    # shapes: (bs 3, window 10, int32), (5, 10, int64), (3, 7, int32), (2, 10, int32): a propose and a record each
    assert runner.graphs == 8
    replays = [g.replays for g, *_ in runner._propose.values()]
    assert sorted(replays) == [0, 1, 2, 3], replays  # first calls run eagerly; repeats replay


def test_a_replay_that_ran_nothing_would_be_caught() -> None:
    """The comparison above has teeth: a capture whose replay does nothing diverges from the eager step."""
    with pytest.raises(AssertionError):
        _compare("cpu", lambda step: (lambda fn: _Replay(lambda: None, step)))


def test_a_failed_capture_leaves_that_shape_eager(caplog) -> None:
    """A capture that raises (an op CUDA graphs refuse, say) is logged, and that call shape runs eagerly."""

    def failing(step):
        def capture(fn):
            raise RuntimeError("operation not permitted when stream is capturing")
        return capture

    with caplog.at_level("WARNING", logger="sglang_hybrid"):
        runner = _compare("cpu", failing)
    assert runner.graphs == 0 and len(runner._propose) == 4
    assert "this call shape runs eagerly" in caplog.text


def test_for_serving_follows_the_option() -> None:
    s = _step("cpu")
    assert for_serving(s) is s
    on = HybridStep(HybridConfig(step_graphs="on"), num_slots=2, width=32, gamma=GAMMA, max_bs=2, device="cpu",
                    kernel_backend="torch")
    with pytest.raises(HybridConfigError, match="'step_graphs'.*CUDA"):
        for_serving(on)


def test_real_cuda_graphs_equal_eager(kernel_device) -> None:
    if kernel_device.type != "cuda":
        pytest.skip("needs a GPU: CUDA graphs (scripts/gpu_check.sh runs this with HYBRID_TEST_DEVICE=cuda)")
    runner = _compare(kernel_device, lambda step: SharedPoolCapture())
    assert runner.graphs == 8 and runner._capture.pool is not None  # eight graphs, one memory pool
