#!/usr/bin/env python
"""Benchmark the n-gram drafter's lookup and append: torch reference vs Triton, printed as a markdown table.

Each cell is the median over ``--repeats`` timed calls (after ``--warmup`` untimed ones) of one batched call,
in microseconds: CUDA events on a GPU (optionally replaying a captured CUDA graph, ``--cuda-graph``, which
leaves out the Python/launch overhead), ``time.perf_counter`` on CPU. Triton runs only on CUDA; on a CPU the
column reads "n/a (no GPU)".

Histories are random tokens (``--vocab``) whose last 12 tokens repeat a span from the start of the row, so
every request drafts and the whole row is scanned (window 0). The table width equals the history length.
"tail lookup" is the n-gram tail's lookup after a 7-token model chain (``TokenHistory.lookup_after``: the
stash, the append, the same lookup kernel, the restore), which a step with the tail on runs beside the lookup.
"probe x4" is the echo's probe after the same chain at its four default points (``TokenHistory.probe_after``:
one kernel for every point; ``calibration/echo.py``).

Example (CPU subset)::

    python scripts/bench_ngram.py --bs 1,4,32 --hist 1k,8k,32k --repeats 5

``--corpus`` benchmarks the cross-request corpus instead (``sglang_hybrid/ngram/corpus.py``): one batched
lookup (draft walk, max_draft 16) and one batched insert of ``APPEND_K`` tokens per request, on a table of
``--corpus-entries`` entries pre-filled from the histories (the issue's budget: lookup + insert under 30 us
at batch 128 on the GPU), and the corpus tail's lookup after a 7-token model chain (``run_after``: the stash,
the append, the same walk kernel into its own buffers, the restore; a step with ``corpus_tail`` runs it beside the lookup).
The history length column is the ``TokenHistory`` width the contexts come from.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sglang_hybrid.calibration.candidates import STEP_CORPUS_TAU  # noqa: E402
from sglang_hybrid.ngram import NgramConfig, TokenHistory  # noqa: E402
from sglang_hybrid.ngram.corpus import CorpusConfig, CorpusDraft, NgramCorpus  # noqa: E402

APPEND_K = 17  # accepted draft tokens + bonus per step (max_draft 16 + 1)
TAIL_AFTER = 7  # the model chain the n-gram tail follows (a 7-token DSpark block)


def _size(s: str) -> int:
    s = s.strip().lower()
    scale = {"k": 1024, "m": 1024 * 1024}.get(s[-1:], 1)
    return int(float(s[:-1] if scale > 1 else s) * scale)


def _time_us(fn: Callable[[], None], device: torch.device, repeats: int, warmup: int, graph: bool) -> float:
    """Median microseconds of one call of ``fn``."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    run = fn
    if graph:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def _make_table(bs: int, hist: int, device: torch.device, backend: str, vocab: int, seed: int) -> TokenHistory:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (bs, hist), generator=g, dtype=torch.int32)
    prompt[:, hist - 12 :] = prompt[:, 100:112]  # the suffix repeats an early span: a full-row scan and a draft
    h = TokenHistory(bs, hist, device, backend=backend, max_batch_size=bs)
    slots = torch.arange(bs, dtype=torch.int32, device=device)
    h.write_prompt(slots, prompt.to(device), torch.full((bs,), hist, dtype=torch.int32, device=device))
    return h


def bench_cell(bs: int, hist: int, device: torch.device, backend: str,
               args: argparse.Namespace) -> tuple[float, float, float, float]:
    """``(lookup_us, append_us, tail_us, probe_us)`` for one configuration; ``tail_us`` is the n-gram tail's lookup
    after a ``TAIL_AFTER``-token model chain (``lookup_after``: append, lookup, restore), ``probe_us`` the echo's
    probe after it at ``k = 3 .. 6`` (``probe_after``, one kernel)."""
    h = _make_table(bs, hist, device, backend, args.vocab, seed=bs * 7919 + hist)
    slots = torch.arange(bs, dtype=torch.int32, device=device)
    cfg = NgramConfig()
    out = h.lookup(slots, cfg)
    if not bool((out.length > 0).all()):
        raise RuntimeError(f"bench set-up: not every request drafted (bs={bs}, hist={hist}, {backend})")
    lookup_us = _time_us(lambda: h.lookup(slots, cfg), device, args.repeats, args.warmup, args.cuda_graph)
    new = torch.randint(0, args.vocab, (bs, APPEND_K), dtype=torch.int32).to(device)
    counts = torch.randint(1, APPEND_K + 1, (bs,), dtype=torch.int32).to(device)
    append_us = _time_us(lambda: h.append(slots, new, counts), device, args.repeats, args.warmup, args.cuda_graph)
    extra = torch.randint(0, args.vocab, (bs, TAIL_AFTER), dtype=torch.int32).to(device)
    tail_cfg = NgramConfig(max_draft=16 - TAIL_AFTER)
    h.reserve_after(TAIL_AFTER)
    tail_us = _time_us(lambda: h.lookup_after(slots, tail_cfg, extra), device, args.repeats, args.warmup,
                       args.cuda_graph)
    pts = torch.arange(TAIL_AFTER - 4, TAIL_AFTER, dtype=torch.int32, device=device)
    matched = torch.zeros(bs, pts.shape[0], dtype=torch.int32, device=device)
    probe_us = _time_us(lambda: h.probe_after(slots, extra, pts, matched, cfg.n_min, cfg.window), device,
                        args.repeats, args.warmup, args.cuda_graph)
    return lookup_us, append_us, tail_us, probe_us


