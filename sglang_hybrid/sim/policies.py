"""The three policies the simulator compares, each calling the real code a server would run.

* ``DSparkPolicy``: SGLang 0.5.23's own DSpark planner, imported from the installed SGLang: the batch budget
  ``compute_verify_token_budget`` on survivals ``lag`` steps old (SGLang's default relay lag is 2 steps) and
  the per-request top-K ``schedule_verify_lens_topk`` on the fresh confidences (its CPU torch path).
* ``NgramPolicy``: like SGLang's NGRAM: the n-gram draft (our prompt-lookup drafter, ``TokenHistory.lookup``)
  verified whole, in a fixed window of ``width`` tokens per request (root included) whatever the draft's
  length, no budget. (SGLang's NGRAM drafts a BFS tree from a cross-request trie; a linear chain from the
  request's own history stands in for it.)
* ``HybridPolicy``: what the HYBRID_SPARK worker runs (``sglang_hybrid.step.HybridStep.propose``): the n-gram
  lookup, the calibration (``DeviceCalibration.apply``) and ``select_chains`` in SPS mode (budget from the
  fresh merged chains), with the model chain's survival from the drafter's confidences.

``step`` returns the chosen chain's tokens ``[bs, C]`` (int32), draft tokens to verify ``[bs]`` (a prefix of
the chain), the verify batch ``B`` in tokens (what the step costs) and which requests took the n-gram chain.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

import torch

from ..ngram import NgramConfig, TokenHistory
from ..selection import SelectionBuffers, dense_sps, select_chains
from ..selection.sps import SpsTable


@dataclass
class StepInput:
    """What a policy sees at one decode step (rows are the running requests, in slot order)."""

    slots: torch.Tensor  # [bs] int64 token-history slots
    requests: list[int]  # request index of each row
    model_tokens: torch.Tensor  # [bs, gamma] int32 the model drafter's chain
    conf: torch.Tensor  # [bs, gamma] float32 its per-position conditional confidences


@dataclass
class StepOutput:
    tokens: torch.Tensor  # [bs, C] int32 chosen chain
    verify_len: torch.Tensor  # [bs] draft tokens verified
    batch_tokens: int  # verify batch B (roots included)
    ngram_chosen: torch.Tensor  # [bs] bool
    # Calibration diagnostics (hybrid): the n-gram chain as drafted and its calibrated survivals.
    ngram_tokens: Optional[torch.Tensor] = None  # [bs, L]
    ngram_len: Optional[torch.Tensor] = None  # [bs]
    ngram_surv: Optional[torch.Tensor] = None  # [bs, L]


class DSparkPolicy:
    """Model chain only; SGLang's DSpark budget (lagged survivals) and top-K verify lengths."""

    name = "dspark"
    uses_model = True

    def __init__(self, gamma: int, sps: SpsTable, lag: int = 2) -> None:
        from sglang.kernels.ops.speculative.dspark.dspark_schedule import schedule_verify_lens_topk
        from sglang.srt.speculative.dspark_components.dspark_planner import (
            DSparkScheduleConfig,
            compute_verify_token_budget,
        )
        from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable

        if lag < 0:
            raise ValueError(f"dspark lag: must be >= 0, got {lag}")
        self._budget_fn = compute_verify_token_budget
        self._lens_fn = schedule_verify_lens_topk
        self.cfg = DSparkScheduleConfig(gamma=gamma)
        self.cfg.validate()
        self.table = SpsCostTable(sample_batch_tokens=list(sps.sample_batch_tokens),
                                  sample_steps_per_sec=list(sps.sample_steps_per_sec),
                                  max_batch_tokens=sps.max_batch_tokens)
        self.lag = lag
        self._past: dict[int, deque] = {}  # slot -> (request, conf row) of the last `lag` steps

    def _lagged(self, inp: StepInput) -> torch.Tensor:
        if self.lag == 0:
            return inp.conf
        rows = []
        for b, (slot, req) in enumerate(zip(inp.slots.tolist(), inp.requests)):
            q = self._past.setdefault(slot, deque(maxlen=self.lag))
            if len(q) == self.lag and q[0][0] == req:
                rows.append(q[0][1])
            else:  # SGLang: a request younger than the lag counts as all-surviving
                rows.append(torch.ones_like(inp.conf[b]))
            q.append((req, inp.conf[b].clone()))
        return torch.stack(rows)

    def step(self, inp: StepInput, history: TokenHistory) -> StepOutput:
        survival = torch.cumprod(self._lagged(inp).to(torch.float32), dim=1)
        budget = self._budget_fn(history_survival_probs=survival, sps_table=self.table, cfg=self.cfg).budget
        lens = self._lens_fn(confidence=inp.conf, budget=budget, cfg=self.cfg).to(torch.int64) - 1
        bs = inp.conf.shape[0]
        return StepOutput(inp.model_tokens, lens, bs + int(lens.sum()), torch.zeros(bs, dtype=torch.bool))


