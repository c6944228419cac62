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


def run_report(batch_sizes: Sequence[int] = REPORT_BATCH_SIZES, *, max_requests: Optional[int] = None,
               base: Optional[SimOptions] = None, workloads: Optional[dict] = None, log=None) -> list[dict]:
    """Simulate every default workload at every batch size; returns the runs (see ``simulate``)."""
    import dataclasses

    log = log or (lambda m: print(m, file=sys.stderr))
    base = base or SimOptions(batch_size=batch_sizes[0])
    calibration = load_calibration(base.calibration) if "hybrid" in base.policies else None
    runs = []
    for kind, path in (workloads or DEFAULT_WORKLOADS).items():
        records = read_workload(path)
        for bs in batch_sizes:
            m = report_requests(bs, max_requests)
            opts = dataclasses.replace(base, batch_size=bs, max_requests=m)
            log(f"simulating {Path(path).name} at batch {bs} ({m or len(records)} of {len(records)} requests)")
            r = simulate(records, opts, calibration=calibration, label=f"{kind} ")
            if "dspark" in opts.policies and "hybrid" in opts.policies and opts.dspark_lag != 0:
                # DSpark with a fresh budget (lag 0): separates the n-gram chain's gain from the fresh budget the
                # hybrid's on-device selection gets for free.
                fresh = simulate(records, dataclasses.replace(opts, policies=("dspark",), dspark_lag=0))
                r["dspark_lag0"] = fresh["policies"]["dspark"]
                thr = fresh["policies"]["dspark"]["throughput"]
                if thr:
                    r["ratios"]["hybrid_over_dspark_lag0"] = round(r["policies"]["hybrid"]["throughput"] / thr, 4)
            r["workload"] = str(Path(path).name)
            r["total_requests"] = len(records)
            runs.append(r)
    return runs
