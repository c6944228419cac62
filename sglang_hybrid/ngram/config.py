"""Configuration and output types of the n-gram drafter."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["NgramConfig", "NgramDraft", "N_MAX_LIMIT"]

# The Triton lookup unrolls its comparison loop n_max times; beyond this a compile gets slow for no gain.
N_MAX_LIMIT = 64


@dataclass(frozen=True)
class NgramConfig:
    """Lookup parameters (see ``reference.py`` for the exact semantics).

    ``n_min`` / ``n_max``: shortest / longest suffix compared; ``max_draft``: L_max, tokens proposed;
    ``window``: how many end positions before the suffix are scanned (0 = the whole row).
    """

    n_min: int = 2
    n_max: int = 8
    max_draft: int = 16
    window: int = 0

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the offending field."""
        for name in ("n_min", "n_max", "max_draft", "window"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"NgramConfig.{name} must be an int, got {type(v).__name__}")
        if self.n_min < 1:
            raise ValueError(f"NgramConfig.n_min must be >= 1, got {self.n_min}")
        if self.n_max < self.n_min:
            raise ValueError(f"NgramConfig.n_max must be >= n_min ({self.n_min}), got {self.n_max}")
        if self.n_max > N_MAX_LIMIT:
            raise ValueError(f"NgramConfig.n_max must be <= {N_MAX_LIMIT}, got {self.n_max}")
        if self.max_draft < 1:
            raise ValueError(f"NgramConfig.max_draft must be >= 1, got {self.max_draft}")
        if self.window < 0:
            raise ValueError(f"NgramConfig.window must be >= 0, got {self.window}")


@dataclass
class NgramDraft:
    """One lookup's result for ``bs`` requests; usually views into a table's preallocated buffers.

    ``tokens [bs, max_draft]`` int32, 0 past ``length``; ``length [bs]`` (0 = no match), ``match_len [bs]``
    (suffix length matched), ``match_count [bs]`` (occurrences of that suffix in the scanned window, the chosen
    one included), ``in_prompt [bs]`` (1 if the continuation starts inside the prompt); all int32, on the
    table's device. The buffers are overwritten by the next lookup that uses them.
    """

    tokens: torch.Tensor
    length: torch.Tensor
    match_len: torch.Tensor
    match_count: torch.Tensor
    in_prompt: torch.Tensor

    @classmethod
    def zeros(cls, rows: int, width: int, device: torch.device | str) -> "NgramDraft":
        """Zeroed int32 buffers for ``rows`` lookups of up to ``width`` tokens (``TokenHistory.lookup(..., out=)``)."""
        i32 = dict(dtype=torch.int32, device=device)
        return cls(torch.zeros(rows, width, **i32), *(torch.zeros(rows, **i32) for _ in range(4)))

    def rows(self, bs: int) -> "NgramDraft":
        """Views of the first ``bs`` rows."""
        return NgramDraft(self.tokens[:bs], self.length[:bs], self.match_len[:bs], self.match_count[:bs],
                          self.in_prompt[:bs])

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        """``(tokens, length, match_len, match_count, in_prompt)``: the launchers' output order."""
        return (self.tokens, self.length, self.match_len, self.match_count, self.in_prompt)
