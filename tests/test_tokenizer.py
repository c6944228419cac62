"""The package's default tokenizer: deterministic training, exact round trips, loading rules."""

from __future__ import annotations

import json

import pytest

from sglang_hybrid.calibration.corpus import stdlib_documents
from sglang_hybrid.tokenizer import (
    DEFAULT_TOKENIZER_PATH,
    DEFAULT_VOCAB_SIZE,
    load_tokenizer,
    train_default_tokenizer,
    train_tokenizer,
)

TEXTS = [
    "def f(x):\n    return x + 1\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "tabs\tand\r\nwindows newlines\n\n\n   trailing spaces   ",
    "unicode: héllo wörld — ∑ x² ≤ ∞ 😀 中文 日本語",
    "",
    " leading space and <angle> [brackets] {braces} 'quotes' \"dq\" \\backslash",
]


def test_training_is_deterministic(tmp_path):
    a = train_default_tokenizer(tmp_path / "a", vocab_size=600, max_docs=40)
    b = train_tokenizer((d.text for d in stdlib_documents()[:40]), tmp_path / "b", vocab_size=600)
    assert a.read_bytes() == b.read_bytes()
    tok = load_tokenizer(a)
    assert tok.get_vocab_size() == 600
    # a different corpus gives a different tokenizer (the test above is not vacuous)
    c = train_tokenizer((d.text for d in stdlib_documents()[40:80]), tmp_path / "c", vocab_size=600)
    assert c.read_bytes() != a.read_bytes()


def test_shipped_tokenizer_round_trips_and_is_small():
    assert DEFAULT_TOKENIZER_PATH.stat().st_size < 1_000_000
    tok = load_tokenizer()
    assert tok.get_vocab_size() == DEFAULT_VOCAB_SIZE
    assert tok.token_to_id("<|endoftext|>") == 0
    for text in TEXTS + [d.text for d in stdlib_documents()[:5]]:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == text
    code = stdlib_documents()[0].text
    assert len(tok.encode(code).ids) < len(code) / 2.5  # it actually compresses Python source


def test_shipped_tokenizer_is_byte_level_bpe():
    obj = json.loads(DEFAULT_TOKENIZER_PATH.read_text())
    assert obj["model"]["type"] == "BPE"
    assert obj["pre_tokenizer"]["type"] == "ByteLevel"


def test_load_accepts_dir_and_file_and_names_missing(tmp_path):
    d = DEFAULT_TOKENIZER_PATH.parent
    assert load_tokenizer(d).get_vocab_size() == load_tokenizer(DEFAULT_TOKENIZER_PATH).get_vocab_size()
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_tokenizer(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], tmp_path / "x", vocab_size=10)
