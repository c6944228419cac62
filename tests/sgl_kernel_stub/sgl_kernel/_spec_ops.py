"""Speculative-decoding ops of the ``sgl_kernel`` stand-in (plain torch + Python loops, host side).

Semantics follow SGLang 0.5.23's Triton twins:
- ``fill_bonus_tokens_cpu`` / ``fill_accept_out_cache_loc_cpu``: ``sglang/kernels/ops/speculative/eagle.py``;
- ``build_tree_kernel_efficient_cpu``: ``sglang/kernels/ops/speculative/spec_tree.py:
  sgl_build_tree_kernel_efficient_triton`` (FULL_MASK and QLEN_ONLY layouts);
- ``verify_tree_greedy_cpu``: same file, ``verify_tree_greedy_kernel_triton``.
The tree ops walk small per-request trees (``draft_token_num`` nodes), so they copy the index tensors to
Python lists once, loop, and write the results back with one indexed store per output.
"""

from __future__ import annotations

from typing import List

import torch

__all__ = [
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
]

FULL_MASK = 0
QLEN_ONLY = 1
QLEN_ONLY_BITPACKING = 2


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _is_int(t: torch.Tensor) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dtype != torch.bool


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1]`` for every request ``b``
    (``accept_lens`` counts the bonus token, so the bonus is the last accepted slot of row ``b``)."""
    _require(_is_int(accept_tokens), "accept_tokens must be an integer tensor")
    _require(_is_int(accept_lens) and accept_lens.dim() == 1, "accept_lens must be a 1-D integer tensor")
    _require(_is_int(bonus_tokens), "bonus_tokens must be an integer tensor")
    bs = accept_lens.numel()
    _require(bonus_tokens.numel() >= bs, f"bonus_tokens must hold at least {bs} entries")
    _require(int(accept_stride) > 0, f"accept_stride must be positive, got {accept_stride}")
    if bs == 0:
        return
    idx = torch.arange(bs, dtype=torch.int64) * int(accept_stride) + accept_lens.to(torch.int64) - 1
    bonus_tokens.view(-1)[:bs] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compact the KV slots of accepted tokens: walking ``accept_index`` (flattened) in order, entry ``i`` with
    ``accept_index[i] > -1`` stores ``out_cache_loc[accept_index[i]]`` at position
    ``#{j < i: accept_index[j] != -1}``."""
    _require(_is_int(accept_index), "accept_index must be an integer tensor")
    _require(_is_int(out_cache_loc), "out_cache_loc must be an integer tensor")
    _require(_is_int(accept_out_cache_loc), "accept_out_cache_loc must be an integer tensor")
    flat = accept_index.reshape(-1).to(torch.int64)
    counted = (flat != -1).to(torch.int64)
    dst = torch.cumsum(counted, 0) - counted
    keep = flat > -1
    accept_out_cache_loc[dst[keep]] = out_cache_loc[flat[keep]].to(accept_out_cache_loc.dtype)


