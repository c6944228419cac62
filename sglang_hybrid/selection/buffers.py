"""Preallocated outputs of the chain selection and the constants both backends share."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Fixed-point scale of the survivals used for every sum (S_k, tau, surpluses): q = trunc(a * 2**24).
# a is in [0, 1], so a * 2**24 is exact in float32 and q is in [0, 2**24]; the largest sum,
# bs * (1 + Lm) * 2**24, stays far below 2**53, so it converts to float64 exactly.
QSCALE_LOG2 = 24
QSCALE = float(1 << QSCALE_LOG2)

# The Triton kernel keeps the whole batch in one program: next_pow2(bs) * next_pow2(Lm) elements
# (a bitonic sort of that many int64 keys). 16384 covers bs = 512 x Lm = 32.
MAX_FLAT_ELEMENTS = 16384


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()


def flat_size(bs: int, width: int) -> int:
    """Elements the Triton kernel holds for a batch of ``bs`` requests and chains ``width`` wide."""
    return next_pow2(bs) * next_pow2(width)


@dataclass
class SelectionOutput:
    """Where the selection writes; views of :class:`SelectionBuffers` sliced to the batch size."""

    choice: torch.Tensor  # [bs] int32: 0 = model chain, 1 = n-gram chain
    verify_len: torch.Tensor  # [bs] int32: draft tokens to verify (a prefix of the chosen chain), 0..Lm
    tokens: torch.Tensor  # [bs, Lm] int32: chosen chain's tokens, 0 past its length
    survival: torch.Tensor  # [bs, Lm] float32: chosen chain's survivals, 0 past its length
    price: torch.Tensor  # [1] float32: lambda after the last iteration
    budget_used: torch.Tensor  # [1] int32: the K used (given, capped, or chosen from the SPS curve)

    @classmethod
    def empty(cls, bs: int, width: int, device: torch.device | str = "cpu") -> "SelectionOutput":
        """Fresh (uninitialised) outputs for one batch; prefer :class:`SelectionBuffers` per step."""
        return SelectionBuffers(bs, width, device).view(bs)


class SelectionBuffers:
    """Owns the selection outputs for batches up to ``max_bs`` requests and chains ``width`` wide.

    Allocated once; :meth:`view` slices them to a batch size without allocating device memory, so
    the selection runs inside CUDA graphs. The Triton kernel needs no scratch memory (the batch lives
    in registers), so these buffers are all it needs. ``width`` is ``Lm = max(gamma, L_max)``.
    """

    def __init__(self, max_bs: int, width: int, device: torch.device | str = "cpu") -> None:
        if int(max_bs) < 1:
            raise ValueError(f"max_bs must be >= 1, got {max_bs}")
        if int(width) < 1:
            raise ValueError(f"width (Lm) must be >= 1, got {width}")
        self.max_bs = int(max_bs)
        self.width = int(width)
        self.device = torch.device(device)
        self.triton_ok = flat_size(self.max_bs, self.width) <= MAX_FLAT_ELEMENTS
        if self.device.type == "cuda" and not self.triton_ok:
            raise ValueError(
                f"max_bs={max_bs} x width={width} needs {flat_size(self.max_bs, self.width)} elements in "
                f"the Triton selection kernel (next_pow2(bs) * next_pow2(Lm)); the maximum is "
                f"{MAX_FLAT_ELEMENTS} (e.g. bs=512 x Lm=32)"
            )
        kw = dict(device=self.device)
        self._choice = torch.zeros(self.max_bs, dtype=torch.int32, **kw)
        self._verify_len = torch.zeros(self.max_bs, dtype=torch.int32, **kw)
        self._tokens = torch.zeros(self.max_bs, self.width, dtype=torch.int32, **kw)
        self._survival = torch.zeros(self.max_bs, self.width, dtype=torch.float32, **kw)
        self._price = torch.zeros(1, dtype=torch.float32, **kw)
        self._budget_used = torch.zeros(1, dtype=torch.int32, **kw)
        self._views: dict[int, SelectionOutput] = {}

    def view(self, bs: int) -> SelectionOutput:
        """The outputs for a batch of ``bs`` requests (cached; views of the preallocated buffers)."""
        if not 1 <= int(bs) <= self.max_bs:
            raise ValueError(f"bs must be in [1, max_bs={self.max_bs}], got {bs}")
        v = self._views.get(int(bs))
        if v is None:
            v = SelectionOutput(
                choice=self._choice[:bs],
                verify_len=self._verify_len[:bs],
                tokens=self._tokens[:bs],
                survival=self._survival[:bs],
                price=self._price,
                budget_used=self._budget_used,
            )
            self._views[int(bs)] = v
        return v


# The brief's other name for the same thing.
SelectionWorkspace = SelectionBuffers
