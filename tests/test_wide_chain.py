"""The two hooks that widen SGLang's chain verify window past the model chain (``sglang_plugin/wide_chain.py``).

Here each hook wraps a recording stand-in for the SGLang function, to check what it hands down; the real
``build_eagle_verify_input`` and ``_rebuild_topk1_chain_buffers`` run under the hooks in the end-to-end
configuration ``hybrid_spark_wide`` (``tests/e2e``), which must match the HF greedy reference.
"""

from types import SimpleNamespace

import pytest
import torch

from sglang_hybrid.sglang_plugin import wide_chain


@pytest.fixture
def hybrid_process(monkeypatch):
    monkeypatch.setattr(wide_chain, "_hybrid_process", lambda: True)


class _Mode:
    def __init__(self, idle=False):
        self.idle = idle

    def is_idle(self):
        return self.idle


def _capture():
    calls = []

    def original(batch, draft_input, parent_list, top_scores_index, draft_tokens, draft_probs, **kw):
        calls.append(dict(parents=parent_list.clone(), scores=top_scores_index.clone(), tokens=draft_tokens.clone(),
                          **kw))
        return "built"

    return calls, original


def test_widened_only_for_a_hybrid_chain_wider_than_steps_plus_one(hybrid_process, monkeypatch):
    assert wide_chain.widened(1, 3, 8)
    assert not wide_chain.widened(1, 3, 4)  # SGLang's own relation
    assert not wide_chain.widened(2, 3, 8)  # trees are never widened
    monkeypatch.setattr(wide_chain, "_hybrid_process", lambda: False)
    assert not wide_chain.widened(1, 3, 8)  # another algorithm in this process: untouched


def test_verify_input_hook_pads_the_model_chain_to_the_window(hybrid_process):
    calls, original = _capture()
    batch = SimpleNamespace(forward_mode=_Mode())
    draft = torch.tensor([[5, 6, 7], [8, 9, 10]], dtype=torch.int64)
    kw = dict(target_worker=None, topk=1, num_steps=3, num_draft_tokens=9, tree_mask_mode=None, device="cpu")
    assert wide_chain.verify_input_hook(original, batch, None, None, None, draft, None, **kw) == "built"
    c = calls[-1]
    assert c["num_steps"] == 8 and c["num_draft_tokens"] == 9
    assert c["tokens"].shape == (2, 8) and c["tokens"][:, :3].tolist() == draft.tolist()
    assert c["parents"].tolist() == [list(range(-1, 7))] * 2  # a chain: node j's parent is j - 1
    assert c["scores"].tolist() == [list(range(8))] * 2


def test_verify_input_hook_passes_sglang_shapes_through(hybrid_process):
    calls, original = _capture()
    batch = SimpleNamespace(forward_mode=_Mode())
    parents, scores = torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]])
    draft = torch.tensor([[5, 6, 7]])
    kw = dict(target_worker=None, topk=1, num_steps=3, num_draft_tokens=4, tree_mask_mode=None, device="cpu")
    wide_chain.verify_input_hook(original, batch, None, parents, scores, draft, None, **kw)
    c = calls[-1]
    assert c["num_steps"] == 3 and c["tokens"].tolist() == draft.tolist() and c["parents"].tolist() == [[-1, 0, 1]]


def test_idle_batch_gets_the_window_depth_and_draft_probs_are_refused(hybrid_process):
    calls, original = _capture()
    kw = dict(target_worker=None, topk=1, num_steps=2, num_draft_tokens=6, tree_mask_mode=None, device="cpu")
    e = torch.zeros(0, 2, dtype=torch.int64)
    wide_chain.verify_input_hook(original, SimpleNamespace(forward_mode=_Mode(idle=True)), None, e, e, e, None, **kw)
    assert calls[-1]["num_steps"] == 5
    with pytest.raises(RuntimeError, match="rejection sampling"):
        wide_chain.verify_input_hook(original, SimpleNamespace(forward_mode=_Mode()), None, None, None,
                                     torch.zeros(1, 2, dtype=torch.int64), torch.zeros(1, 2, 4), **kw)


def test_pad_buffers_are_reused_and_grow_only_past_the_reserved_batch(hybrid_process):
    wide_chain.reserve("cpu", 7, 4)
    a = wide_chain._pad(torch.device("cpu"), 7, 3, torch.int64)
    b = wide_chain._pad(torch.device("cpu"), 7, 4, torch.int64)
    assert a is b and a.rows >= 4
    c = wide_chain._pad(torch.device("cpu"), 7, a.rows + 1, torch.int64)
    assert c is not a and c.rows == a.rows + 1


def test_rebuild_hook_builds_the_draft_chain_buffers_for_steps_tokens(hybrid_process):
    from sglang.srt.speculative.base_spec_worker import EagleDraftWorkerBase

    seen = []

    def original(self):
        # SGLang's own method asserts this relation; the hook must present it.
        assert self.speculative_num_draft_tokens == self.speculative_num_steps + 1
        seen.append(self.speculative_num_draft_tokens)

    worker = SimpleNamespace(topk=1, speculative_num_steps=3, speculative_num_draft_tokens=9)
    wide_chain.rebuild_topk1_hook(original, worker)
    assert seen == [4] and worker.speculative_num_draft_tokens == 9  # restored afterwards
    assert hasattr(EagleDraftWorkerBase, "_rebuild_topk1_chain_buffers")
