"""HYBRID_SPARK metrics where SGLang users look for them, without waiting on the device.

* ``/server_info`` -> ``internal_states[i]["hybrid_spark"]``: server-wide counters (tokens proposed and
  accepted by each drafter, mean accept length, n-gram win rate, current price), added after SGLang's own
  speculative fields (``SchedulerInternalStateController._add_speculative``).
* per request, ``meta_info["hybrid_spark"]``: a one-element list holding that request's counters, emitted when
  it finishes (through SGLang's ``SchedulerOutputStreamer.build_additional_customized_info`` extension point).
* a periodic log line every ``metrics_interval`` decode steps (in the worker).

The counters are kept on the device and copied to pinned host memory asynchronously after each step; the host
reads that copy (at most one step stale) and never synchronises. Both patches are installed in the scheduler
process when a HYBRID_SPARK worker is built, and are declared in ``hooks.py``.
"""

from __future__ import annotations

from typing import Optional

from ..step import HybridStep

META_KEY = "hybrid_spark"
_ACTIVE: dict[str, Optional[HybridStep]] = {"step": None}


def _slot_of(req) -> Optional[int]:
    kv = getattr(req, "kv", None)
    slot = getattr(kv, "req_pool_idx", None) if kv is not None else None
    if slot is None:
        slot = getattr(req, "req_pool_idx", None)
    return None if slot is None else int(slot)


def request_meta(reqs) -> list:
    step = _ACTIVE["step"]
    out = []
    for r in reqs:
        slot = _slot_of(r)
        out.append([step.request_metrics(slot)] if step is not None and slot is not None and r.finished() else [])
    return out


def install(step: HybridStep) -> None:
    """Point the metrics at ``step`` and patch SGLang's two reporting points (idempotent)."""
    _ACTIVE["step"] = step
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    if not getattr(SchedulerInternalStateController._add_speculative, "_hybrid", False):
        orig_add = SchedulerInternalStateController._add_speculative

        def _add_speculative(self, state):
            orig_add(self, state)
            if _ACTIVE["step"] is not None:
                state[META_KEY] = _ACTIVE["step"].metrics()

        _add_speculative._hybrid = True
        SchedulerInternalStateController._add_speculative = _add_speculative

    if not getattr(SchedulerOutputStreamer.build_additional_customized_info, "_hybrid", False):
        orig_build = SchedulerOutputStreamer.build_additional_customized_info

        def build_additional_customized_info(self, reqs):
            info = orig_build(self, reqs)
            info[META_KEY] = request_meta(reqs)
            return info

        build_additional_customized_info._hybrid = True
        SchedulerOutputStreamer.build_additional_customized_info = build_additional_customized_info
        SchedulerOutputStreamer.has_additional_customized_info = True