def _rows(t: torch.Tensor, bs: int, width_if_1d: int) -> List[List[int]]:
    """Per-request rows of ``t`` as Python lists (a 1-D ``t`` is read with row stride ``width_if_1d``,
    as the Triton kernel does)."""
    if t.dim() > 1:
        return t.reshape(t.shape[0], -1).tolist()
    flat = t.tolist()
    return [flat[b * width_if_1d : (b + 1) * width_if_1d] for b in range(bs)]


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the EAGLE verify tree of each request from the draft's parent lists (in place).

    Node 0 of request ``b`` is the bonus (root) token; node ``i >= 1`` is draft ``selected_index[b, i-1]``, whose
    parent is the node holding ``parent_list[b, selected_index[b, i-1] // topk]`` (the root when that quotient is 0).
    Writes ``retrieve_index[b, i] = b*N + i``, links ``retrieve_next_token`` (first child) and
    ``retrieve_next_sibling`` (callers pre-fill both with -1), ``positions`` (``seq_len + depth``) and the
    ancestor mask rows: ``FULL_MASK`` rows of ``seq_len + N`` cells at flat offset ``N*N*b + N*sum(seq_lens[:b])``
    (only the ``N`` tree columns are written; the caller fills the prefix), ``QLEN_ONLY`` rows of ``N`` cells at
    ``N*N*b``. ``QLEN_ONLY_BITPACKING`` is not supported (SGLang's Triton twin does not support it either).
    """
    mode = int(tree_mask_mode)
    if mode == QLEN_ONLY_BITPACKING:
        raise NotImplementedError(
            "build_tree_kernel_efficient_cpu (test stand-in): tree_mask_mode QLEN_ONLY_BITPACKING is not supported"
        )
    _require(mode in (FULL_MASK, QLEN_ONLY), f"tree_mask_mode must be 0 (FULL_MASK) or 1 (QLEN_ONLY), got {mode}")
    for name, t in (
        ("parent_list", parent_list),
        ("selected_index", selected_index),
        ("verified_seq_len", verified_seq_len),
        ("positions", positions),
        ("retrieve_index", retrieve_index),
        ("retrieve_next_token", retrieve_next_token),
        ("retrieve_next_sibling", retrieve_next_sibling),
    ):
        _require(_is_int(t), f"{name} must be an integer tensor, got {getattr(t, 'dtype', type(t))}")
    n = int(draft_token_num)
    topk = int(topk)
    _require(n >= 1 and topk >= 1 and int(depth) >= 0, f"bad sizes: draft_token_num={n}, topk={topk}, depth={depth}")
    bs = verified_seq_len.numel()
    for name, t in (
        ("retrieve_index", retrieve_index),
        ("retrieve_next_token", retrieve_next_token),
        ("retrieve_next_sibling", retrieve_next_sibling),
    ):
        _require(t.numel() == bs * n, f"{name} must hold bs*draft_token_num = {bs * n} entries, got {t.numel()}")
    _require(positions.numel() >= bs * n, f"positions must hold at least {bs * n} entries")
    if bs == 0:
        return
    _require(
        selected_index.dim() == 2 and selected_index.shape[0] == bs and selected_index.shape[1] >= n - 1,
        f"selected_index must be [bs, >= draft_token_num-1] = [{bs}, >={n - 1}], got {tuple(selected_index.shape)}",
    )
    seq_lens = verified_seq_len.tolist()
    sel = selected_index.tolist()
    par = _rows(parent_list, bs, parent_list.shape[0] if parent_list.dim() == 1 else 0)
    ri = retrieve_index.reshape(bs, n).tolist()
    rnt = retrieve_next_token.reshape(bs, n).tolist()
    rns = retrieve_next_sibling.reshape(bs, n).tolist()
    pos = positions.reshape(-1)[: bs * n].tolist()
    zeros: List[int] = []
    ones: List[int] = []
    prefix = 0
    for b in range(bs):
        seq_len = seq_lens[b]
        s_b, p_b = sel[b], par[b]
        pos[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            ri[b][i] = b * n + i
            parent_tb = s_b[i - 1] // topk
            parent_position, found = 0, parent_tb == 0
            if not found:
                parent_token = p_b[parent_tb]
                for pp in range(n - 1):
                    if s_b[pp] == parent_token:
                        parent_position, found = pp + 1, True
                        break
            if found:
                nxt = rnt[b][parent_position]
                rnt[b][parent_position] = i
                if nxt != -1:
                    rns[b][i] = nxt
        ri[b][0] = b * n
        for x in range(n):
            if mode == FULL_MASK:
                row = n * n * b + prefix * n + (seq_len + n) * x + seq_len + 1
            else:
                row = n * n * b + n * x + 1
            ones.append(row - 1)
            zeros.extend(range(row, row + n - 1))
            if x == 0:
                continue
            cur, position = x - 1, 0
            for _ in range(int(depth)):
                position += 1
                ones.append(row + cur)
                parent_tb = s_b[cur] // topk
                if parent_tb == 0:
                    break
                parent_token = p_b[parent_tb]
                nxt_cur = next((cp for cp in range(n - 1) if s_b[cp] == parent_token), None)
                if nxt_cur is None:
                    break
                cur = nxt_cur
            pos[b * n + x] = position + seq_len
        prefix += seq_len
    flat_mask = tree_mask.view(-1)
    if zeros:
        flat_mask[torch.tensor(zeros, dtype=torch.int64)] = 0
    flat_mask[torch.tensor(ones, dtype=torch.int64)] = 1
    retrieve_index.view(bs, n).copy_(torch.tensor(ri, dtype=retrieve_index.dtype))
    retrieve_next_token.view(bs, n).copy_(torch.tensor(rnt, dtype=retrieve_next_token.dtype))
    retrieve_next_sibling.view(bs, n).copy_(torch.tensor(rns, dtype=retrieve_next_sibling.dtype))
    positions.view(-1)[: bs * n] = torch.tensor(pos, dtype=positions.dtype)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification (in place; keyword names ``retrive_*`` follow the CUDA op schema).

    For request ``b``: start at the root, and at each depth follow ``retrive_next_token`` then the sibling
    links to the first child whose candidate token equals the target's argmax at the last accepted node;
    stop when none matches or after ``accept_index.shape[1] - 1`` accepted drafts. Writes the accepted node
    ids (global, ``b*N + i``) into ``accept_index[b, 0..]`` (root first; untouched after the last),
    ``accept_token_num[b]`` = number of accepted drafts (bonus excluded), and ``predicts[node]`` = target argmax
    at every accepted node (the last one holds the bonus token).
    """
    for name, t in (
        ("predicts", predicts),
        ("accept_index", accept_index),
        ("accept_token_num", accept_token_num),
        ("candidates", candidates),
        ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token),
        ("retrive_next_sibling", retrive_next_sibling),
        ("target_predict", target_predict),
    ):
        _require(_is_int(t), f"{name} must be an integer tensor, got {getattr(t, 'dtype', type(t))}")
    _require(candidates.dim() == 2, f"candidates must be [bs, N], got {tuple(candidates.shape)}")
    bs, n = candidates.shape
    _require(accept_index.dim() == 2 and accept_index.shape[0] == bs, "accept_index must be [bs, spec_tokens]")
    for name, t in (
        ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token),
        ("retrive_next_sibling", retrive_next_sibling),
        ("target_predict", target_predict),
    ):
        _require(t.numel() == bs * n, f"{name} must hold bs*N = {bs * n} entries, got {t.numel()}")
    _require(accept_token_num.numel() >= bs, f"accept_token_num must hold at least {bs} entries")
    if bs == 0:
        return
    num_spec = accept_index.shape[1]
    ri = retrive_index.reshape(bs, n).tolist()
    rnt = retrive_next_token.reshape(bs, n).tolist()
    rns = retrive_next_sibling.reshape(bs, n).tolist()
    cand = candidates.tolist()
    tgt = target_predict.reshape(-1).tolist()
    acc = accept_index.tolist()
    pred_idx: List[int] = []
    pred_val: List[int] = []
    counts: List[int] = []
    for b in range(bs):
        last = ri[b][0]
        acc[b][0] = last
        num_acc, cur = 0, 0
        for _ in range(1, num_spec):
            cur = rnt[b][cur]
            target_token = tgt[last]
            matched = False
            for _ in range(n):
                if cur == -1:
                    break
                if cand[b][cur] == target_token:
                    pred_idx.append(last)
                    pred_val.append(target_token)
                    num_acc += 1
                    acc[b][num_acc] = ri[b][cur]
                    last = ri[b][cur]
                    matched = True
                    break
                cur = rns[b][cur]
            if not matched:
                break
        counts.append(num_acc)
        pred_idx.append(last)
        pred_val.append(tgt[last])
    flat_pred = predicts.view(-1)
    flat_pred[torch.tensor(pred_idx, dtype=torch.int64)] = torch.tensor(pred_val, dtype=predicts.dtype)
    accept_index.copy_(torch.tensor(acc, dtype=accept_index.dtype))
    accept_token_num.view(-1)[:bs] = torch.tensor(counts, dtype=accept_token_num.dtype)
