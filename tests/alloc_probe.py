"""The allocation tests' probe: kernel launches are tagged, one call runs under the profiler, and what it allocated
outside the tagged launches is listed (the Triton interpreter's own copies happen inside a launch; on CUDA a
launch allocates nothing)."""

from __future__ import annotations

from typing import Callable

from torch.profiler import ProfilerActivity, profile, record_function

TAG = "hybrid_kernel"


def tagged(fn: Callable) -> Callable:
    """``fn`` wrapped so that the profiler files what it does under a kernel launch."""
    def run(*a, **k):
        with record_function(TAG):
            return fn(*a, **k)
    return run


def _in_kernel(e) -> bool:
    while e is not None:
        if e.name == TAG:
            return True
        e = e.cpu_parent
    return False


def profile_call(fn: Callable[[], object]) -> tuple[int, list[str]]:
    """Run ``fn`` once under the profiler: ``(tagged launches, names of the ops that allocated outside them)``.
    Warm ``fn`` up first (per-batch-size views and constants are made once)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = list(prof.events())
    launches = sum(e.name == TAG for e in events)
    return launches, [e.name for e in events if e.cpu_memory_usage > 0 and not _in_kernel(e)]
