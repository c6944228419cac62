"""Which kernel backend a device component runs: ``"torch"`` (the plain-torch references) or ``"triton"``."""

from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "torch", "triton")


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """``"auto"`` is Triton on CUDA and torch elsewhere; Triton off CUDA needs the interpreter."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    device = torch.device(device)
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"backend 'triton' on device {device} needs TRITON_INTERPRET=1 set before triton is imported")
    return backend
