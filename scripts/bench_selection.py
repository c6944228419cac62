#!/usr/bin/env python
"""Time the chain selection: torch reference and Triton kernel, budget mode and SPS mode; medians.

    python scripts/bench_selection.py                 # CUDA if available (torch + Triton), else CPU (torch)
    python scripts/bench_selection.py --device cpu --reps 10
    python scripts/bench_selection.py --graph         # also time the Triton kernel replayed in a CUDA graph
    python scripts/bench_selection.py --bs 1,32 --L 8  # a subset

Each (bs, L) is a new kernel variant on CUDA: the first call of a cell compiles it (outside the timing);
rows are printed as they finish.

Inputs: bs in {1, 4, 32, 128, 512}, gamma = 7 model tokens (cumprod of U(0.5, 1) acceptances), L_max in
{8, 16, 32} n-gram tokens (a match for half the requests, 0.9 per token), num_iters = 2. Budget mode uses
K = 3 * bs; SPS mode uses the shipped roofline table. CUDA timings use CUDA events around each call
(host launch overhead included unless --graph); CPU timings use perf_counter. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from sglang_hybrid.selection import (  # noqa: E402
    SelectionBuffers,
    dense_sps,
    load_default_sps_table,
    select_chains_ref,
)

BATCH_SIZES = (1, 4, 32, 128, 512)
GAMMA = 7
L_MAX = (8, 16, 32)


def make_inputs(bs: int, gamma: int, L: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ms = torch.cumprod(0.5 + 0.5 * torch.rand(bs, gamma, generator=g), 1)
    ns = torch.cumprod(torch.full((bs, L), 0.9), 1)
    nl = torch.where(torch.rand(bs, generator=g) < 0.5, torch.randint(1, L + 1, (bs,), generator=g), 0)
    mt = torch.randint(1, 32000, (bs, gamma), generator=g, dtype=torch.int32)
    nt = torch.randint(1, 32000, (bs, L), generator=g, dtype=torch.int32)
    return [t.to(device) for t in (mt, ms, nt, ns, nl.to(torch.int32))]


def time_call(fn, device: torch.device, reps: int, warmup: int = 3) -> float:
    """Median milliseconds of fn()."""
    for _ in range(warmup):
        fn()
    samples = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b))
    else:
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def graph_call(fn):
    """Capture fn in a CUDA graph (after a warm-up on a side stream); returns the replay function."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=0, help="timed calls per cell (default: 50 CUDA, 7 CPU)")
    ap.add_argument("--graph", action="store_true", help="also time Triton replayed in a CUDA graph")
    ap.add_argument("--num-iters", type=int, default=2)
    ap.add_argument("--bs", default=",".join(map(str, BATCH_SIZES)), help="batch sizes, comma-separated")
    ap.add_argument("--L", default=",".join(map(str, L_MAX)), help="n-gram chain widths L_max, comma-separated")
    ap.add_argument("--gamma", type=int, default=GAMMA, help="model chain width")
    args = ap.parse_args()
    batch_sizes = [int(x) for x in args.bs.split(",") if x]
    lens = [int(x) for x in args.L.split(",") if x]
    gamma = args.gamma
    device = torch.device(args.device)
    reps = args.reps or (50 if device.type == "cuda" else 7)
    backends = [("torch", select_chains_ref)]
    if device.type == "cuda":
        from sglang_hybrid.selection.triton_kernel import select_chains_triton

        backends.append(("triton", select_chains_triton))
    table = load_default_sps_table()
    cols = [f"{name} {mode}" for name, _ in backends for mode in ("budget", "sps")]
    if args.graph and device.type == "cuda":
        cols += ["triton budget (graph)", "triton sps (graph)"]
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
          f"torch {torch.__version__}; gamma={gamma}; num_iters={args.num_iters}; median of {reps} calls, ms")
    print()
    print("| bs | L_max | " + " | ".join(cols) + " |")
    print("|---:|---:|" + "---:|" * len(cols))
    for L in lens:
        for bs in batch_sizes:
            W = max(gamma, L)
            mt, ms, nt, ns, nl = make_inputs(bs, gamma, L, device)
            out = SelectionBuffers(bs, W, device).view(bs)
            budget = torch.tensor([3 * bs], dtype=torch.int32, device=device)
            sps = dense_sps(table, bs * (1 + W), device)
            row = []
            for _, fn in backends:
                for b, s in ((budget, None), (None, sps)):
                    call = lambda fn=fn, b=b, s=s: fn(mt, ms, nt, ns, nl, b, s, out, num_iters=args.num_iters)
                    row.append(time_call(call, device, reps))
            if args.graph and device.type == "cuda":
                for b, s in ((budget, None), (None, sps)):
                    call = lambda b=b, s=s: backends[1][1](mt, ms, nt, ns, nl, b, s, out, num_iters=args.num_iters)
                    row.append(time_call(graph_call(call), device, reps))
            print(f"| {bs} | {L} | " + " | ".join(f"{x:.3f}" for x in row) + " |", flush=True)


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("note: TRITON_INTERPRET=1 is set; Triton is only timed on CUDA anyway", file=sys.stderr)
    main()
