"""Host-synchronisation discipline of the decode step, and a guard that enforces it in tests.

On a GPU, reading a device tensor on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, ...) stalls
the CPU until the GPU catches up, which breaks SGLang's overlap scheduler. On a CPU such reads are free, and a
few CPU-only shortcuts use them (range checks, trimming a scan to the longest row). ``sync_guard(True)``
makes every such read raise :class:`HostSyncError` and switches the shortcuts off, so that a CPU run executes
exactly the host logic a GPU run would, and proves it reads nothing back.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_STATE = {"depth": 0}
_NAMES = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class HostSyncError(RuntimeError):
    """A host read of tensor data inside a guarded (decode-step) region."""


def host_reads_allowed(t: torch.Tensor) -> bool:
    """True where reading ``t`` on the host costs nothing: a CPU tensor, outside a guarded region."""
    return t.device.type == "cpu" and _STATE["depth"] == 0


@contextlib.contextmanager
def sync_guard(enabled: bool) -> Iterator[None]:
    """Make host reads of tensor data raise inside the block (no cost when disabled)."""
    if not enabled:
        yield
        return
    saved = {n: getattr(torch.Tensor, n) for n in _NAMES}

    def _raiser(name):
        def f(self, *a, **k):
            raise HostSyncError(f"host synchronisation in the HYBRID_SPARK decode step: Tensor.{name}()")

        return f

    _STATE["depth"] += 1
    try:
        for n in _NAMES:
            setattr(torch.Tensor, n, _raiser(n))
        yield
    finally:
        _STATE["depth"] -= 1
        for n, fn in saved.items():
            setattr(torch.Tensor, n, fn)
