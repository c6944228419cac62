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
