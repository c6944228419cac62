"""``narrow_above`` from an SPS table: where the EAGLE-family worker's wide verify window stops paying.

The EAGLE-family verify runs the same window for every request. At batch ``b`` a step of the wide window
(``wide_tokens`` per request, root included) yields ``b * accept_wide`` tokens in ``1 / SPS(b * wide_tokens)``
seconds, and the narrow one (``steps + 1`` tokens) ``b * accept_narrow`` in ``1 / SPS(b * narrow_tokens)``. The
wide window pays at ``b`` iff ``accept_wide * SPS(b * wide_tokens) >= accept_narrow * SPS(b * narrow_tokens)``
(the batch size cancels). ``auto_narrow_above`` returns the last batch size before the first one where it does
not pay: the threshold the ``narrow_above`` option takes (batches of more requests narrow).

Acceptance estimates (tokens per request per step, bonus included) come from the caller: the simulator's fixed-
window runs, or a served log's ``meta_info["hybrid_spark"]``; for a start-up default, the model chain's prior
(``model_prior``) and the calibration table's expected n-gram accepted length give both.
"""

from __future__ import annotations

from .sps import SpsTable


def auto_narrow_above(sps: SpsTable, *, wide_tokens: int, narrow_tokens: int, accept_wide: float,
                      accept_narrow: float, max_batch_size: int) -> int:
    """The ``narrow_above`` threshold for batch sizes ``1..max_batch_size`` (see the module docstring).

    Returns 0 (never narrow) when the wide window pays at every batch size up to ``max_batch_size``; otherwise
    ``b* - 1`` for the first batch size ``b*`` where it does not pay, at least 1 (a wide window that does not pay
    even at batch 1 should not be configured; the threshold then keeps it for single requests only).
    """
    if narrow_tokens < 1 or wide_tokens <= narrow_tokens:
        raise ValueError(f"auto_narrow_above: need 1 <= narrow_tokens < wide_tokens, got {narrow_tokens}, "
                         f"{wide_tokens}")
    if not (accept_wide >= 1.0 and accept_narrow >= 1.0):
        raise ValueError(f"auto_narrow_above: accepted tokens per step include the bonus token (>= 1), got "
                         f"accept_wide={accept_wide}, accept_narrow={accept_narrow}")
    if max_batch_size < 1:
        raise ValueError(f"auto_narrow_above: max_batch_size must be >= 1, got {max_batch_size}")
    for b in range(1, max_batch_size + 1):
        if accept_wide * sps.lookup(b * wide_tokens) < accept_narrow * sps.lookup(b * narrow_tokens):
            return max(1, b - 1)
    return 0


class AutoNarrow:
    """``narrow_above = auto``: the threshold from the SPS table and the acceptance measured under each window.

    Host-side bookkeeping only (the worker feeds it the host copies of its counters, which never wait on the
    device). Before any evidence both windows are assumed to accept ``prior_accept`` tokens per request step,
    so the wide window is kept exactly where the SPS table says it costs nothing extra (the memory-bound
    region). As steps run, each window's estimate is ``(prior_weight * prior + accepted) / (prior_weight +
    request_steps)`` over the steps verified with it (decayed by ``decay`` per observation, so it follows the
    traffic), and the threshold is recomputed with :func:`auto_narrow_above`. Acceptance per request step does
    not depend on the batch size under a fixed window (the budget never binds), so what small batches measure
    under the wide window prices it for large ones.
    """

    def __init__(self, sps: SpsTable, *, wide_tokens: int, narrow_tokens: int, prior_accept: float,
                 max_batch_size: int, prior_weight: float = 256.0, decay: float = 0.99) -> None:
        if not prior_accept >= 1.0:
            raise ValueError(f"AutoNarrow: prior_accept includes the bonus token (>= 1), got {prior_accept}")
        if not (prior_weight > 0 and 0.0 < decay <= 1.0):
            raise ValueError(f"AutoNarrow: need prior_weight > 0 and decay in (0, 1], got {prior_weight}, {decay}")
        self.sps, self.wide_tokens, self.narrow_tokens = sps, wide_tokens, narrow_tokens
        self.max_batch_size, self.prior, self.weight, self.decay = max_batch_size, prior_accept, prior_weight, decay
        self._steps = {"wide": 0.0, "narrow": 0.0}
        self._acc = {"wide": 0.0, "narrow": 0.0}
        self.threshold = self.refresh()

    def observe(self, window: str, request_steps: float, accepted: float) -> None:
        """``request_steps`` request-steps verified with ``window`` ("wide" / "narrow") committed ``accepted``
        tokens (bonus included)."""
        if window not in self._steps:
            raise ValueError(f"AutoNarrow: window must be 'wide' or 'narrow', got {window!r}")
        if request_steps <= 0:
            return
        for w in self._steps:
            self._steps[w] *= self.decay
            self._acc[w] *= self.decay
        self._steps[window] += request_steps
        self._acc[window] += accepted

    def estimate(self, window: str) -> float:
        return (self.weight * self.prior + self._acc[window]) / (self.weight + self._steps[window])

    def refresh(self) -> int:
        """Recompute and return the threshold (0 = never narrow)."""
        self.threshold = auto_narrow_above(
            self.sps, wide_tokens=self.wide_tokens, narrow_tokens=self.narrow_tokens,
            accept_wide=max(1.0, self.estimate("wide")), accept_narrow=max(1.0, self.estimate("narrow")),
            max_batch_size=self.max_batch_size)
        return self.threshold
