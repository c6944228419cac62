"""Per-request fairness weights for the batch-wide selection (option ``fairness``).

The SPS selection spends one verify budget on the batch's most likely tokens, which maximises the batch's tokens
per second. In traffic that mixes kinds that starves the requests whose tokens are least likely: a code edit's
n-gram copy (survivals near 1) outbids a chat request's model chain (0.5-0.8), and in the simulator chat requests
beside code edits ran at 0.63x DSpark's speed at batch 32 and about 0.5x at batch 128 (README, "Mixed traffic").

With ``fairness`` ``a > 0`` each request's survivals (both chains) are multiplied by

    w_r = (m / x_r) ** a,   x_r = committed tokens / verify steps of request r so far (bonus included),

``m`` the smallest ``x`` in the batch, before the selection: proportional fairness for ``a = 1`` (a token is worth
more to a request that gets few tokens a step), the batch total for ``a = 0``. A request with no verify step yet
takes the mean ``x`` of the batch's others (``w = 1`` when none has one). ``w <= 1``, since the selection clamps
survivals to [0, 1]; the selection's root term stays one token per request. The choice between a request's two
chains is unchanged (both are scaled alike); only how much of the batch's budget each request gets moves.

Decode-step rules: ``weights`` and ``update`` write only into buffers made at construction, never read the device
on the host and never branch on device data. ``fair_weights_ref`` is the plain definition the tests compare with.
"""

from __future__ import annotations

import torch

__all__ = ["FairWeights", "fair_weights_ref"]


def fair_weights_ref(steps: list[int], committed: list[int], alpha: float) -> list[float]:
    """Plain definition: the weights of one batch, ``steps[r]`` / ``committed[r]`` the request's counts so far."""
    known = [c / s for s, c in zip(steps, committed) if s > 0]
    if not known:
        return [1.0] * len(steps)
    fill = sum(known) / len(known)
    x = [c / s if s > 0 else fill for s, c in zip(steps, committed)]
    m = min(x)
    return [(m / v) ** alpha for v in x]


class FairWeights:
    """Per-slot committed-token records and the weights they give (see the module docstring).

    Args:
        num_slots: request-pool slots (rows of the record).
        max_bs: largest batch of one call.
        alpha: the exponent ``a`` (> 0; the step builds no ``FairWeights`` for 0).
        device: where the records live.
    """

    def __init__(self, num_slots: int, max_bs: int, alpha: float, device) -> None:
        if not alpha > 0:
            raise ValueError(f"fairness: alpha must be > 0, got {alpha}")
        self.alpha = float(alpha)
        f32 = dict(dtype=torch.float32, device=device)
        self.steps = torch.zeros(num_slots, **f32)
        self.committed = torch.zeros(num_slots, **f32)
        self.w = torch.ones(max_bs, **f32)
        self._s = torch.zeros(max_bs, **f32)
        self._x = torch.zeros(max_bs, **f32)
        self._known = torch.zeros(max_bs, dtype=torch.bool, device=device)
        self._n = torch.zeros(1, **f32)
        self._fill = torch.zeros(1, **f32)
        self._m = torch.zeros(1, **f32)
        self._one = torch.ones(1, **f32)
        self._den = torch.zeros(1, **f32)
        self._zero = torch.zeros(1, **f32)
        self._kf = torch.zeros(max_bs, **f32)

    def reset(self, slots: torch.Tensor) -> None:
        """A new request in ``slots`` (at prefill)."""
        s = slots.to(torch.int64)
        self.steps.index_fill_(0, s, 0.0)
        self.committed.index_fill_(0, s, 0.0)

    def update(self, slots: torch.Tensor, accept_lens: torch.Tensor) -> None:
        """After verify: request ``b`` committed ``accept_lens[b]`` tokens (accepted drafts + bonus) in one step."""
        bs = slots.shape[0]
        s = slots.to(torch.int64)
        self.steps.index_add_(0, s, self._one.expand(bs))
        c = self._s[:bs]
        c.copy_(accept_lens)
        self.committed.index_add_(0, s, c)

    def weights(self, slots: torch.Tensor) -> torch.Tensor:
        """``w [bs]`` for the requests in ``slots`` (a view of a preallocated buffer)."""
        bs = slots.shape[0]
        st, x, known, w = self._s[:bs], self._x[:bs], self._known[:bs], self.w[:bs]
        torch.index_select(self.steps, 0, slots, out=st)
        torch.index_select(self.committed, 0, slots, out=x)
        torch.gt(st, self._zero, out=known)
        x.div_(st.clamp_(min=1.0))  # committed per step; 0 where unknown
        kf = self._kf[:bs]
        kf.copy_(known)
        torch.sum(kf, 0, keepdim=True, out=self._n)
        torch.sum(x, 0, keepdim=True, out=self._fill)
        torch.clamp(self._n, min=1.0, out=self._den)
        self._fill.div_(self._den)
        # Unknown requests take the others' mean. With none known every x is 0 here, so after the clamp all are
        # equal and every weight is exactly 1.
        torch.where(known, x, self._fill, out=x)
        x.clamp_(min=1e-6)
        torch.amin(x, 0, keepdim=True, out=self._m)
        torch.div(self._m, x, out=w)
        w.pow_(self.alpha)
        return w
