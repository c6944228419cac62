#!/usr/bin/env python
"""Benchmark deferred scoring (``OnlineCalibration.update_from_history``, the online calibration's record after
every decode step): the plain-torch path against the Triton kernel (``calibration/deferred_kernel.py``).

The record runs as the step runs it (``defer`` 8, ``bins`` 8, ``L`` 16 draft columns): each timed call scores
this step's drafts against a history that has just grown by a few tokens, so every ring entry does real work.
Columns, per batch size, in microseconds (median of ``--repeats`` calls after ``--warmup``):
  torch / triton   one call launched from Python (CUDA events on a GPU, ``perf_counter`` on a CPU)
  graph            one replay of a CUDA graph of the Triton call (GPU only)
  ops              top-level torch ops per call outside the kernel (the profiler; what an eager step pays)

On a CPU only the torch path runs (under the Triton interpreter the kernel's time is not a speed);
``scripts/count_step_ops.py`` counts the kernel path's ops there.

    python scripts/bench_deferred.py --device cuda --bs 1,4,32,128
    python scripts/bench_deferred.py --device cpu --bs 1,4,32
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from sglang_hybrid.calibration.online import OnlineCalibration  # noqa: E402
from sglang_hybrid.ngram.history import TokenHistory  # noqa: E402


def _setup(bs: int, backend: str, dev: torch.device, L: int, hist: int):
    g = torch.Generator().manual_seed(bs)
    on = OnlineCalibration(bs, bs, L, dev, defer=8, bins=8, backend=backend)
    h = TokenHistory(bs, hist, dev, backend="torch", max_draft=L)
    slots = torch.arange(bs, device=dev)
    prompt = torch.randint(0, 8, (bs, hist // 2), generator=g, dtype=torch.int32).to(dev)
    h.write_prompt(slots, prompt, torch.full((bs,), hist // 2, dtype=torch.int32, device=dev))
    tok = torch.randint(0, 8, (bs, L), generator=g, dtype=torch.int32).to(dev)
    q = torch.rand(bs, L, generator=g).to(dev)
    start = h.lens.to(torch.int64)
    new = torch.randint(0, 8, (bs, 4), generator=g, dtype=torch.int32).to(dev)
    cnt = torch.full((bs,), 2, dtype=torch.int32, device=dev)
    length = torch.full((bs,), L, dtype=torch.int64, device=dev)

    def call() -> None:  # the record of one step: this step's drafts scored, the ring advanced
        on.apply(slots, tok, length, q.clone(), q.clone(), start=start)
        on.update_from_history(slots, h.tokens, h.lens)

    for _ in range(3):  # fill the rings
        h.append(slots, new, cnt)
        call()
    return on, h, slots, call


def _time(fn, dev: torch.device, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        else:
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e6)
    return statistics.median(ts)


def _ops(on: OnlineCalibration, h: TokenHistory, slots: torch.Tensor) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        on.update_from_history(slots, h.tokens, h.lens)
    n = 0
    for e in prof.events():  # top-level aten ops (a Triton launch on a GPU is none)
        if e.name.startswith("aten::") and e.cpu_parent is None:
            n += 1
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda or cpu")
    p.add_argument("--bs", default="1,4,32,128")
    p.add_argument("--width", type=int, default=16, help="L, draft columns")
    p.add_argument("--hist", type=int, default=1024, help="history width per request")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    dev = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                       ("cpu" if a.device == "auto" else a.device))
    triton_ok = dev.type == "cuda"
    print(f"device {dev}, L {a.width}, defer 8, bins 8, history {a.hist}; us per update_from_history "
          f"(apply not timed), median of {a.repeats}")
    print("| bs | torch | triton | triton, graph | ops torch | ops triton |")
    print("|---:|---:|---:|---:|---:|---:|")
    for bs in (int(x) for x in a.bs.split(",")):
        row = {}
        for backend in ("torch", "triton") if triton_ok else ("torch",):
            on, h, slots, _ = _setup(bs, backend, dev, a.width, a.hist)
            fn = lambda: on.update_from_history(slots, h.tokens, h.lens)  # noqa: E731
            row[backend] = _time(fn, dev, a.repeats, a.warmup)
            row["ops " + backend] = _ops(on, h, slots)
            if backend == "triton" and dev.type == "cuda":
                fn()
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
                row["graph"] = _time(graph.replay, dev, a.repeats, a.warmup)

        def f(k: str) -> str:
            v = row.get(k)
            return "-" if v is None else (str(v) if isinstance(v, int) else f"{v:.1f}")

        print(f"| {bs} | {f('torch')} | {f('triton')} | {f('graph')} | {f('ops torch')} | {f('ops triton')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