class NgramPolicy:
    """N-gram chain only, verified whole in a fixed ``width``-token window per request (SGLang NGRAM-like)."""

    name = "ngram"
    uses_model = False

    def __init__(self, width: int = 12, n_min: int = 2, n_max: int = 8, window: int = 0) -> None:
        if width < 2:
            raise ValueError(f"ngram verify width: must be >= 2 (root + 1 draft), got {width}")
        self.width = width
        self.cfg = NgramConfig(n_min=n_min, n_max=n_max, max_draft=width - 1, window=window)
        self.cfg.validate()

    def step(self, inp: StepInput, history: TokenHistory) -> StepOutput:
        d = history.lookup(inp.slots, self.cfg)
        bs = inp.slots.shape[0]
        return StepOutput(d.tokens, d.length.to(torch.int64), bs * self.width, d.length > 0)


class HybridPolicy:
    """Hybrid Spark: n-gram lookup + calibration + ``select_chains``, as the worker runs them.

    ``fixed_window``: None models a ragged verify (DSpark-style: SPS-mode budget, a step verifies only the chosen
    lengths). An int ``W`` models the EAGLE-family worker: every request runs a ``W + 1``-token verify window
    whichever chain it takes (``B = bs * (W + 1)``), the budget never binds (``K = bs * W``), and the price only
    picks each request's chain.
    """

    name = "hybrid"
    uses_model = True

    def __init__(self, gamma: int, max_bs: int, sps: SpsTable, calibration, *, n_min: int = 2, n_max: int = 8,
                 max_draft: int = 7, window: int = 0, num_iters: int = 2, enable_ngram: bool = True,
                 max_verify_len: Optional[int] = None, fixed_window: Optional[int] = None) -> None:
        self.cfg = NgramConfig(n_min=n_min, n_max=n_max, max_draft=max_draft, window=window)
        self.cfg.validate()
        calibration.check_covers(self.cfg)
        self.calib = calibration.to_device("cpu")
        self.gamma = gamma
        self.enable_ngram = enable_ngram
        self.num_iters = num_iters
        width = max(gamma, max_draft)
        self.max_verify_len = gamma if max_verify_len is None else max_verify_len
        self.sel = SelectionBuffers(max_bs, width, "cpu")
        self.sps = dense_sps(sps, max_bs * (1 + width), "cpu")
        if fixed_window is not None and fixed_window < width:
            raise ValueError(f"fixed_window ({fixed_window}) must be >= max(gamma, max_draft) = {width}")
        self.fixed_window = fixed_window
        self._budget = torch.zeros(1, dtype=torch.int32)
        self.q = torch.zeros(max_bs, max_draft, dtype=torch.float32)
        self.surv = torch.zeros(max_bs, max_draft, dtype=torch.float32)

    def step(self, inp: StepInput, history: TokenHistory) -> StepOutput:
        bs = inp.slots.shape[0]
        d = history.lookup(inp.slots, self.cfg)
        q, surv = self.q[:bs], self.surv[:bs]
        self.calib.apply(d, inp.model_tokens, q, surv)
        nlen = d.length if self.enable_ngram else torch.zeros_like(d.length)
        model_surv = torch.cumprod(inp.conf, dim=1)
        out = self.sel.view(bs)
        if self.fixed_window is None:
            select_chains(inp.model_tokens, model_surv, d.tokens, surv, nlen, None, self.sps, out,
                          num_iters=self.num_iters, max_verify_len=self.max_verify_len)
        else:
            self._budget.fill_(bs * self.fixed_window)
            select_chains(inp.model_tokens, model_surv, d.tokens, surv, nlen, self._budget, None, out,
                          num_iters=self.num_iters, max_verify_len=self.max_verify_len)
        vl = out.verify_len.to(torch.int64)
        batch = bs + int(vl.sum()) if self.fixed_window is None else bs * (1 + self.fixed_window)
        return StepOutput(out.tokens, vl, batch, out.choice == 1, d.tokens, nlen, surv)
