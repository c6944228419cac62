"""Two device counters for one kind of chain: request-steps that verified it, and the drafts accepted on them.

Shared by the corpus candidate (``candidates.py``) and the n-gram tail (``tail.py``). ``add`` runs in the decode
step: it writes only into buffers made at construction for the largest batch, never reads the device, and ends
with a non-blocking copy to the host, so ``counts()`` is at most one step stale and never waits.
"""

from __future__ import annotations

import torch

from ..backend import resolve_backend

__all__ = ["ChainCounters"]


class ChainCounters:
    """``names``: the two metric names (request-steps, accepted drafts). ``offset``: the committed tokens that are
    not drafts of this kind (the bonus token, and for a tail the model chain before it)."""

    def __init__(self, max_bs: int, device: torch.device | str, names: tuple[str, str], offset: int,
                 backend: str = "auto") -> None:
        dev = torch.device(device)
        self.names = names
        self.used = torch.zeros(max_bs, dtype=torch.bool, device=dev)  # the caller writes this step's mask here
        self.counters = torch.zeros(2, dtype=torch.int64, device=dev)
        self._host = torch.zeros(2, dtype=torch.int64, pin_memory=dev.type == "cuda")
        self._used_i = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self._acc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self._step = torch.zeros(2, dtype=torch.int64, device=dev)
        self._offset = torch.full((), offset, dtype=torch.int64, device=dev)
        self._step0, self._step1 = self._step[0], self._step[1]
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.backend = resolve_backend(backend, dev)
        self._add = self._add_torch
        if self.backend == "triton":  # one launch (counters_kernel.py), the same integers
            from functools import partial

            from .counters_kernel import chain_counters_add_triton

            self._add = partial(chain_counters_add_triton, self)

    def rows(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(used, used_i, acc)[:bs]``, sliced once per batch size (a slice is a Python-level op that an eagerly
        launched step pays on every call). The caller writes this step's mask into ``used``."""
        v = self._views.get(bs)
        if v is None:
            v = self._views[bs] = (self.used[:bs], self._used_i[:bs], self._acc[:bs])
        return v

    def add(self, counts: torch.Tensor) -> None:
        """Count the requests marked in ``self.used[:bs]``, with ``max(0, counts - offset)`` drafts accepted each
        (``counts [bs]``: committed tokens, accepted drafts then the bonus)."""
        used, used_i, acc = self.rows(counts.shape[0])
        self._add(used, used_i, acc, counts)
        self._host.copy_(self.counters, non_blocking=True)

    def _add_torch(self, used: torch.Tensor, used_i: torch.Tensor, acc: torch.Tensor, counts: torch.Tensor) -> None:
        """The reference of ``counters_kernel.chain_counters_add_triton`` and the CPU's path: ``used_i`` = the mask
        as int64, ``acc`` = ``max(counts - offset, 0)`` where marked, ``_step`` = their sums, added to
        ``counters``."""
        used_i.copy_(used)  # bool -> int64 in place (mixed-dtype ops would allocate)
        acc.copy_(counts)
        acc.sub_(self._offset)
        acc.clamp_(min=0)
        acc.mul_(used_i)
        torch.sum(used_i, 0, out=self._step0)
        torch.sum(acc, 0, out=self._step1)
        self.counters.add_(self._step)

    def counts(self) -> dict:
        """Host side, never waits."""
        c, a = self._host.tolist()
        return {self.names[0]: int(c), self.names[1]: int(a)}
