"""The standard speculative field SGLang's tools read (``avg_spec_accept_length``) is live while HYBRID_SPARK runs."""

from types import SimpleNamespace

import pytest

from sglang_hybrid.sglang_plugin import observability
from sglang_hybrid.sglang_plugin.observability import live_accept_length


def _reporter(total_acc=0, total_ct=0, acc=0, ct=0):
    return SimpleNamespace(
        spec_total_num_accept_tokens=total_acc, spec_total_num_forward_ct=total_ct,
        spec_num_accept_tokens=acc, spec_num_forward_ct=ct,
    )


def test_live_accept_length_includes_the_window_not_yet_logged():
    assert live_accept_length(_reporter()) is None  # before the first decode step
    assert live_accept_length(None) is None
    # 3 request-steps accepted 8 tokens; SGLang has not folded them into its totals yet (its field is unset)
    assert live_accept_length(_reporter(acc=8, ct=3)) == pytest.approx(8 / 3)
    # 40 folded (100 tokens) + 5 pending (9 tokens)
    assert live_accept_length(_reporter(100, 40, 9, 5)) == pytest.approx(109 / 45)


class _FakeStep:
    def metrics(self):
        return {"decode_steps": 7}


def test_server_info_gets_the_live_average_and_keeps_the_hybrid_metrics(monkeypatch):
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    # install() patches SGLang's classes; restore them after the test
    monkeypatch.setattr(SchedulerInternalStateController, "_add_speculative",
                        SchedulerInternalStateController._add_speculative)
    monkeypatch.setattr(SchedulerOutputStreamer, "build_additional_customized_info",
                        SchedulerOutputStreamer.build_additional_customized_info)
    monkeypatch.setattr(SchedulerOutputStreamer, "has_additional_customized_info",
                        SchedulerOutputStreamer.has_additional_customized_info)
    monkeypatch.setitem(observability._ACTIVE, "step", None)
    observability.install(_FakeStep())

    algo = SimpleNamespace(is_none=lambda: False, is_dspark=lambda: False)
    ctl = SchedulerInternalStateController.__new__(SchedulerInternalStateController)
    ctl.scheduler = SimpleNamespace(spec_algorithm=algo, metrics_reporter=_reporter(acc=8, ct=3), draft_worker=None)
    state = {}
    ctl._add_speculative(state)
    assert state["avg_spec_accept_length"] == pytest.approx(8 / 3)  # SGLang alone leaves it unset here
    assert state["hybrid_spark"] == {"decode_steps": 7}
    # after SGLang's periodic fold the value is the same lifetime average
    ctl.scheduler.metrics_reporter = _reporter(8, 3, 0, 0)
    state = {}
    ctl._add_speculative(state)
    assert state["avg_spec_accept_length"] == pytest.approx(8 / 3)