def bench_corpus_cell(bs: int, hist: int, device: torch.device, backend: str,
                      args: argparse.Namespace) -> tuple[float, float, float]:
    """``(lookup_us, insert_us, tail_us)`` of the corpus for one configuration; ``tail_us`` is the corpus's tail
    lookup after a ``TAIL_AFTER``-token model chain (``run_after``: append, the walk into its own buffers,
    restore), which a step with ``corpus_tail`` runs beside the lookup."""
    h = _make_table(bs, hist, device, backend if backend == "torch" else "auto", args.vocab, seed=bs * 31 + hist)
    cfg = CorpusConfig(entries=args.corpus_entries, tau=STEP_CORPUS_TAU)
    c = NgramCorpus(cfg, device, backend=backend, max_batch_size=bs, max_draft=16)
    slots = torch.arange(bs, dtype=torch.int32, device=device)
    plen = torch.full((bs,), hist, dtype=torch.int32, device=device)
    c.insert_prompt(h, slots, plen, max_prompt_len=min(hist, 4 * c.cfg.insert_chunk))  # something to find
    counts = torch.full((bs,), APPEND_K, dtype=torch.int32, device=device)
    lookup_us = _time_us(lambda: c.lookup(h, slots), device, args.repeats, args.warmup, args.cuda_graph)
    insert_us = _time_us(lambda: c.insert(h, slots, counts), device, args.repeats, args.warmup, args.cuda_graph)
    extra = torch.randint(0, args.vocab, (bs, TAIL_AFTER), dtype=torch.int32).to(device)
    out = CorpusDraft.zeros(bs, 16 - TAIL_AFTER, device)
    h.reserve_after(TAIL_AFTER)
    tail_us = _time_us(lambda: h.run_after(slots, extra, lambda: c.lookup(h, slots, out=out)), device, args.repeats,
                       args.warmup, args.cuda_graph)
    return lookup_us, insert_us, tail_us


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bs", default="1,4,32,128", help="batch sizes, comma-separated")
    p.add_argument("--hist", default="1k,8k,32k,128k", help="history lengths (= table width), e.g. 1k,8k")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda or cpu")
    p.add_argument("--backends", default="torch,triton", help="torch and/or triton")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--max-tokens", type=_size, default=0, help="skip cells with bs*hist above this (0 = none)")
    p.add_argument("--cuda-graph", action="store_true", help="time CUDA-graph replays (GPU only)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--corpus", action="store_true", help="benchmark the cross-request corpus (lookup, insert)")
    p.add_argument("--corpus-entries", type=_size, default=1 << 21, help="corpus table entries (power of two)")
    args = p.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bss = [int(x) for x in args.bs.split(",")]
    hists = [_size(x) for x in args.hist.split(",")]
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)")
    graph = ', CUDA graph replay' if args.cuda_graph else ''
    if args.corpus:
        print(f"n-gram corpus, device {name}, torch {torch.__version__}, entries={args.corpus_entries} "
              f"n_max={CorpusConfig.n_max} tau={STEP_CORPUS_TAU} (the step's) max_draft=16, insert K={APPEND_K}; "
              f"median of {args.repeats} (us){graph}")
    else:
        print(f"n-gram drafter, device {name}, torch {torch.__version__}, n_min=2 n_max=8 max_draft=16 window=0, "
              f"append K={APPEND_K}; median of {args.repeats} (us){graph}")
    print()
    ops = ("lookup", "insert", "tail lookup") if args.corpus else ("lookup", "append", "tail lookup", "probe x4")
    cell = bench_corpus_cell if args.corpus else bench_cell
    cols = [f"{op} {b}" for op in ops for b in backends]
    print("| bs | history | " + " | ".join(f"{c} (us)" for c in cols) + " |")
    print("|---:|---:|" + "---:|" * len(cols))
    for hist in hists:
        for bs in bss:
            if args.max_tokens and bs * hist > args.max_tokens:
                continue
            res: dict[str, tuple[str, ...]] = {}
            for b in backends:
                if b == "triton" and device.type != "cuda":
                    res[b] = ("n/a (no GPU)",) * len(ops)
                    continue
                res[b] = tuple(f"{t:,.1f}" for t in cell(bs, hist, device, b, args))
            cells = [res[b][i] for i in range(len(ops)) for b in backends]
            label = f"{hist // 1024}k" if hist % 1024 == 0 else str(hist)
            print(f"| {bs} | {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
