"""Applying a calibration table on the device: per draft token ``q`` and survival ``a_j = prod_{i<=j} q_i``.

``DeviceCalibration`` (from ``CalibrationTable.to_device``) holds the table as one flat float32 tensor plus one
int32 look-up table (LUT) per feature that maps a raw feature value to its bucket's offset in the flat table
(bucket index times that axis' stride), so a token's cell is ``lut_n[n] + lut_j[j] + lut_c[c] + lut_p[p]
(+ lut_a[agree])``. Raw values are clamped into each LUT (the top bucket of an open-ended feature catches
everything above it). The apply step does no host synchronisation and no allocation beyond its outputs:
the Triton kernel writes ``out_q`` / ``out_survival`` directly; the torch reference (same signature, used on
CPU) is graph-safe (static shapes, no data-dependent control flow).

Exactness: both compute the survival as a left-to-right float32 product, so they agree bit for bit.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from ..backend import resolve_backend

__all__ = ["DeviceCalibration", "apply_calibration_ref", "apply_calibration_triton"]

_INT_DTYPES = (torch.int32, torch.int64)


def apply_calibration_ref(
    table: torch.Tensor,
    lut_n: torch.Tensor,
    lut_j: torch.Tensor,
    lut_c: torch.Tensor,
    lut_p: torch.Tensor,
    lut_a: torch.Tensor,
    tokens: torch.Tensor,
    length: torch.Tensor,
    match_len: torch.Tensor,
    match_count: torch.Tensor,
    in_prompt: torch.Tensor,
    model_tokens: Optional[torch.Tensor],
    out_q: torch.Tensor,
    out_survival: torch.Tensor,
) -> None:
    """Reference: ``out_q[b, j-1] = table[cell(b, j)]`` for ``j <= length[b]`` else 0, and
    ``out_survival[b, j-1] = prod_{i<=j} out_q[b, i-1]`` (left-to-right float32 product).

    ``lut_a`` has one entry when the table has no ``agree`` feature (``model_tokens`` is then ignored);
    otherwise agree is ``tokens[b, 0] == model_tokens[b, 0]``.
    """
    L = out_q.shape[1]

    def gather(lut: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return lut[v.long().clamp(0, lut.numel() - 1)]

    base = gather(lut_n, match_len) + gather(lut_c, match_count) + gather(lut_p, in_prompt)
    if lut_a.numel() > 1:
        assert model_tokens is not None
        base = base + gather(lut_a, (tokens[:, 0] == model_tokens[:, 0]).to(torch.int64))
    cols = torch.arange(L, device=out_q.device)
    off = base.view(-1, 1) + gather(lut_j, cols + 1).view(1, -1)
    zero = torch.zeros((), dtype=table.dtype, device=table.device)
    q = torch.where(cols.view(1, -1) < length.view(-1, 1), table[off], zero)
    out_q.copy_(q)
    surv = torch.ones(q.shape[0], dtype=torch.float32, device=q.device)
    for j in range(L):
        surv = surv * q[:, j]
        out_survival[:, j] = surv


_KERNEL: Any = None


def _kernel() -> Any:
    """Compile-on-first-use Triton kernel (keeps ``import triton`` off CPU-only code paths)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def _calibration_kernel(
        table_ptr, lut_n_ptr, lut_j_ptr, lut_c_ptr, lut_p_ptr, lut_a_ptr,
        tokens_ptr, length_ptr, match_len_ptr, match_count_ptr, in_prompt_ptr, model_ptr,
        out_q_ptr, out_s_ptr,
        bs, L, n_lut_n, n_lut_j, n_lut_c, n_lut_p,
        stride_tok, stride_model, stride_q, stride_s,
        HAS_AGREE: tl.constexpr, BLOCK_B: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
        rmask = rows < bs
        length = tl.load(length_ptr + rows, mask=rmask, other=0)
        n = tl.load(match_len_ptr + rows, mask=rmask, other=0).to(tl.int32)
        c = tl.load(match_count_ptr + rows, mask=rmask, other=0).to(tl.int32)
        p = tl.load(in_prompt_ptr + rows, mask=rmask, other=0).to(tl.int32)
        n = tl.minimum(tl.maximum(n, 0), n_lut_n - 1)
        c = tl.minimum(tl.maximum(c, 0), n_lut_c - 1)
        p = tl.minimum(tl.maximum(p, 0), n_lut_p - 1)
        base = tl.load(lut_n_ptr + n, mask=rmask, other=0)
        base += tl.load(lut_c_ptr + c, mask=rmask, other=0)
        base += tl.load(lut_p_ptr + p, mask=rmask, other=0)
        if HAS_AGREE:
            t0 = tl.load(tokens_ptr + rows.to(tl.int64) * stride_tok, mask=rmask, other=0).to(tl.int64)
            m0 = tl.load(model_ptr + rows.to(tl.int64) * stride_model, mask=rmask, other=0).to(tl.int64)
            base += tl.load(lut_a_ptr + (t0 == m0).to(tl.int32), mask=rmask, other=0)
        surv = tl.full([BLOCK_B], 1.0, tl.float32)
        q_row = out_q_ptr + rows.to(tl.int64) * stride_q
        s_row = out_s_ptr + rows.to(tl.int64) * stride_s
        for j in range(0, L):
            off = base + tl.load(lut_j_ptr + tl.minimum(j + 1, n_lut_j - 1))
            live = rmask & (j < length)
            q = tl.load(table_ptr + off, mask=live, other=0.0)
            surv = surv * q
            tl.store(q_row + j, q, mask=rmask)
            tl.store(s_row + j, surv, mask=rmask)

    _KERNEL = _calibration_kernel
    return _KERNEL


def apply_calibration_triton(
    table: torch.Tensor,
    lut_n: torch.Tensor,
    lut_j: torch.Tensor,
    lut_c: torch.Tensor,
    lut_p: torch.Tensor,
    lut_a: torch.Tensor,
    tokens: torch.Tensor,
    length: torch.Tensor,
    match_len: torch.Tensor,
    match_count: torch.Tensor,
    in_prompt: torch.Tensor,
    model_tokens: Optional[torch.Tensor],
    out_q: torch.Tensor,
    out_survival: torch.Tensor,
) -> None:
    """Triton twin of :func:`apply_calibration_ref` (same signature, same results bit for bit).

    One program handles ``BLOCK_B`` requests and walks the ``L`` columns left to right.
    """
    bs, L = out_q.shape
    if bs == 0 or L == 0:
        return
    has_agree = lut_a.numel() > 1
    model = model_tokens if has_agree else length
    assert model is not None
    block_b = 64
    grid = ((bs + block_b - 1) // block_b,)
    _kernel()[grid](
        table, lut_n, lut_j, lut_c, lut_p, lut_a,
        tokens, length, match_len, match_count, in_prompt, model,
        out_q, out_survival,
        bs, L, lut_n.numel(), lut_j.numel(), lut_c.numel(), lut_p.numel(),
        tokens.stride(0), model.stride(0) if has_agree else 0, out_q.stride(0), out_survival.stride(0),
        HAS_AGREE=has_agree, BLOCK_B=block_b,
    )


class DeviceCalibration:
    """A calibration table resident on ``device``, ready for per-step ``apply``.

    Attributes: ``table`` (flat float32), ``lut_n``/``lut_j``/``lut_c``/``lut_p``/``lut_a`` (int32 LUTs of cell
    offsets), ``has_agree``, ``max_position`` (longest chain the table covers), ``backend``.
    """

    def __init__(self, table: Any, device: torch.device | str, backend: str = "auto") -> None:
        self.device = torch.device(device)
        self.backend = backend = resolve_backend(backend, self.device)
        self.table = torch.tensor(np.ascontiguousarray(table.q, dtype=np.float32).reshape(-1), device=self.device)
        self.device = self.table.device  # normalised ("cuda" -> "cuda:0"), compared against inputs' devices
        self.source = table.source
        self.has_agree = bool(table.has_agree)
        q = np.ascontiguousarray(table.q, dtype=np.float32)
        strides = [s // q.itemsize for s in q.strides]
        luts = []
        for f, stride in zip(table.features, strides):
            size = int(f.finite_edges.max()) + 1
            luts.append(torch.tensor(f.bucket(np.arange(size)) * stride, dtype=torch.int32, device=self.device))
        if not self.has_agree:
            luts.append(torch.zeros(1, dtype=torch.int32, device=self.device))
        self.lut_n, self.lut_j, self.lut_c, self.lut_p, self.lut_a = luts
        pos = table.feature("position")
        self.max_position = pos.hi  # None = unbounded
        self._fn = apply_calibration_triton if backend == "triton" else apply_calibration_ref

    def _check(self, name: str, t: Any, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
        if t.device != self.device:
            raise ValueError(f"{name} must be on {self.device} (the calibration's device), got {t.device}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")

    def apply(self, draft: Any, model_tokens: Optional[torch.Tensor], out_q: torch.Tensor,
              out_survival: torch.Tensor) -> None:
        """Write ``q [bs, L]`` and survival ``[bs, L]`` (float32, zero past ``draft.length``) for an ``NgramDraft``.

        ``model_tokens [bs, >=1]`` is the model chain (its first token feeds the ``agree`` feature); it may be
        ``None`` for a table without that feature. All arguments are checked on the host from shapes, dtypes
        and devices only.
        """
        if not isinstance(out_q, torch.Tensor) or out_q.dim() != 2:
            raise ValueError("out_q must be a 2-D tensor [bs, L]")
        bs, L = out_q.shape
        self._check("out_q", out_q, (bs, L), (torch.float32,))
        self._check("out_survival", out_survival, (bs, L), (torch.float32,))
        if out_q.stride(1) != 1 or out_survival.stride(1) != 1:
            raise ValueError("out_q and out_survival must be contiguous along the last dimension")
        self._check("draft.tokens", draft.tokens, (bs, L), _INT_DTYPES)
        for name in ("length", "match_len", "match_count", "in_prompt"):
            self._check(f"draft.{name}", getattr(draft, name), (bs,), _INT_DTYPES)
        if self.max_position is not None and L > self.max_position:
            raise ValueError(f"drafts of {L} tokens exceed the calibration table {self.source}, which covers "
                             f"positions up to {self.max_position}")
        if self.has_agree:
            if model_tokens is None:
                raise ValueError(f"calibration table {self.source} has the 'agree' feature: pass model_tokens")
            if not isinstance(model_tokens, torch.Tensor) or model_tokens.dim() != 2 or model_tokens.shape[0] != bs \
                    or model_tokens.shape[1] < 1:
                raise ValueError(f"model_tokens must be a [bs={bs}, >=1] tensor")
            self._check("model_tokens", model_tokens, tuple(model_tokens.shape), _INT_DTYPES)
        self._fn(
            self.table, self.lut_n, self.lut_j, self.lut_c, self.lut_p, self.lut_a,
            draft.tokens, draft.length, draft.match_len, draft.match_count, draft.in_prompt,
            model_tokens if self.has_agree else None, out_q, out_survival,
        )
