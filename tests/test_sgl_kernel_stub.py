"""The test-only ``sgl_kernel`` stand-in (tests/sgl_kernel_stub) against SGLang 0.5.23's own Triton twins.

Every op runs on random (and a few adversarial) cases next to the Triton kernel SGLang uses on GPUs, run here
under ``TRITON_INTERPRET=1`` (set by tests/conftest.py before triton is imported); outputs must be identical.
The SGLang modules are imported WITHOUT ``SGLANG_USE_CPU_ENGINE``, so they expose the Triton path and do not
import ``sgl_kernel`` themselves.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

STUB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sgl_kernel_stub")


@pytest.fixture(scope="module")
def sk():
    """The stand-in module, imported from tests/sgl_kernel_stub (never from site-packages)."""
    sys.path.insert(0, STUB_DIR)
    try:
        saved = sys.modules.pop("sgl_kernel", None)
        mod = importlib.import_module("sgl_kernel")
        assert getattr(mod, "IS_TEST_STUB", False), mod.__file__
        assert os.path.dirname(os.path.dirname(mod.__file__)) == STUB_DIR
        yield mod
    finally:
        sys.modules.pop("sgl_kernel", None)
        if saved is not None:
            sys.modules["sgl_kernel"] = saved
        sys.path.remove(STUB_DIR)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------------------
# unknown ops
# ----------------------------------------------------------------------------------------------------------


def test_unknown_op_raises_not_implemented_naming_itself(sk):
    with pytest.raises(NotImplementedError, match="decode_attention_cpu"):
        sk.decode_attention_cpu  # noqa: B018
    assert not hasattr(sk, "rmsnorm_cpu")  # also an AttributeError: feature probes see "absent"
    with pytest.raises(ImportError):
        exec("from sgl_kernel import fused_experts_cpu", {})
    for name in sk.IMPLEMENTED_OPS:
        assert callable(getattr(sk, name))


# ----------------------------------------------------------------------------------------------------------
# KV bookkeeping ops
# ----------------------------------------------------------------------------------------------------------


def test_copy_all_layer_kv_cache_matches_triton(sk):
    from sglang.kernels.ops.kvcache.cache_move import copy_all_layer_kv_cache_tiled

    for case in range(6):
        g = _gen(100 + case)
        rows = int(torch.randint(4, 40, (1,), generator=g))
        n = int(torch.randint(1, rows // 2 + 1, (1,), generator=g))
        # distinct targets (a duplicate target has no defined winner); sources may overlap targets (in place)
        tgt = torch.randperm(rows, generator=g)[:n]
        src = torch.randint(0, rows, (n,), generator=g)
        shapes = [(rows, 2, 8), (rows, 1, 4), (rows, 3, 5)][: 1 + case % 3]
        bufs_a = [torch.randn(s, generator=g) for s in shapes]
        bufs_b = [b.clone() for b in bufs_a]
        expect = [b.clone() for b in bufs_a]
        for e in expect:
            e[tgt] = e[src].clone()

        def meta(bufs):
            ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
            strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
            return ptrs, strides

        sk.copy_all_layer_kv_cache_cpu(*meta(bufs_a), tgt, src)
        ptrs, strides = meta(bufs_b)
        row_bytes = int(strides.max())
        upper = 1 << (n - 1).bit_length()
        copy_all_layer_kv_cache_tiled[(len(bufs_b), 1)](ptrs, strides, tgt, src, n, upper, BYTES_PER_TILE=row_bytes)
        for a, b, e in zip(bufs_a, bufs_b, expect):
            assert torch.equal(a, b) and torch.equal(a, e)


def _pool_case(g: torch.Generator, bs: int, pool_rows: int = 9, pool_len: int = 24):
    req_to_token = torch.randint(0, 1000, (pool_rows, pool_len), generator=g, dtype=torch.int32)
    rpi = torch.randperm(pool_rows, generator=g)[:bs].to(torch.int64)
    start = torch.randint(0, pool_len // 2, (bs,), generator=g)
    lens = torch.randint(0, pool_len // 2, (bs,), generator=g)
    end = start + lens
    return req_to_token, rpi, start, end, int(lens.sum())


def test_assign_req_to_token_pool_matches_triton(sk):
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

    for case in range(8):
        g = _gen(200 + case)
        bs = 1 + case
        req_to_token, rpi, start, end, total = _pool_case(g, bs)
        out = torch.randint(0, 5000, (total,), generator=g, dtype=torch.int64)
        a, b = req_to_token.clone(), req_to_token.clone()
        sk.assign_req_to_token_pool_cpu(rpi, a, start, end, out, a.shape[1])
        assign_req_to_token_pool[(bs,)](rpi, b, start, end, out, b.shape[1], 1 << (bs - 1).bit_length())
        assert torch.equal(a, b)
        assert not torch.equal(a, req_to_token) or total == 0


def test_assign_extend_cache_locs_matches_triton(sk):
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs

    for case in range(8):
        g = _gen(300 + case)
        bs = 1 + case
        req_to_token, rpi, start, end, total = _pool_case(g, bs)
        a = torch.full((total + 3,), -7, dtype=torch.int64)
        b = a.clone()
        sk.assign_extend_cache_locs_cpu(rpi, req_to_token, start, end, a, req_to_token.shape[1])
        upper = 1 << (bs - 1).bit_length()
        assign_extend_cache_locs[(bs,)](rpi, req_to_token, start, end, b, req_to_token.shape[1], upper)
        assert torch.equal(a, b)


def test_assign_draft_cache_locs_contiguous_matches_triton(sk):
    from sglang.kernels.ops.speculative.cache_locs import assign_draft_cache_locs_contiguous

    for case in range(8):
        g = _gen(400 + case)
        bs, topk, cols = 1 + case, 1 + case % 3, 1 + case % 4
        req_to_token = torch.randint(0, 1000, (9, 32), generator=g, dtype=torch.int32)
        rpi = torch.randperm(9, generator=g)[:bs].to(torch.int64)
        seq_lens = torch.randint(0, 32 - topk * cols, (bs,), generator=g)
        a = torch.full((bs * topk * cols,), -1, dtype=torch.int64)
        b = a.clone()
        sk.assign_draft_cache_locs_contiguous_cpu(rpi, req_to_token, seq_lens, a, 32, topk, cols)
        assign_draft_cache_locs_contiguous[(bs,)](rpi, req_to_token, seq_lens, b, 32, topk, cols, BS=bs)
        assert torch.equal(a, b) and bool((a >= 0).all())


def test_kv_ops_reject_bad_arguments(sk):
    pool = torch.zeros(4, 8, dtype=torch.int32)
    idx = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="pool_len"):
        sk.assign_extend_cache_locs_cpu(idx, pool, idx, idx + 1, torch.zeros(1, dtype=torch.int64), 7)
    with pytest.raises(ValueError, match="req_pool_indices"):
        sk.assign_req_to_token_pool_cpu(idx.float(), pool, idx, idx + 1, idx, 8)
    with pytest.raises(ValueError, match="same length"):
        sk.copy_all_layer_kv_cache_cpu(idx, idx, idx, torch.zeros(2, dtype=torch.int64))


# ----------------------------------------------------------------------------------------------------------
# speculative ops
# ----------------------------------------------------------------------------------------------------------


def test_fill_bonus_tokens_matches_triton(sk):
    from sglang.kernels.ops.speculative.eagle import fill_bonus_tokens

    for case in range(6):
        g = _gen(500 + case)
        bs, stride = 1 + case, 2 + case % 3
        accept_tokens = torch.randint(0, 500, (bs * stride,), generator=g, dtype=torch.int32)
        accept_lens = torch.randint(1, stride + 1, (bs,), generator=g, dtype=torch.int32)
        a = torch.full((bs,), -1, dtype=torch.int32)
        b = a.clone()
        sk.fill_bonus_tokens_cpu(accept_tokens, accept_lens, a, stride)
        fill_bonus_tokens[(bs,)](accept_tokens, accept_lens, b, stride)
        assert torch.equal(a, b)


def test_fill_accept_out_cache_loc_matches_triton(sk):
    from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc

    for case in range(6):
        g = _gen(600 + case)
        bs, width, n = 1 + case, 4, 5
        out_cache_loc = torch.randint(0, 4000, (bs * n,), generator=g, dtype=torch.int64)
        accept_index = torch.full((bs, width), -1, dtype=torch.int32)
        for r in range(bs):  # an accepted prefix per row, as verify writes it
            k = int(torch.randint(1, width + 1, (1,), generator=g))
            accept_index[r, :k] = torch.randperm(n, generator=g)[:k].to(torch.int32) + r * n
        size = bs * width
        a = torch.zeros(size, dtype=torch.int64)
        b = a.clone()
        sk.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, a)
        fill_accept_out_cache_loc[(size,)](accept_index, out_cache_loc, b, 1 << (size - 1).bit_length())
        assert torch.equal(a, b)


def _draft_tree(g: torch.Generator, bs: int, topk: int, steps: int, n: int):
    """Random EAGLE draft outputs with the structure SGLang's draft loop produces
    (``spec_utils.select_top_k_tokens`` + ``eagle_utils.organize_draft_results``)."""
    vocab = 50
    p = torch.rand(bs, topk, generator=g).sort(dim=1, descending=True).values
    scores_l = [p.unsqueeze(1)]
    tokens_l = [torch.randint(0, vocab, (bs, topk), generator=g)]
    parents_l = [torch.arange(-1, topk).expand(bs, -1)]
    scores = p
    for i in range(1, steps):
        new_p = torch.rand(bs, topk, topk, generator=g).sort(dim=2, descending=True).values
        expand = scores.unsqueeze(2) * new_p
        cs_p, cs_idx = torch.topk(expand.flatten(1), topk, dim=-1)
        scores_l.append(expand)
        tokens_l.append(torch.randint(0, vocab, (bs, topk * topk), generator=g))
        parents_l.append(cs_idx + (topk * topk * (i - 1) + topk))
        scores = cs_p
    all_scores = torch.cat(scores_l, dim=1).flatten(1)
    all_tokens = torch.cat(tokens_l, dim=1)
    top_idx = torch.topk(all_scores, n - 1, dim=-1).indices.sort().values
    draft_tokens = torch.gather(all_tokens, 1, top_idx)
    parent_list = torch.cat(parents_l[:-1], dim=1) if steps > 1 else torch.empty(bs, 0, dtype=torch.long)
    return parent_list.contiguous(), top_idx.contiguous(), draft_tokens


def _tree_buffers(bs: int, n: int, seq_lens: torch.Tensor, mode: int):
    numel = int(seq_lens.sum()) * n + n * n * bs if mode == 0 else n * n * bs
    return dict(
        tree_mask=torch.ones(numel, dtype=torch.bool),
        positions=torch.full((bs * n,), -5, dtype=torch.long),
        retrieve_index=torch.full((bs, n), -1, dtype=torch.long),
        retrieve_next_token=torch.full((bs, n), -1, dtype=torch.long),
        retrieve_next_sibling=torch.full((bs, n), -1, dtype=torch.long),
    )


_TREE_CASES = [
    # (bs, topk, steps, num_draft_tokens)
    (1, 1, 3, 4),
    (3, 1, 1, 2),
    (4, 1, 5, 6),
    (2, 2, 3, 5),
    (3, 2, 4, 8),
    (2, 4, 3, 10),
    (5, 3, 2, 7),
    (1, 4, 4, 16),
]


def _build_both(sk, parent_list, sel, seq_lens, topk, steps, n, mode):
    from sglang.kernels.ops.speculative.spec_tree import sgl_build_tree_kernel_triton

    bs = seq_lens.numel()
    a, b = _tree_buffers(bs, n, seq_lens, mode), _tree_buffers(bs, n, seq_lens, mode)
    args = lambda d: (  # noqa: E731
        d["tree_mask"],
        d["positions"],
        d["retrieve_index"],
        d["retrieve_next_token"],
        d["retrieve_next_sibling"],
    )
    sk.build_tree_kernel_efficient_cpu(parent_list, sel, seq_lens, *args(a), topk, steps, n, mode)
    sgl_build_tree_kernel_triton(parent_list, sel, seq_lens, *args(b), topk, steps, n, mode)
    for k in a:
        assert torch.equal(a[k], b[k]), (k, a[k], b[k])
    return a


@pytest.mark.parametrize("mode", [0, 1], ids=["FULL_MASK", "QLEN_ONLY"])
def test_build_tree_matches_triton(sk, mode):
    for case, (bs, topk, steps, n) in enumerate(_TREE_CASES):
        g = _gen(700 + case)
        parent_list, sel, _ = _draft_tree(g, bs, topk, steps, n)
        seq_lens = torch.randint(1, 12, (bs,), generator=g)
        out = _build_both(sk, parent_list, sel, seq_lens, topk, steps, n, mode)
        if topk == 1:  # a chain: node i sits at depth i and its only child is i+1
            assert out["positions"].view(bs, n).sub(seq_lens[:, None]).eq(torch.arange(n)).all()
            assert torch.equal(out["retrieve_next_token"][:, :-1], torch.arange(1, n).expand(bs, -1))


def test_build_tree_matches_triton_on_adversarial_parents(sk):
    """Parents that are not among the selected nodes (the kernels' ``found == 0`` branches)."""
    for case in range(6):
        g = _gen(800 + case)
        bs, topk, steps, n = 1 + case % 3, 2, 3, 6
        width = topk + 1 + (steps - 2) * topk
        parent_list = torch.randint(-1, 3 * topk * topk, (bs, width), generator=g)
        sel = torch.randint(0, topk + (steps - 1) * topk * topk, (bs, n - 1), generator=g).sort(dim=1).values
        seq_lens = torch.randint(1, 9, (bs,), generator=g)
        for mode in (0, 1):
            _build_both(sk, parent_list, sel, seq_lens, topk, steps, n, mode)


def test_build_tree_rejects_bitpacking(sk):
    b = _tree_buffers(1, 2, torch.tensor([3]), 1)
    with pytest.raises(NotImplementedError, match="BITPACKING"):
        sk.build_tree_kernel_efficient_cpu(
            torch.empty(1, 0, dtype=torch.long),
            torch.zeros(1, 1, dtype=torch.long),
            torch.tensor([3]),
            *b.values(),
            1,
            1,
            2,
            2,
        )


def test_verify_tree_greedy_matches_triton(sk):
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    accepted = []
    for case, (bs, topk, steps, n) in enumerate(_TREE_CASES * 2):
        g = _gen(900 + case)
        parent_list, sel, draft_tokens = _draft_tree(g, bs, topk, steps, n)
        seq_lens = torch.randint(1, 12, (bs,), generator=g)
        tree = _build_both(sk, parent_list, sel, seq_lens, topk, steps, n, 0)
        bonus = torch.randint(0, 50, (bs, 1), generator=g)
        candidates = torch.cat([bonus, draft_tokens], dim=1)
        # the target agrees with the first child of a node most of the time, so long paths get accepted
        target = torch.randint(0, 50, (bs, n), generator=g)
        first_child = tree["retrieve_next_token"]
        agree = torch.rand(bs, n, generator=g) < 0.7
        for r in range(bs):
            for i in range(n):
                c = int(first_child[r, i])
                if c != -1 and agree[r, i]:
                    target[r, i] = candidates[r, c]
        outs = []
        for fn in (sk.verify_tree_greedy_cpu, None):
            predicts = torch.zeros(bs * n, dtype=torch.int32)
            accept_index = torch.full((bs, steps + 1), -1, dtype=torch.int32)
            accept_num = torch.full((bs,), -3, dtype=torch.int32)
            common = dict(
                predicts=predicts,
                accept_index=accept_index,
                accept_token_num=accept_num,
                candidates=candidates,
                target_predict=target,
            )
            if fn is not None:
                fn(
                    retrive_index=tree["retrieve_index"],
                    retrive_next_token=tree["retrieve_next_token"],
                    retrive_next_sibling=tree["retrieve_next_sibling"],
                    **common,
                )
            else:
                verify_tree_greedy_triton(
                    retrieve_index=tree["retrieve_index"],
                    retrieve_next_token=tree["retrieve_next_token"],
                    retrieve_next_sibling=tree["retrieve_next_sibling"],
                    **common,
                )
            outs.append((predicts, accept_index, accept_num))
        for x, y in zip(*outs):
            assert torch.equal(x, y)
        assert bool((outs[0][2] >= 0).all() and (outs[0][2] <= steps).all())
        accepted += outs[0][2].tolist()
    # the cases exercise rejection at the root, partial paths and full-depth paths
    assert 0 in accepted and 1 in accepted and max(accepted) >= 3, accepted


def test_spec_ops_reject_bad_arguments(sk):
    with pytest.raises(ValueError, match="accept_lens"):
        tokens, lens_f = torch.zeros(4, dtype=torch.int32), torch.zeros(2)
        sk.fill_bonus_tokens_cpu(tokens, lens_f, torch.zeros(2, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="candidates"):
        sk.verify_tree_greedy_cpu(
            predicts=torch.zeros(4, dtype=torch.int32),
            accept_index=torch.zeros(1, 2, dtype=torch.int32),
            accept_token_num=torch.zeros(1, dtype=torch.int32),
            candidates=torch.zeros(4, dtype=torch.long),
            retrive_index=torch.zeros(4, dtype=torch.long),
            retrive_next_token=torch.zeros(4, dtype=torch.long),
            retrive_next_sibling=torch.zeros(4, dtype=torch.long),
            target_predict=torch.zeros(4, dtype=torch.long),
        )
