"""``sglang_hybrid.sglang_plugin.cpu_compat``: the CPU fixes for SGLang's speculative decoding.

The host port of ``tree_speculative_sampling_target_only`` is checked exactly on deterministic coins and
statistically (chi-square) on random ones; ``apply_cpu_compat`` is checked in a fresh interpreter with the CPU
engine on (SGLang caches ``is_cpu()`` at import, so it must not run in the test process), and in-process with it
off (a no-op that imports nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from scipy.stats import chisquare

from sglang_hybrid.sglang_plugin.cpu_compat import apply_cpu_compat, tree_speculative_sampling_target_only_cpu

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
STUB_DIR = os.path.join(REPO_ROOT, "tests", "sgl_kernel_stub")


def _chain(bs: int, draft: list, probs: torch.Tensor, coins: torch.Tensor, final: torch.Tensor):
    """Run the sampler on ``bs`` identical chains ``root -> draft[0] -> draft[1] ...`` (``probs[i]`` = target
    distribution at node ``i``). Returns (predicts [bs, N], accept_index, accept_num)."""
    n = len(draft) + 1
    candidates = torch.tensor([[7] + draft] * bs, dtype=torch.int64)
    retrieve_index = torch.arange(bs * n, dtype=torch.int64).view(bs, n)
    next_token = torch.tensor([list(range(1, n)) + [-1]] * bs, dtype=torch.int64)
    sibling = torch.full((bs, n), -1, dtype=torch.int64)
    predicts = torch.full((bs * n,), -1, dtype=torch.int32)
    accept_index = torch.full((bs, n), -1, dtype=torch.int32)
    accept_num = torch.full((bs,), -1, dtype=torch.int32)
    target = probs.unsqueeze(0).expand(bs, -1, -1).contiguous()
    tree_speculative_sampling_target_only_cpu(
        predicts,
        accept_index,
        accept_num,
        candidates,
        retrieve_index,
        next_token,
        sibling,
        coins,
        final,
        target,
        torch.zeros_like(target),
    )
    return predicts.view(bs, n), accept_index, accept_num


def _probs(vocab: int, seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, vocab, generator=g) * 1.5, dim=-1)


def test_sampler_zero_coins_accept_the_whole_chain():
    probs = _probs(6, 0, 4)
    draft = [2, 3, 4]
    pred, acc, num = _chain(1, draft, probs, torch.zeros(1, 4), torch.zeros(1))
    assert num.tolist() == [3]
    assert acc.tolist() == [[0, 1, 2, 3]]
    # accepted drafts are written at their parent's slot, the bonus (first token with mass) at the last node
    assert pred[0, :3].tolist() == draft
    assert pred[0, 3].item() == int(torch.nonzero(probs[3] > 0)[0])


def test_sampler_one_coins_reject_and_exclude_the_draft_token():
    probs = _probs(6, 1, 4)
    draft = [int(probs[0].argmax()), 3, 4]
    pred, acc, num = _chain(1, draft, probs, torch.full((1, 4), 0.999999), torch.full((1,), 0.999999))
    assert num.tolist() == [0] and acc[0].tolist() == [0, -1, -1, -1]
    residual = probs[0].clone()
    residual[draft[0]] = 0
    assert pred[0, 0].item() == int(torch.nonzero(residual > 0)[-1])  # the last token with mass


def _expected(p: torch.Tensor, n: int) -> torch.Tensor:
    p = p.double()
    return p / p.sum() * n


def test_sampler_keeps_the_target_distribution():
    vocab, bs = 5, 6000
    probs = _probs(vocab, 2, 3)
    draft = [int(probs[0].argmax()), int(probs[1].argmax())]
    g = torch.Generator().manual_seed(3)
    pred, _, num = _chain(bs, draft, probs, torch.rand(bs, 3, generator=g), torch.rand(bs, generator=g))
    first = pred[:, 0].tolist()  # the token emitted after the root: draft[0] if accepted, else the bonus
    counts = torch.bincount(torch.tensor(first), minlength=vocab).double()
    assert chisquare(counts, _expected(probs[0], bs)).pvalue > 1e-3
    # given the first draft was accepted, the next emitted token follows node 1's distribution
    second = pred[num >= 1, 1]
    counts2 = torch.bincount(second.long(), minlength=vocab).double()
    assert chisquare(counts2, _expected(probs[1], second.numel())).pvalue > 1e-3
    # and the acceptance rate of the first draft is its target probability
    rate = float((num >= 1).double().mean())
    assert abs(rate - float(probs[0, draft[0]])) < 4 * (rate * (1 - rate) / bs) ** 0.5


def test_sampler_rejects_bad_shapes():
    with pytest.raises(ValueError, match="target_probs"):
        tree_speculative_sampling_target_only_cpu(
            predicts=torch.zeros(4, dtype=torch.int32),
            accept_index=torch.zeros(1, 4, dtype=torch.int32),
            accept_token_num=torch.zeros(1, dtype=torch.int32),
            candidates=torch.zeros(1, 4, dtype=torch.int64),
            retrive_index=torch.zeros(1, 4, dtype=torch.int64),
            retrive_next_token=torch.zeros(1, 4, dtype=torch.int64),
            retrive_next_sibling=torch.zeros(1, 4, dtype=torch.int64),
            uniform_samples=torch.zeros(1, 4),
            uniform_samples_for_final_sampling=torch.zeros(1),
            target_probs=torch.zeros(1, 3, 5),
            draft_probs=torch.zeros(1, 3, 5),
        )


def test_apply_cpu_compat_is_a_no_op_without_the_cpu_engine(monkeypatch):
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    assert apply_cpu_compat() == []


_PROBE = r"""
import json
from sglang_hybrid.sglang_plugin.cpu_compat import apply_cpu_compat
import sglang.srt.layers.attention.verify_mask as verify_mask  # imported before: needs propagation
first = apply_cpu_compat()
second = apply_cpu_compat()
from sglang.srt.speculative import eagle_utils, standalone_worker_v2  # imported after: binds the patched one
from sglang.kernels.ops.speculative import verify_sampling
from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode
greedy = dict(is_cpu=True, is_hip=False, is_xpu=False, use_rejection_sampling=False)
print(json.dumps({
    "first": first,
    "second": second,
    "modes": [int(f()) for f in (eagle_utils.default_tree_mask_mode, verify_mask.default_tree_mask_mode,
                                 standalone_worker_v2.default_tree_mask_mode)],
    "full_mask": int(TreeMaskMode.FULL_MASK),
    "greedy_sampling_request": eagle_utils._verify_uses_greedy(is_all_greedy=False, **greedy),
    "greedy_greedy_request": eagle_utils._verify_uses_greedy(is_all_greedy=True, **greedy),
    "sampler": [m.tree_speculative_sampling_target_only.__name__ for m in (eagle_utils, verify_sampling)],
}))
"""


def test_apply_cpu_compat_patches_every_binding():
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([STUB_DIR, REPO_ROOT, env.get("PYTHONPATH", "")])
    res = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["first"] == out["second"] and len(out["first"]) == 4, out
    assert out["modes"] == [out["full_mask"]] * 3  # the triton verify backend reads FULL_MASK
    assert out["greedy_sampling_request"] is False and out["greedy_greedy_request"] is True
    assert out["sampler"] == ["tree_speculative_sampling_target_only_cpu"] * 2
