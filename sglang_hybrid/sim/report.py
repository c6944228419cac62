"""The default report: the shipped workloads at batch sizes 4, 32 and 128, all policies.

``hybrid-spark simulate --default`` calls :func:`run_report`. To stay within a few minutes on 2 CPU cores it
replays the first ``REPORT_MAX_REQUESTS[batch]`` requests of each shipped file (the files are in hashed order,
so a prefix is a fair sample); the output says so.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from .jsonl import read_workload
from .runner import SimOptions, load_calibration, simulate

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "workloads"
DEFAULT_WORKLOADS = {"code-edit": DATA_DIR / "code_edit.jsonl", "chat": DATA_DIR / "chat.jsonl"}
REPORT_BATCH_SIZES = (4, 32, 128)
# Requests replayed per batch size (0 = all). Small batches run many more steps per request.
# At large batches the "steady" measure stops when the queue runs dry, so the work grows with the queue length
# (requests - batch) and with the longest outputs: 224 requests give batch 128 a 96-request queue.
REPORT_MAX_REQUESTS = {1: 16, 4: 48, 16: 64, 32: 96, 64: 160, 128: 224, 256: 400}


def report_requests(batch_size: int, override: Optional[int]) -> int:
    if override is not None:
        return override
    for b in sorted(REPORT_MAX_REQUESTS):
        if batch_size <= b:
            return REPORT_MAX_REQUESTS[b]
    return 0


def _one(kind: str, path, bs: int, max_requests: Optional[int], base: SimOptions, calibration=None) -> dict:
    """One (workload, batch size) of the report: all policies, plus DSpark with a fresh budget."""
    import dataclasses

    records = read_workload(path)
    m = report_requests(bs, max_requests)
    opts = dataclasses.replace(base, batch_size=bs, max_requests=m)
    if calibration is None and "hybrid" in opts.policies:
        calibration = load_calibration(opts.calibration)
    r = simulate(records, opts, calibration=calibration, label=f"{kind} ")
    if "dspark" in opts.policies and "hybrid" in opts.policies and opts.dspark_lag != 0:
        # DSpark with a fresh budget (lag 0): separates the n-gram chain's gain from the fresh budget the
        # hybrid's on-device selection gets for free.
        fresh = simulate(records, dataclasses.replace(opts, policies=("dspark",), dspark_lag=0, progress=False))
        r["dspark_lag0"] = fresh["policies"]["dspark"]
        thr = fresh["policies"]["dspark"]["throughput"]
        if thr:
            r["ratios"]["hybrid_over_dspark_lag0"] = round(r["policies"]["hybrid"]["throughput"] / thr, 4)
    r["workload"] = str(Path(path).name)
    r["total_requests"] = len(records)
    return r


def _worker_init(counter, threads: int) -> None:
    import torch

    from . import simulator

    torch.set_num_threads(threads)
    simulator.ON_REQUESTS_DONE = lambda n: _add(counter, n)


def _add(counter, n: int) -> None:
    with counter.get_lock():
        counter.value += n


def run_report(batch_sizes: Sequence[int] = REPORT_BATCH_SIZES, *, max_requests: Optional[int] = None,
               base: Optional[SimOptions] = None, workloads: Optional[dict] = None, log=None,
               jobs: int = 1) -> list[dict]:
    """Simulate every default workload at every batch size; returns the runs (see ``simulate``).

    ``jobs > 1`` runs the (workload, batch size) cells in that many processes (one torch thread each); the
    results are the same, in the same order. With ``base.progress`` one tqdm bar counts finished requests.
    """
    import dataclasses

    log = log or (lambda m: print(m, file=sys.stderr))
    base = base or SimOptions(batch_size=batch_sizes[0])
    cells = []
    for kind, path in (workloads or DEFAULT_WORKLOADS).items():
        n = len(read_workload(path))
        for bs in batch_sizes:
            m = report_requests(bs, max_requests)
            cells.append((kind, path, bs, m or n, n))
    if jobs <= 1:
        calibration = load_calibration(base.calibration) if "hybrid" in base.policies else None
        runs = []
        for kind, path, bs, m, n in cells:
            log(f"simulating {Path(path).name} at batch {bs} ({m} of {n} requests)")
            runs.append(_one(kind, path, bs, max_requests, base, calibration))
        return runs
    import multiprocessing as mp
    import time
    from concurrent.futures import ProcessPoolExecutor

    log(f"simulating {len(cells)} cells ({', '.join(sorted({Path(c[1]).name for c in cells}))} at batch "
        f"{', '.join(str(b) for b in batch_sizes)}) in {jobs} processes")
    import torch

    # Fork is fast, but a forked child of a parent whose torch thread pool is live hangs: fork only where the
    # parent runs one torch thread (the CLI sets it before any op), spawn elsewhere.
    ctx = mp.get_context("fork" if torch.get_num_threads() == 1 else "spawn")
    counter = ctx.Value("l", 0)
    runs_per_cell = len(base.policies) + (1 if "dspark" in base.policies and "hybrid" in base.policies
                                           and base.dspark_lag != 0 else 0)
    bar = None
    if base.progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(c[3] for c in cells) * runs_per_cell, desc="requests replayed", unit="req",
                   file=sys.stderr, dynamic_ncols=True)
    quiet = dataclasses.replace(base, progress=False)
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker_init,
                             initargs=(counter, torch.get_num_threads())) as ex:
        futs = [ex.submit(_one, kind, path, bs, max_requests, quiet) for kind, path, bs, _, _ in cells]
        while not all(f.done() for f in futs):
            time.sleep(0.25)
            if bar is not None:
                bar.n = counter.value
                bar.refresh()
        runs = [f.result() for f in futs]
    if bar is not None:
        bar.n = counter.value
        bar.close()
    return runs
