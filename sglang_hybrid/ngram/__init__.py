"""On-device n-gram (prompt-lookup) drafter: a token-history table per request-pool slot and a batched lookup.

Public API: :class:`TokenHistory` (write_prompt / append / reset / lookup), :class:`NgramConfig`,
:class:`NgramDraft`. Semantics: ``reference.py``; Triton kernels: ``kernels.py`` (imported lazily, only by a
table using the Triton backend).
"""

from .config import N_MAX_LIMIT, NgramConfig, NgramDraft
from .history import BACKENDS, TokenHistory

__all__ = ["TokenHistory", "NgramConfig", "NgramDraft", "BACKENDS", "N_MAX_LIMIT"]
