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
import json, sys
import torch
from sglang.srt.server_args import prepare_server_args


def dspark_resolves():  # built-in DSPARK's server-argument resolution on device cpu
    a = prepare_server_args(["--model-path", sys.argv[1], "--speculative-algorithm", "DSPARK",
                             "--speculative-draft-model-path", sys.argv[2], "--device", "cpu", "--skip-tokenizer-init"])
    try:
        a.resolve_once()
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def record_stream_on_cpu():
    try:
        torch.zeros(2).record_stream(torch.cpu.current_stream())
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


before = {"dspark": dspark_resolves(), "record_stream": record_stream_on_cpu()}
from sglang_hybrid.sglang_plugin.cpu_compat import apply_cpu_compat
import sglang.srt.layers.attention.verify_mask as verify_mask  # imported before: needs propagation
first = apply_cpu_compat()
after = {"dspark": dspark_resolves(), "record_stream": record_stream_on_cpu()}
second = apply_cpu_compat()
from sglang.srt.speculative import eagle_utils, standalone_worker_v2  # imported after: binds the patched one
from sglang.kernels.ops.speculative import verify_sampling
from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode
greedy = dict(is_cpu=True, is_hip=False, is_xpu=False, use_rejection_sampling=False)
print(json.dumps({
    "before": before,
    "after": after,
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


def _dspark_dirs(tmp_path):
    target, draft = tmp_path / "target", tmp_path / "dspark"
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "vocab_size": 512,
             "intermediate_size": 128, "num_attention_heads": 1, "num_key_value_heads": 1, "num_hidden_layers": 2,
             "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "torch_dtype": "float32"}
    for d, cfg in ((target, llama), (draft, dict(llama, architectures=["DSparkDraftModel"], model_type="qwen3",
                                                  block_size=3, dflash_config={"mask_token_id": 2, "block_size": 3,
                                                                               "target_layer_ids": [0]}))):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    return str(target), str(draft)


def test_apply_cpu_compat_patches_every_binding(tmp_path):
    """Every fix, in a fresh interpreter with the CPU engine on; the DSpark ones fail before and pass after."""
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([STUB_DIR, REPO_ROOT, env.get("PYTHONPATH", "")])
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, *_dspark_dirs(tmp_path)], env=env, capture_output=True, text=True,
        timeout=300, cwd=REPO_ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["first"] == out["second"] and len(out["first"]) == 7, out
    # Fix 3: SGLang's DSPARK refuses device cpu at start-up; with the gate shim it resolves.
    assert "only supports CUDA, NPU or XPU" in out["before"]["dspark"] and out["after"]["dspark"] == "ok", out
    # Fix 4: record_stream on a CPU tensor raises (DSparkWorkerV2._forward_decode calls it); then a no-op.
    assert out["before"]["record_stream"].startswith("RuntimeError") and out["after"]["record_stream"] == "ok"
    assert out["modes"] == [out["full_mask"]] * 3  # the triton verify backend reads FULL_MASK
    assert out["greedy_sampling_request"] is False and out["greedy_greedy_request"] is True
    assert out["sampler"] == ["tree_speculative_sampling_target_only_cpu"] * 2


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _ragged_case(device: str):
    """A fake triton backend and a compact target-verify batch of 3 requests verifying 1, 4 and 2 rows."""
    from sglang_hybrid.sglang_plugin import cpu_compat

    verify_lens = torch.tensor([1, 4, 2], dtype=torch.int32)
    layout = _Obj(verify_lens=verify_lens, qo_indptr_device=torch.tensor([0, 1, 5, 7, 99], dtype=torch.int64))
    mode = _Obj(is_target_verify=lambda: True)
    batch = _Obj(spec_info=_Obj(ragged_verify_layout=layout), forward_mode=mode)
    backend = _Obj(device=device, forward_metadata=_Obj(qo_indptr=None))

    def original(self, forward_batch):  # what SGLang 0.5.23 builds: 4 (the window) rows per request
        self.forward_metadata.qo_indptr = torch.arange(0, 4 * 4, 4, dtype=torch.int32)

    cpu_compat._triton_ragged_verify_hook(original, backend, batch)
    return backend.forward_metadata.qo_indptr


def test_triton_ragged_verify_reads_the_layouts_rows_on_cpu_only():
    """Fix 5. Without it the uniform qo_indptr [0, 4, 8, 12] addresses 12 query rows where compact packed 7, so
    the attention reads past its rows (the probe's scheduler died there); with it, the layout's [0, 1, 5, 7]."""
    assert _ragged_case("cpu").tolist() == [0, 1, 5, 7]
    assert _ragged_case("cuda").tolist() == [0, 4, 8, 12]  # inert off CPU: FlashInfer / FA3 read the layout


def test_dspark_gate_and_record_stream_shims_are_inert_off_cpu(monkeypatch):
    from sglang.srt.arg_groups import speculative_hook

    from sglang_hybrid.sglang_plugin import cpu_compat

    seen = []
    def fake(sa):
        return _Obj(device=sa.device)

    monkeypatch.setattr(speculative_hook, "resolving_view", fake)

    def original(server_args):
        seen.append(speculative_hook.resolving_view(server_args).device)

    cpu_compat._handle_dspark_cpu(original, _Obj(device="cuda"))
    cpu_compat._handle_dspark_cpu(original, _Obj(device="cpu"))
    assert seen == ["cuda", "cuda"]  # a CPU run sees "cuda" only while the original runs
    assert speculative_hook.resolving_view is fake  # restored after the call
    calls = []
    monkeypatch.setattr(cpu_compat, "_ORIGINAL_RECORD_STREAM", lambda t, s: calls.append((t.device.type, s)))
    cpu_compat._record_stream_cpu_noop(torch.zeros(1), "stream")
    cpu_compat._record_stream_cpu_noop(_Obj(device=torch.device("cuda")), "stream")
    assert calls == [("cuda", "stream")]
