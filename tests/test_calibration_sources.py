"""Sources of replayed text: a causal LM's greedy continuations and a draft model's first-token proposals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.calibration.corpus import Document, corpus_digest, path_documents, stdlib_documents
from sglang_hybrid.calibration.sources import draft_first_tokens, model_token_docs, select_documents


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      bos_token_id=0, eos_token_id=49, pad_token_id=49)
    return LlamaForCausalLM(cfg).eval()


def _greedy(model, prompt: np.ndarray, n: int, eos: int) -> list[int]:
    ids = torch.as_tensor(prompt, dtype=torch.long)[None]
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(input_ids=ids).logits[0, -1].argmax())
            if nxt == eos:
                break
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def test_greedy_continuations_match_a_manual_loop(tiny_model):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 49, size=int(rng.integers(10, 30))) for _ in range(5)] + [np.arange(3)]
    seqs, plens = model_token_docs(tiny_model, docs, prompt_tokens=20, max_new_tokens=12, batch_size=3,
                                   min_prompt_tokens=8)
    assert len(seqs) == 5  # the 3-token document is too short to prompt with
    for s, p, d in zip(seqs, plens, docs):
        assert p == min(20, len(d))
        assert np.array_equal(s[:p], d[:p])
        assert s[p:].tolist() == _greedy(tiny_model, d[:p], 12, eos=49)  # left padding changed nothing


def test_draft_first_tokens_are_teacher_forced_argmax(tiny_model):
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 50, size=n) for n in (7, 19, 12)]
    preds = draft_first_tokens(tiny_model, seqs, batch_size=2, max_len=64)
    for s, p in zip(seqs, preds):
        with torch.no_grad():
            ref = tiny_model(input_ids=torch.as_tensor(s, dtype=torch.long)[None]).logits[0].argmax(-1).numpy()
        assert np.array_equal(p, ref)


def test_vocab_mismatch_is_named(tiny_model):
    with pytest.raises(ValueError, match="vocab_size 50"):
        model_token_docs(tiny_model, [np.arange(60, 80)], prompt_tokens=16, max_new_tokens=2)


def test_corpora(tmp_path):
    docs = stdlib_documents()
    kinds = {d.kind for d in docs}
    assert kinds == {"code", "prose"}
    names = [d.name for d in docs]
    assert not any("/test/" in n or n.startswith(("test/", "site-packages", "encodings/")) for n in names)
    assert any(n.startswith("pydoc_data/topics.py:") for n in names)
    assert corpus_digest(docs) == corpus_digest(stdlib_documents())
    sub = select_documents(docs, 10, seed=0)
    assert len(sub) == 10 and sub == select_documents(docs, 10, seed=0) and sub != select_documents(docs, 10, 1)
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.md").write_text("# notes\n")
    (tmp_path / "c.bin").write_bytes(b"\x00")
    got = path_documents([tmp_path])
    assert [(d.name.split("/", 1)[1], d.kind) for d in got] == [("a.py", "code"), ("b.md", "prose")]
    assert corpus_digest(got) != corpus_digest(got[:1])
    assert corpus_digest([Document("a", "code", "xy")]) != corpus_digest([Document("ax", "code", "y")])
    with pytest.raises(FileNotFoundError, match="nope"):
        path_documents([tmp_path / "nope"])
