"""Two-dimensional SPS: step time by verify batch tokens *and* by the KV context the step reads.

SGLang's SPS table is one-dimensional: steps/sec at ``B`` verify tokens. The step also reads every running
request's KV cache, and that cost depends on the requests' context lengths, not on ``B``; a 1-D table bakes in
one assumed context per token (the shipped roofline: one request of 1024 tokens per 8 verify tokens). When the
real context is larger, a step's fixed cost is larger, verify tokens are relatively cheaper, and the 1-D price
buys too few of them (the simulator's ``--cost roofline-2d`` showed the hybrid at 0.80x NGRAM on code edits at
batch 128 for this reason).

An :class:`Sps2DTable` holds one SPS row (an :class:`SpsTable`) per context level ``C_k`` (total KV tokens the
step reads, ascending). :class:`DenseSps2D` is its device form: step times ``T[k, B]`` for every ``B``, and
:meth:`DenseSps2D.fill` writes the steps/sec row for the step's context ``C`` into the selection's dense SPS
buffer, interpolating the step *time* linearly in ``C`` between the two levels around it (linear extrapolation
past the last: the KV read is linear in ``C``). No host read, no allocation: one device scalar in, one
preallocated row out, so it runs inside the decode step.

JSON format (``format: sglang-hybrid-sps2d/1``)::

    {"format": "sglang-hybrid-sps2d/1", "context_tokens": [0, 65536, ...],
     "rows": [<SpsTable JSON: sample_batch_tokens, sample_steps_per_sec, max_batch_tokens>, ...]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..jsonl_io import read_json
from .sps import SpsTable, SpsTableError, dense_sps, roofline_probes, roofline_step_seconds

FORMAT = "sglang-hybrid-sps2d/1"


@dataclass(frozen=True)
class Sps2DTable:
    """SPS rows by context level; ``context_tokens`` strictly increasing, >= 0, one row each (>= 2 levels)."""

    context_tokens: tuple[int, ...]
    rows: tuple[SpsTable, ...]
    source: str = field(default="<memory>", compare=False)

    def __post_init__(self) -> None:
        c = self.context_tokens
        if len(c) < 2 or len(c) != len(self.rows):
            raise SpsTableError(f"2-D SPS table {self.source}: needs >= 2 context levels and one row each, got "
                                f"{len(c)} levels and {len(self.rows)} rows")
        for i, x in enumerate(c):
            if isinstance(x, bool) or not isinstance(x, int) or x < 0 or (i and x <= c[i - 1]):
                raise SpsTableError(f"2-D SPS table {self.source}: 'context_tokens' must be strictly increasing "
                                    f"ints >= 0; entry {i} = {x!r}")

    def seconds(self, batch_tokens: int, context_tokens: float) -> float:
        """Host definition of :meth:`DenseSps2D.fill` (step seconds; for the tests and reports)."""
        c = self.context_tokens
        k = min(max(int(np.searchsorted(np.asarray(c), context_tokens, side="right")) - 1, 0), len(c) - 2)
        w = max(0.0, (context_tokens - c[k]) / (c[k + 1] - c[k]))
        lo, hi = 1.0 / self.rows[k].lookup(batch_tokens), 1.0 / self.rows[k + 1].lookup(batch_tokens)
        return (1.0 - w) * lo + w * hi

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "context_tokens": list(self.context_tokens),
                "rows": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, data: Any, source: str = "<memory>") -> "Sps2DTable":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise SpsTableError(f"2-D SPS table {source}: expected a JSON object with \"format\": \"{FORMAT}\"")
        ctx, rows = data.get("context_tokens"), data.get("rows")
        if not isinstance(ctx, list) or not isinstance(rows, list):
            raise SpsTableError(f"2-D SPS table {source}: 'context_tokens' and 'rows' must be lists")
        return cls(tuple(ctx), tuple(SpsTable.from_dict(r, f"{source} row {i}") for i, r in enumerate(rows)),
                   source=source)


def load_sps2d_table(path: str | Path) -> Sps2DTable:
    return Sps2DTable.from_dict(read_json(path, "2-D SPS table", SpsTableError), source=str(Path(path)))


def roofline_sps2d_table(max_batch_tokens: int = 512 * 33, max_context_tokens: int = 1 << 23,
                         **model: float) -> Sps2DTable:
    """The roofline of :func:`~sglang_hybrid.selection.sps.roofline_step_seconds` with the KV read charged for
    the step's total context (the simulator's ``--cost roofline-2d``): two context levels suffice, since the
    time is linear in it; a third at the midpoint keeps the table honest for tables that are not."""
    probes = roofline_probes(max_batch_tokens)
    kv = model.pop("kv_bytes_per_token", 36 * 8 * 128 * 2 * 2)
    bw = model.get("hbm_bytes_per_s", 4.3e12)
    base = roofline_step_seconds(probes, kv_bytes_per_token=0.0, **model)  # no KV: the 1-D model's other terms
    levels = (0, max_context_tokens // 2, max_context_tokens)
    rows = tuple(SpsTable(tuple(probes), tuple(float(1.0 / (t + c * kv / bw)) for t in base), max_batch_tokens,
                          source=f"roofline_sps2d_table() C={c}") for c in levels)
    return Sps2DTable(levels, rows, source="roofline_sps2d_table()")


class DenseSps2D:
    """Device form of an :class:`Sps2DTable` for batch tokens ``0..max_tokens``."""

    def __init__(self, table: Sps2DTable, max_tokens: int, device: torch.device | str) -> None:
        dev = torch.device(device)
        self.table = table
        self.times = torch.stack([1.0 / dense_sps(r, max_tokens, dev) for r in table.rows])  # [K, B + 1]
        self.edges = torch.tensor(table.context_tokens, dtype=torch.float32, device=dev)
        n = len(table.context_tokens)
        self._ctx = torch.zeros(1, dtype=torch.float32, device=dev)
        self._k = torch.zeros(1, dtype=torch.int64, device=dev)
        self._k1 = torch.zeros(1, dtype=torch.int64, device=dev)
        self._e = torch.zeros(2, dtype=torch.float32, device=dev)
        self._w = torch.zeros(1, dtype=torch.float32, device=dev)
        self._lo = torch.zeros(1, max_tokens + 1, dtype=torch.float32, device=dev)
        self._hi = torch.zeros(1, max_tokens + 1, dtype=torch.float32, device=dev)
        self._one_i = torch.ones(1, dtype=torch.int64, device=dev)
        self._zero_i = torch.zeros(1, dtype=torch.int64, device=dev)
        self._last_i = torch.full((1,), n - 2, dtype=torch.int64, device=dev)
        self._zero_f = torch.zeros(1, dtype=torch.float32, device=dev)
        self._one_f = torch.ones(1, dtype=torch.float32, device=dev)

    def fill(self, context_tokens: torch.Tensor, out: torch.Tensor) -> None:
        """Write steps/sec at ``context_tokens`` (a device scalar: the step's total KV tokens) into ``out [B+1]``."""
        self._ctx.copy_(context_tokens.reshape(1))
        torch.searchsorted(self.edges, self._ctx, right=True, out=self._k)
        self._k.sub_(self._one_i)
        torch.clamp(self._k, self._zero_i, self._last_i, out=self._k)  # k in [0, K - 2]
        torch.add(self._k, self._one_i, out=self._k1)
        torch.index_select(self.edges, 0, self._k, out=self._e[:1])
        torch.index_select(self.edges, 0, self._k1, out=self._e[1:])
        torch.sub(self._ctx, self._e[:1], out=self._w)
        self._e[1:].sub_(self._e[:1])
        self._w.div_(self._e[1:])
        torch.clamp(self._w, min=self._zero_f, out=self._w)  # extrapolate above the last level, not below 0
        torch.index_select(self.times, 0, self._k, out=self._lo)
        torch.index_select(self.times, 0, self._k1, out=self._hi)
        self._hi.sub_(self._lo).mul_(self._w).add_(self._lo)  # time = lo + w (hi - lo)
        torch.div(self._one_f, self._hi.view(-1), out=out)
