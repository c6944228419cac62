"""Start-up warm-up of a :class:`~sglang_hybrid.step.HybridStep`: compile every Triton kernel of the decode step
for each batch-size class before the first request, then put every bit of state back.

Why: Triton compiles a kernel at its first launch with a new specialisation, and the step's kernels specialise
on the batch size (the selection kernel on ``next_pow2(bs)``, integer arguments on ``== 1`` and ``% 16``). On an
H200 that compile takes seconds per kernel (``docs/gpu/2026-12-04-h200.md``: a benchmark cell that met new batch
sizes with the corpus on ran past 100 s), and without a warm-up it happens inside a decode step, the first time
the running batch reaches each new power of two: a stall of every request in the batch, under load. SGLang's
CUDA-graph capture does not run our step, so it does not warm it.

The warm-up runs one ``propose`` + ``record`` per batch size on slots ``0 .. bs-1`` with zero tokens, then
restores every tensor the step owns (the histories' touched columns, lengths, the corpus table, the online
calibrations, the counters) and the host-side counters, so serving starts from exactly the state a step that
never warmed up would have (``tests/test_warmup.py`` checks it bit for bit).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import torch

_PKG = __name__.rsplit(".", 1)[0]


def warmup_batch_sizes(max_bs: int) -> list[int]:
    """The batch sizes that cover every compile class up to ``max_bs``: 1, the powers of two below ``max_bs``
    (``next_pow2(bs)`` classes; 16 and its multiples cover ``% 16``) and ``max_bs`` itself."""
    if max_bs < 1:
        raise ValueError(f"max_bs must be >= 1, got {max_bs}")
    sizes = {1, max_bs}
    p = 2
    while p < max_bs:
        sizes.add(p)
        p *= 2
    return sorted(sizes)


def _walk(obj, seen: set, objs: list) -> None:
    """``obj`` and the objects of this package it reaches through attributes (lists, tuples, dicts included)."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    objs.append(obj)
    for v in vars(obj).values():
        for x in (v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)):
            if hasattr(x, "__dict__") and type(x).__module__.startswith(_PKG) and not isinstance(x, type):
                _walk(x, seen, objs)


class _Snapshot:
    """Every tensor and host scalar reachable from a step; the history's token table only in ``cols`` columns."""

    def __init__(self, step, cols: int) -> None:
        objs: list = []
        _walk(step, set(), objs)
        big = step.history.tokens
        self.big = (big, big[:, :cols].clone())
        self.tensors: list = []
        self.scalars: list = []
        done: set = {id(big)}
        for o in objs:
            for k, v in vars(o).items():
                if isinstance(v, torch.Tensor) and id(v) not in done:
                    done.add(id(v))
                    self.tensors.append((v, v.clone()))
                elif isinstance(v, (bool, int, float)):
                    self.scalars.append((o, k, v))

    def restore(self) -> None:
        big, cols = self.big
        big[:, : cols.shape[1]].copy_(cols)
        for t, saved in self.tensors:
            t.copy_(saved)
        for o, k, v in self.scalars:
            if getattr(o, k) != v:  # (frozen configs never change, and are never assigned)
                setattr(o, k, v)


def default_inputs(step, bs: int) -> dict:
    """``propose`` arguments for the warm-up: contiguous int32 slots and model tokens, with confidences."""
    dev = step.device
    return {"slots": torch.arange(bs, dtype=torch.int32, device=dev),
            "model_tokens": torch.zeros(bs, step.gamma, dtype=torch.int32, device=dev),
            "model_confidence": torch.full((bs, step.gamma), 0.5, device=dev)}


def warm_up(step, batch_sizes: Optional[list[int]] = None,
            inputs: Optional[Callable[[int], dict]] = None) -> tuple[list[int], float]:
    """Run one decode step at each batch size (default :func:`warmup_batch_sizes` of ``step.max_bs``) and
    restore the step's state. Returns the sizes and the seconds it took. Only before the first request (the
    histories are restored in the columns a fresh step writes); a step holding requests is refused.

    ``inputs(bs)``: the ``propose`` keyword arguments (``slots``, ``model_tokens``, optionally
    ``model_confidence``, ``window``, ``context_tokens``) laid out as the worker passes them in serving: Triton
    compiles per pointer dtype and alignment and per stride class too, so a worker that hands over int64 slots
    or a sliced token tensor says so here (default :func:`default_inputs`).
    """
    sizes = warmup_batch_sizes(step.max_bs) if batch_sizes is None else sorted(set(batch_sizes))
    if not sizes or sizes[0] < 1 or sizes[-1] > step.max_bs:
        raise ValueError(f"warm-up batch sizes must be in [1, {step.max_bs}], got {batch_sizes}")
    if bool((step.history.lens != 0).any()):  # a host read, at start-up
        raise ValueError("warm_up runs before the first request: this step already holds request histories")
    make = inputs if inputs is not None else (lambda bs: default_inputs(step, bs))
    t0 = time.perf_counter()
    dev = step.device
    # each step appends one token per slot; the tail's lookup writes (and restores) gamma more after them
    cols = min(step.history.tokens.shape[1], len(sizes) + step.gamma + 1)
    snap = _Snapshot(step, cols)
    try:
        for bs in sizes:
            kw = make(bs)
            slots = kw.pop("slots")
            p = step.propose(slots, kw.pop("model_tokens"), **kw)
            committed = torch.zeros(bs, p.tokens.shape[1] + 1, dtype=torch.int32, device=dev)
            step.record(slots, p, committed, torch.ones(bs, dtype=torch.int32, device=dev))
    finally:
        snap.restore()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    return sizes, time.perf_counter() - t0


def warm_up_for_serving(step, inputs: Optional[Callable[[int], dict]] = None) -> None:
    """What the workers call at start-up, as option ``warmup`` says: ``auto`` (default) runs :func:`warm_up` on a
    GPU only (a CPU's torch kernels compile nothing), ``on`` always (the CPU e2e tests use it to run the
    workers' wiring), ``off`` never. The sizes and the time go to the log and to the metrics
    (``warmup_batch_sizes``, ``warmup_max_batch_size``, ``warmup_seconds``)."""
    mode = step.cfg.warmup
    if mode == "off" or (mode == "auto" and step.device.type != "cuda"):
        return
    log = logging.getLogger("sglang_hybrid")
    log.info("HYBRID_SPARK: compiling the decode step's kernels for each batch-size class (start-up only) ...")
    sizes, secs = warm_up(step, inputs=inputs)
    step.extra_metrics.update(warmup_batch_sizes=len(sizes), warmup_max_batch_size=sizes[-1],
                              warmup_seconds=round(secs, 3))
    log.info("HYBRID_SPARK: decode step warmed up for batch sizes %s in %.1f s", sizes, secs)
