"""HYBRID_SPARK metrics where SGLang users look for them, without waiting on the device.

* ``/server_info`` -> ``internal_states[i]["hybrid_spark"]``: server-wide counters (tokens proposed and
  accepted by each drafter, mean accept length, n-gram win rate, current price), added after SGLang's own
  speculative fields (``SchedulerInternalStateController._add_speculative``).
* ``/server_info`` -> ``internal_states[i]["avg_spec_accept_length"]``, the standard field SGLang's
  ``bench_serving`` prints as "Accept length": SGLang folds its per-step counters into the lifetime totals only
  every ``--decode-log-interval`` decode batches (40 by default), so the field is missing until then and lags
  after, for every algorithm. While HYBRID_SPARK runs it is the live lifetime average over SGLang's own counters
  (:func:`live_accept_length`: accepted tokens / request-steps, the pending window included).
* per request, ``meta_info["hybrid_spark"]``: a one-element list holding that request's counters, emitted when
  it finishes (through SGLang's ``SchedulerOutputStreamer.build_additional_customized_info`` extension point).
* a periodic log line every ``metrics_interval`` decode steps (in the worker).

The counters are kept on the device and copied to pinned host memory asynchronously after each step; the host
reads that copy (at most one step stale) and never synchronises. Both patches are installed in the scheduler
process when a HYBRID_SPARK worker is built, and are declared in ``hooks.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Optional

from ..step import HybridStep

META_KEY = "hybrid_spark"
_ACTIVE: dict = {"step": None, "extra": None}


# Request id -> request-pool slot, recorded at prefill (a finished request's slot is already released when its
# last output is streamed). Bounded: entries of requests that never report are dropped oldest first.
_SLOTS: "OrderedDict[str, int]" = OrderedDict()
_MAX_TRACKED = 1 << 16


def note_prefill(reqs) -> None:
    """Remember each prefilled request's slot (host-side, from SGLang's own host fields)."""
    for r in reqs:
        kv = getattr(r, "kv", None)
        slot = getattr(kv, "req_pool_idx", None) if kv is not None else getattr(r, "req_pool_idx", None)
        if slot is not None:
            _SLOTS[r.rid] = int(slot)
            _SLOTS.move_to_end(r.rid)
    while len(_SLOTS) > _MAX_TRACKED:
        _SLOTS.popitem(last=False)


def request_meta(reqs) -> list:
    """One entry per request: ``[counters]`` when it has finished, else ``[]``."""
    step = _ACTIVE["step"]
    out = []
    for r in reqs:
        slot = _SLOTS.get(r.rid) if r.finished() else None
        if step is not None and slot is not None:
            out.append([step.request_metrics(slot)])
            _SLOTS.pop(r.rid, None)
        else:
            out.append([])
    return out


def server_metrics() -> Optional[dict]:
    """The server-wide metrics of the active step (plus the worker's ``extra`` fields), or None."""
    step = _ACTIVE["step"]
    if step is None:
        return None
    m = step.metrics()
    if _ACTIVE["extra"] is not None:
        m.update(_ACTIVE["extra"]())
    return m


def live_accept_length(reporter) -> Optional[float]:
    """SGLang's ``avg_spec_accept_length`` (accepted tokens per request-step) over the server's whole life,
    including the decode batches not yet folded into the lifetime totals; ``None`` before the first decode step.

    ``reporter`` is the scheduler's ``SchedulerMetricsReporter``: ``update_spec_metrics`` adds each decode batch to
    ``spec_num_accept_tokens`` / ``spec_num_forward_ct``, and every ``decode_log_interval`` batches those move into
    ``spec_total_num_accept_tokens`` / ``spec_total_num_forward_ct`` (host integers, no device access)."""
    steps = int(getattr(reporter, "spec_total_num_forward_ct", 0) or 0) + int(
        getattr(reporter, "spec_num_forward_ct", 0) or 0
    )
    if steps <= 0:
        return None
    accepted = int(getattr(reporter, "spec_total_num_accept_tokens", 0) or 0) + int(
        getattr(reporter, "spec_num_accept_tokens", 0) or 0
    )
    return accepted / steps


def install(step: HybridStep, extra: Optional[Callable[[], dict]] = None) -> None:
    """Point the metrics at ``step`` and patch SGLang's two reporting points (idempotent). ``extra``: a
    host-side callable whose fields are added to the server-wide metrics."""
    _ACTIVE["step"] = step
    _ACTIVE["extra"] = extra
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    if not getattr(SchedulerInternalStateController._add_speculative, "_hybrid", False):
        orig_add = SchedulerInternalStateController._add_speculative

        def _add_speculative(self, state):
            orig_add(self, state)
            m = server_metrics()
            if m is not None:
                live = live_accept_length(getattr(self.scheduler, "metrics_reporter", None))
                if live is not None:
                    state["avg_spec_accept_length"] = live
                state[META_KEY] = m

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
