"""CUDA-graph replay of a :class:`~sglang_hybrid.step.HybridStep`'s ``propose`` and ``record`` (option
``step_graphs``).

Why: on an H200 the step launched eagerly from Python took 4-8 ms, and 0.4-0.6 ms as a graph replay
(``scripts/bench_step.py``, ``docs/gpu/2026-12-04-h200.md``). The step was built for capture: fixed shapes per
batch size, no host reads, no allocation outside preallocated buffers.

How: each call shape (batch size, window, dtypes and strides of the inputs) gets its graphs at its first call.
That call runs eagerly, so Triton compiles and the per-size constants are built, and it is the real step for
that call. Then the same call is captured on static copies of its inputs (capture executes nothing). Later
calls of that shape copy their inputs into the static buffers and replay. The step's outputs live in its
preallocated buffers, so the proposal a replay returns is the one the capture saw. The host-side bookkeeping
that ``propose`` and ``record`` do in Python (window switches, the step count behind ``should_log``) runs on
every call, replayed or not.

``tests/test_step_graphs.py`` checks graphed == eager: on a CPU with a stand-in capture (the bookkeeping,
static copies and keys), and on CUDA with real graphs (``HYBRID_TEST_DEVICE=cuda``, run by
``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from .config import HybridConfigError
from .step import HybridStep, Proposal


def cuda_capture(fn: Callable[[], None], pool=None):
    """Capture ``fn`` in a CUDA graph on a side stream; returns the graph (``.replay()``). ``pool``: a memory pool
    (``torch.cuda.graph_pool_handle()``) shared with other captures."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    # thread_local: the capture happens while serving, and SGLang's other threads may touch CUDA meanwhile
    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


class SharedPoolCapture:
    """:func:`cuda_capture` with one memory pool for all of a step's graphs. The step's outputs live in its own
    buffers, so what a graph allocates is scratch, dead when its replay ends; the graphs replay one at a time on
    one stream, so they can share it. One pool per graph would hold at least a 2 MiB segment each, and a server
    can meet hundreds of call shapes. SGLang shares one pool across its own decode graphs in the same way."""

    def __init__(self) -> None:
        self.pool = None

    def __call__(self, fn: Callable[[], None]):
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        return cuda_capture(fn, self.pool)


def _sig(t: Optional[torch.Tensor]):
    return None if t is None else (tuple(t.shape), t.dtype, tuple(t.stride()), t.device)


def _static(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A buffer laid out as ``t``: shape, dtype, strides and storage offset (Triton compiles per stride class and
    pointer alignment, so the capture launches the kernels the eager call compiled)."""
    if t is None:
        return None
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else 0
    base = torch.zeros(t.storage_offset() + span, dtype=t.dtype, device=t.device)
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def _fill(dst: Optional[torch.Tensor], src: Optional[torch.Tensor]) -> None:
    if dst is not None:
        dst.copy_(src, non_blocking=True)


class GraphedStep:
    """``propose`` / ``record`` of ``step`` as graph replays, one pair of graphs per call shape.

    ``capture(fn) -> graph``: how a graph is made (default :class:`SharedPoolCapture`; the CPU tests pass a
    stand-in).
    Everything else of the step (``on_prefill``, ``planner_confidence``, metrics) is used from ``step``.
    """

    def __init__(self, step: HybridStep, capture: Optional[Callable] = None) -> None:
        self.step = step
        self._capture = capture if capture is not None else SharedPoolCapture()
        self._propose: dict = {}
        self._record: dict = {}

    @property
    def graphs(self) -> int:
        """Call shapes replayed as graphs (propose and record counted apart)."""
        return sum(v[0] is not None for v in list(self._propose.values()) + list(self._record.values()))

    def _quiet(self, fn: Callable[[], None]):
        """Capture ``fn`` with the step's host counters kept as they were (the capture runs its Python once).
        A capture that fails leaves that call shape eager (``None``), with a warning: serving goes on."""
        st = self.step
        saved = {k: getattr(st, k) for k in st.HOST_COUNTERS}
        try:
            return self._capture(fn)
        except Exception as e:  # noqa: BLE001 (any capture failure: this shape stays eager)
            logging.getLogger("sglang_hybrid").warning(
                "HYBRID_SPARK: capturing the step as a CUDA graph failed (%s: %s); this call shape runs eagerly",
                type(e).__name__, e)
            return None
        finally:
            for k, v in saved.items():
                setattr(st, k, v)

    def propose(self, slots: torch.Tensor, model_tokens: torch.Tensor,
                model_confidence: Optional[torch.Tensor] = None, window: Optional[int] = None,
                context_tokens: Optional[torch.Tensor] = None) -> Proposal:
        ins = (slots, model_tokens, model_confidence, context_tokens)
        key = (window,) + tuple(_sig(t) for t in ins)
        hit = self._propose.get(key)
        if hit is None:
            out = self.step.propose(slots, model_tokens, model_confidence, window, context_tokens)
            static = tuple(_static(t) for t in ins)
            for d, t in zip(static, ins):
                _fill(d, t)
            graph = self._quiet(lambda: self.step.propose(static[0], static[1], static[2], window, static[3]))
            self._propose[key] = (graph, static, out)
            if graph is not None:
                logging.getLogger("sglang_hybrid").info(
                    "HYBRID_SPARK: captured the step's propose graph for batch size %d, window %s (%d graphs)",
                    slots.shape[0], window, self.graphs)
            return out
        graph, static, out = hit
        if graph is None:
            return self.step.propose(slots, model_tokens, model_confidence, window, context_tokens)
        for d, t in zip(static, ins):
            _fill(d, t)
        self.step.note_window(window)
        graph.replay()
        return out

    def record(self, slots: torch.Tensor, proposal: Proposal, committed: torch.Tensor,
               accept_lens: torch.Tensor, verified_len: Optional[torch.Tensor] = None) -> None:
        ins = (slots, committed, accept_lens, verified_len, proposal.tokens, proposal.verify_len, proposal.choice,
               proposal.survival)
        key = tuple(_sig(t) for t in ins)
        hit = self._record.get(key)
        if hit is None:
            self.step.record(slots, proposal, committed, accept_lens, verified_len)
            static = tuple(_static(t) for t in ins)
            for d, t in zip(static, ins):
                _fill(d, t)
            prop = Proposal(tokens=static[4], verify_len=static[5], choice=static[6], survival=static[7])
            graph = self._quiet(lambda: self.step.record(static[0], prop, static[1], static[2], static[3]))
            self._record[key] = (graph, static)
            return
        graph, static = hit
        if graph is None:
            self.step.record(slots, proposal, committed, accept_lens, verified_len)
            return
        for d, t in zip(static, ins):
            _fill(d, t)
        graph.replay()
        self.step.note_record()


def for_serving(step: HybridStep):
    """What the workers call ``propose`` / ``record`` on: ``step`` itself, or with option ``step_graphs=on`` a
    :class:`GraphedStep` over it. The workers call it at start-up, so ``step_graphs=on`` off a CUDA device is a
    start-up error that names the option."""
    if step.cfg.step_graphs == "off":
        return step
    if step.device.type != "cuda":
        raise HybridConfigError(
            f"sglang-hybrid option 'step_graphs': 'on' replays CUDA graphs and needs a CUDA device, got {step.device}")
    return GraphedStep(step)
