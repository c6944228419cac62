"""``narrow_above = auto`` on the EAGLE-family worker: the window switch's threshold from an SPS table and the
acceptance measured under each window (``selection/narrow.py: AutoNarrow``).

The SPS table is SGLang's ``--speculative-dspark-sps-table-path`` when given (a measured table of the serving
machine), else the shipped roofline table. The prior acceptance of both windows is the model chain's:
``1 + sum_{j=1..steps} model_prior^j``. Every decode step, on the host, the counters' host copy (at most one
step stale; no device read) is split by the window that verified the steps: at each switch and every
``REFRESH_STEPS`` steps the delta since the last snapshot goes to the window that was active, and the threshold
is recomputed. The narrow state's CUDA graphs are captured for every batch size, since the threshold moves.
"""

from __future__ import annotations

import logging

from ..selection.narrow import AutoNarrow
from ..selection.sps import load_default_sps_table, load_sps_table

logger = logging.getLogger("sglang_hybrid")

REFRESH_STEPS = 32


class AutoNarrowDriver:
    """Feeds :class:`AutoNarrow` from a ``HybridStep``'s counters and moves a ``WindowSwitch``'s threshold."""

    def __init__(self, step, *, sps_path: str | None, wide_tokens: int, narrow_tokens: int, gamma: int,
                 model_prior: float, max_batch_size: int) -> None:
        sps = load_sps_table(sps_path) if sps_path else load_default_sps_table()
        prior = 1.0 + sum(model_prior ** j for j in range(1, gamma + 1))
        self.auto = AutoNarrow(sps, wide_tokens=wide_tokens, narrow_tokens=narrow_tokens, prior_accept=prior,
                               max_batch_size=max_batch_size)
        self.step = step
        self.sps_source = sps.source
        self._snap = self._counters()
        self._window = "wide"
        self._since = 0
        self._publish()

    @property
    def threshold(self) -> int:
        return self.auto.threshold

    def _counters(self) -> tuple[float, float]:
        m = self.step.stats.metrics()  # the staged host copy: never waits on the device
        return float(m["request_steps"]), float(m["accepted_model"] + m["accepted_ngram"])

    def _flush(self) -> None:
        rs, acc = self._counters()
        d_rs, d_acc = rs - self._snap[0], acc - self._snap[1]
        self._snap = (rs, acc)
        self.auto.observe(self._window, d_rs, d_rs + d_acc)  # committed = accepted drafts + one bonus each

    def _publish(self) -> None:
        self.step.extra_metrics.update(
            narrow_above=self.auto.threshold, narrow_above_auto=1,
            accept_per_step_wide=round(self.auto.estimate("wide"), 4),
            accept_per_step_narrow=round(self.auto.estimate("narrow"), 4))

    def before_step(self, switch, batch_size: int) -> None:
        """At the start of a decode step, before ``switch.activate(batch_size)``."""
        window = "narrow" if batch_size > switch.narrow_above else "wide"
        self._since += 1
        if window != self._window or self._since >= REFRESH_STEPS:
            self._flush()
            self._window = window
            if self._since >= REFRESH_STEPS:
                self._since = 0
                old = switch.narrow_above
                switch.narrow_above = self.auto.refresh()
                if switch.narrow_above != old:
                    logger.info("HYBRID_SPARK: narrow_above %d -> %d (accepted per request step: wide %.2f, "
                                "narrow %.2f)", old, switch.narrow_above, self.auto.estimate("wide"),
                                self.auto.estimate("narrow"))
                self._publish()
