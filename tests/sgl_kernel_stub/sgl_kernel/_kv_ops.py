"""KV-cache bookkeeping ops of the ``sgl_kernel`` stand-in (plain torch, host side).

Semantics follow SGLang 0.5.23's Triton twins:
- ``copy_all_layer_kv_cache_cpu``: ``sglang/kernels/ops/kvcache/cache_move.py: copy_all_layer_kv_cache_tiled``;
- ``assign_req_to_token_pool_cpu``: ``sglang/srt/mem_cache/allocation.py: assign_req_to_token_pool``;
- ``assign_extend_cache_locs_cpu``: ``sglang/kernels/ops/speculative/cache_locs.py: assign_extend_cache_locs``;
- ``assign_draft_cache_locs_contiguous_cpu``: same file, ``assign_draft_cache_locs_contiguous``.
Like the kernels, row ``r`` of ``req_to_token`` starts at flat offset ``r * pool_len``.
"""

from __future__ import annotations

import ctypes

import torch

__all__ = [
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
]


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_index_1d(name: str, t: torch.Tensor) -> None:
    _require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}")
    _require(t.dim() == 1, f"{name} must be 1-D, got shape {tuple(t.shape)}")
    _require(
        not t.is_floating_point() and t.dtype != torch.bool, f"{name} must be an integer tensor, got {t.dtype}"
    )


def _check_pool(req_to_token: torch.Tensor, pool_len: int) -> None:
    _require(isinstance(req_to_token, torch.Tensor), "req_to_token must be a torch.Tensor")
    _require(req_to_token.is_contiguous(), "req_to_token must be contiguous")
    _require(int(pool_len) > 0, f"pool_len must be positive, got {pool_len}")
    if req_to_token.dim() == 2:
        _require(
            req_to_token.shape[1] == pool_len,
            f"pool_len ({pool_len}) must equal req_to_token.shape[1] ({req_to_token.shape[1]})",
        )


def _exclusive_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(lengths, 0) - lengths


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every buffer ``l`` (base address ``data_ptrs[l]``, ``strides[l]`` bytes per row) copy rows
    ``src_loc`` onto rows ``tgt_loc``; all sources are read before any target is written (in-place safe).

    ``data_ptrs`` holds raw host addresses (``uint64`` or ``int64``) of CPU buffers, as SGLang's KV pool
    builds them.
    """
    _check_index_1d("data_ptrs", data_ptrs)
    _check_index_1d("strides", strides)
    _check_index_1d("tgt_loc", tgt_loc)
    _check_index_1d("src_loc", src_loc)
    _require(
        data_ptrs.numel() == strides.numel(),
        f"data_ptrs ({data_ptrs.numel()}) and strides ({strides.numel()}) must have the same length",
    )
    _require(
        tgt_loc.numel() == src_loc.numel(),
        f"tgt_loc ({tgt_loc.numel()}) and src_loc ({src_loc.numel()}) must have the same length",
    )
    _require(data_ptrs.device.type == "cpu", "data_ptrs must be a CPU tensor (raw host addresses)")
    if src_loc.numel() == 0 or data_ptrs.numel() == 0:
        return
    ptrs = data_ptrs.view(torch.int64).tolist() if data_ptrs.dtype == torch.uint64 else data_ptrs.tolist()
    src = src_loc.to(torch.int64)
    tgt = tgt_loc.to(torch.int64)
    lo = min(int(src.min()), int(tgt.min()))
    _require(lo >= 0, f"src_loc/tgt_loc must be non-negative, got min {lo}")
    rows = max(int(src.max()), int(tgt.max())) + 1
    for ptr, stride in zip(ptrs, strides.tolist()):
        _require(stride > 0, f"strides must be positive, got {stride}")
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(ptr)
        view = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        view[tgt] = view[src]  # advanced indexing gathers a copy first: in-place safe


def _extend_segments(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """Check the arguments shared by the assign_* extend ops; yield ``(pool_base, out_offset, length)`` per
    request with a positive length (``out_cache_loc`` is packed request after request)."""
    for name, t in (
        ("req_pool_indices", req_pool_indices),
        ("start_offset", start_offset),
        ("end_offset", end_offset),
        ("out_cache_loc", out_cache_loc),
    ):
        _check_index_1d(name, t)
    _check_pool(req_to_token, pool_len)
    bs = req_pool_indices.numel()
    _require(
        start_offset.numel() >= bs and end_offset.numel() >= bs,
        f"start_offset/end_offset must hold at least {bs} entries",
    )
    starts = start_offset[:bs].to(torch.int64)
    lens = end_offset[:bs].to(torch.int64) - starts
    outs = _exclusive_cumsum(lens)  # like the kernel: raw (even negative) lengths shift later requests
    flat = req_to_token.view(-1)
    for rp, s, n, o in zip(req_pool_indices.tolist(), starts.tolist(), lens.tolist(), outs.tolist()):
        if n > 0:
            base = rp * pool_len + s
            yield base, o, n


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Scatter ``out_cache_loc`` (packed, request after request) into the pool:
    ``req_to_token[req_pool_indices[b], start_offset[b]:end_offset[b]] = out_cache_loc[o_b : o_b + len_b]`` with
    ``o_b`` the sum of the earlier requests' lengths ``end - start``."""
    flat = req_to_token.view(-1)
    for base, o, n in _extend_segments(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
        flat[base : base + n] = out_cache_loc[o : o + n].to(flat.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Gather pool slots into ``out_cache_loc`` (packed, request after request):
    ``out_cache_loc[o_b : o_b + len_b] = req_to_token[req_pool_indices[b], start_offset[b]:end_offset[b]]``."""
    flat = req_to_token.view(-1)
    for base, o, n in _extend_segments(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
        out_cache_loc[o : o + n] = flat[base : base + n].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_cols: int,
) -> None:
    """Copy each request's ``topk * num_cols`` pool slots from ``seq_lens[b]`` on:
    ``out_cache_loc[b*n : (b+1)*n] = req_to_token[req_pool_indices[b], seq_lens[b] : seq_lens[b] + n]``."""
    for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens), ("out_cache_loc", out_cache_loc)):
        _check_index_1d(name, t)
    _check_pool(req_to_token, pool_len)
    _require(int(topk) > 0 and int(num_cols) >= 0, f"topk must be > 0 and num_cols >= 0, got {topk}, {num_cols}")
    bs = req_pool_indices.numel()
    n = int(topk) * int(num_cols)
    _require(seq_lens.numel() >= bs, f"seq_lens must hold at least {bs} entries")
    _require(out_cache_loc.numel() >= bs * n, f"out_cache_loc must hold at least {bs * n} entries")
    if n == 0 or bs == 0:
        return
    flat = req_to_token.view(-1)
    for b, (rp, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens[:bs].tolist())):
        base = rp * pool_len + s
        out_cache_loc[b * n : (b + 1) * n] = flat[base : base + n].to(out_cache_loc.dtype)
