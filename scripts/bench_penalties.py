#!/usr/bin/env python
"""Benchmark the penalties at every verify position (``sglang_hybrid/penalties.py``) and check the in-place
version against its reference.

For ``k`` penalised requests, a ``W``-position window and a ``V``-token vocabulary, it times
``apply_window_penalties`` (in place: the block at the counts before the window, the drafts' ``W x (W - 1)``
entries recomputed) against ``apply_window_penalties_ref`` (every position's counts materialised), on the same
random inputs (drafts from a few tokens, so they repeat).

Columns, per shape: median milliseconds of ``--repeats`` runs after ``--warmup`` (CUDA events on a GPU,
``perf_counter`` on CPU); on a GPU the peak memory each allocates beyond its inputs (MiB); ``check`` is "exact" when
the two outputs are equal bit for bit ("DIFF" otherwise, and the script exits 1).

Example::

    python scripts/bench_penalties.py --device cuda --shapes 8x8x152064,48x16x152064
    python scripts/bench_penalties.py --device cpu --shapes 4x8x32000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sglang_hybrid.penalties import apply_window_penalties, apply_window_penalties_ref  # noqa: E402


def _inputs(k: int, w: int, v: int, device: str):
    g = torch.Generator().manual_seed(k * 131 + w)
    logits = (torch.randn(k, w, v, generator=g) * 4).to(device)
    counts = (torch.randint(0, 3, (k, v), generator=g).float() * (torch.rand(k, v, generator=g) < 0.01)).to(device)
    ids = torch.randint(0, 16, (k, w), generator=g).to(device)
    f, p = torch.full((k,), 0.5, device=device), torch.full((k,), 0.25, device=device)
    r = torch.full((k,), 1.3, device=device)
    return logits, counts, ids, f, p, r


def _time(fn, device: str, warmup: int, repeats: int):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def _peak_mib(fn, device: str) -> str:
    if device != "cuda":
        return "-"
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return f"{(torch.cuda.max_memory_allocated() - base) / 2**20:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="8x8x32000,32x8x32000", help="comma-separated k x W x V")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    print(f"device {args.device}; medians of {args.repeats} runs (ms); peak memory beyond the inputs (MiB, GPU)\n")
    print("| k x W x V | in place ms | reference ms | ratio | in place MiB | reference MiB | check |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    for shape in args.shapes.split(","):
        k, w, v = (int(x) for x in shape.lower().split("x"))
        logits, counts, ids, f, p, r = _inputs(k, w, v, args.device)
        work = logits.clone()

        def lean():
            work.copy_(logits)
            apply_window_penalties(work, counts, ids, f, p, r)

        def ref():
            return apply_window_penalties_ref(logits, counts, ids, f, p, r)

        t_lean, t_ref = _time(lean, args.device, args.warmup, args.repeats), _time(ref, args.device, args.warmup,
                                                                                     args.repeats)
        m_lean, m_ref = _peak_mib(lean, args.device), _peak_mib(ref, args.device)
        lean()
        same = torch.equal(work, ref())
        ok &= same
        print(f"| {k} x {w} x {v} | {t_lean:.3f} | {t_ref:.3f} | {t_ref / t_lean:.2f}x | {m_lean} | {m_ref} | "
              f"{'exact' if same else 'DIFF'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
