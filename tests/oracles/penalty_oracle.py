"""SGLang's sampling penalties on one next-token row, written out for the tests that check them end to end.

The library's own formula (``sglang_hybrid.penalties._penalise``) is not called here: an oracle ought not to be
the code it checks. ``tests/test_penalties.py`` checks that formula against SGLang's penalizers themselves.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch


def penalise(logits: torch.Tensor, output: Sequence[int], penalty: Mapping[str, float]) -> torch.Tensor:
    """``logits [V]`` of the next token after ``output`` (the request's output tokens so far), penalised as
    SGLang's plain decoding does, in ``logits``' dtype: the counts ``n`` of ``output`` give the additive term
    ``- frequency_penalty * n - presence_penalty * [n > 0]`` (one term, as SGLang sums them), then positive logits
    are divided by ``repetition_penalty`` where ``n > 0`` and negative ones multiplied. ``penalty`` holds any of
    the three names; a missing one is neutral. Returns a new tensor."""
    n = torch.bincount(torch.tensor(list(output), dtype=torch.int64), minlength=logits.shape[0]).to(logits.dtype)
    seen = n > 0
    out = logits + (-(n * penalty.get("frequency_penalty", 0.0)) - seen * penalty.get("presence_penalty", 0.0))
    scale = torch.where(seen, penalty.get("repetition_penalty", 1.0), 1.0).to(logits.dtype)
    return torch.where(out < 0, out * scale, out / scale)
