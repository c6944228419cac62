"""What a simulated decode step costs, in seconds.

* ``SpsCost`` (default): ``1 / SPS(B)`` from an SPS table in SGLang's DSpark format, B = verify batch tokens.
  This is the cost model SGLang's DSpark planner itself believes. A one-dimensional table cannot see how many
  requests (and how much KV cache) a step of B tokens holds: the shipped roofline table assumes B / 8 requests
  of 1024 context tokens, so it under-charges short-verify steps of many requests (DSpark at batch 128 verifies
  about 2 tokens per request) and over-charges long fixed windows (NGRAM's 12).
* ``Roofline2DCost`` (``--cost roofline-2d``): the same roofline (``selection.sps.roofline_step_seconds``, its
  default constants) with the KV read charged for the step's actual requests and context lengths:
  ``overhead + weights / bw + sum_r ctx_r * kv_bytes / bw + (2 * params / flops) * max(0, B - knee)``.
  The planners still decide with the SPS table, as they would in SGLang.
"""

from __future__ import annotations

import inspect

from ..selection.sps import SpsTable, roofline_step_seconds

COSTS = ("sps", "roofline-2d")


class SpsCost:
    name = "sps"

    def __init__(self, table: SpsTable) -> None:
        self.table = table

    def seconds(self, batch_tokens: int, num_requests: int, context_tokens: int) -> float:
        return 1.0 / self.table.lookup(batch_tokens)


class Roofline2DCost:
    name = "roofline-2d"

    def __init__(self, **overrides: float) -> None:
        p = {k: v.default for k, v in inspect.signature(roofline_step_seconds).parameters.items()
             if v.default is not inspect.Parameter.empty}
        p.update(overrides)
        self.params = p
        self.weight_s = p["params"] * p["bytes_per_param"] / p["hbm_bytes_per_s"]
        self.kv_s_per_token = p["kv_bytes_per_token"] / p["hbm_bytes_per_s"]
        self.per_token_s = 2.0 * p["params"] / p["flops_per_s"]
        self.knee = self.weight_s / self.per_token_s

    def seconds(self, batch_tokens: int, num_requests: int, context_tokens: int) -> float:
        return (self.params["overhead_s"] + self.weight_s + context_tokens * self.kv_s_per_token
                + self.per_token_s * max(0.0, batch_tokens - self.knee))


def make_cost(name: str, table: SpsTable):
    if name == "sps":
        return SpsCost(table)
    if name == "roofline-2d":
        return Roofline2DCost()
    raise ValueError(f"cost: choose from {COSTS}, got {name!r}")
