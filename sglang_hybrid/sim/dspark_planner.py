"""SGLang 0.5.23's DSpark verify planner, re-implemented in plain torch for the simulator's DSpark baseline.

The simulator must not import SGLang (importing it takes seconds, prints unrelated warnings, and a user may
run the simulator without SGLang installed). These two functions reproduce, result for result, the CPU torch
paths of

* ``sglang.srt.speculative.dspark_components.dspark_planner.compute_verify_token_budget`` (with an
  ``SpsCostTable``): the batch budget ``K = argmax_k (bs + S_k) * SPS(bs + k)``, ``S_k`` the sum of the ``k``
  largest survivals (float64), first maximum wins;
* ``sglang.kernels.ops.speculative.dspark.dspark_schedule.schedule_verify_lens_topk`` (``min_verify_len`` 1,
  ``max_verify_len`` 0 = gamma + 1): admit the top ``K`` survivals in the order (value desc, position asc,
  request asc) and return ``1 + admitted`` per request.

``tests/test_sim_dspark_planner.py`` checks both against the installed SGLang on random inputs.
"""

from __future__ import annotations

import torch

from ..selection.fairness import SURVIVAL_EPS  # DSparkScheduleConfig.survival_eps default, one constant for both
from ..selection.sps import SpsTable


class DSparkPlanner:
    """Budget and top-K verify lengths of SGLang's DSpark planner, for chains of ``gamma`` tokens."""

    def __init__(self, gamma: int, sps: SpsTable, survival_eps: float = SURVIVAL_EPS) -> None:
        if gamma < 1:
            raise ValueError(f"DSpark gamma must be >= 1, got {gamma}")
        self.gamma = gamma
        self.max_len = gamma + 1  # DSparkScheduleConfig.resolved_max_verify_len() with max_verify_len 0
        self.eps = float(survival_eps)
        self.probes = torch.tensor(list(sps.sample_batch_tokens), dtype=torch.int64)
        self.sps = torch.tensor(list(sps.sample_steps_per_sec), dtype=torch.float64)

    def _sps(self, batch_tokens: torch.Tensor) -> torch.Tensor:
        idx = (torch.bucketize(batch_tokens, self.probes, right=True) - 1).clamp_(0, self.probes.numel() - 1)
        return self.sps[idx]

    def budget(self, survival: torch.Tensor) -> int:
        """``compute_verify_token_budget(...).budget`` for prefix survivals ``[bs, gamma]``."""
        bs = survival.shape[0]
        cand = survival[:, : self.max_len].flatten()
        cand = cand[cand >= self.eps].to(torch.float64)
        prefix = torch.cumsum(torch.sort(cand, descending=True).values, 0)
        tau = bs + torch.cat([torch.zeros(1, dtype=torch.float64), prefix])
        theta = tau * self._sps(bs + torch.arange(tau.numel(), dtype=torch.int64))
        return int(torch.argmax(theta))

    def verify_lens(self, confidence: torch.Tensor, budget: int) -> torch.Tensor:
        """``schedule_verify_lens_topk(confidence, budget, cfg)``: int32 ``[bs]``, root included."""
        surv = torch.cumprod(confidence.to(torch.float32), dim=1)[:, : self.max_len]
        bs, g = surv.shape
        extra = torch.zeros(bs, dtype=torch.int64)
        if budget > 0 and surv.numel() > 0:
            # Position-major flattening is already ordered by (position, request): one stable sort by value.
            flat = surv.t().reshape(-1).to(torch.float64)
            valid = flat >= self.eps
            order = torch.argsort(-torch.where(valid, flat, torch.full_like(flat, float("-inf"))), stable=True)
            chosen = order[: min(int(budget), flat.numel())]
            extra.scatter_add_(0, chosen % bs, valid[chosen].to(torch.int64))
        return torch.clamp(1 + extra, min=1, max=self.max_len).to(torch.int32)
