"""The package's small default tokenizer: a byte-level BPE trained on Python's own standard library.

It exists so that the n-gram calibration can be fit and tested anywhere without downloading a model's
tokenizer. It is byte-level (every string round-trips exactly), has one special token ``<|endoftext|>``
(id 0) and ``DEFAULT_VOCAB_SIZE`` entries. Training is deterministic: the same corpus gives the same
``tokenizer.json`` byte for byte (the shipped file was made with ``python -m sglang_hybrid.tokenizer``
on CPython 3.11.7; see ``scripts/fit_default_calibration.sh``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Iterable, Sequence

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "DEFAULT_TOKENIZER_PATH",
    "SPECIAL_TOKENS",
    "train_tokenizer",
    "train_default_tokenizer",
    "load_tokenizer",
    "tokenizer_digest",
]

DEFAULT_VOCAB_SIZE = 8192
SPECIAL_TOKENS = ("<|endoftext|>",)
DEFAULT_TOKENIZER_PATH = Path(__file__).resolve().parent / "data" / "tokenizer" / "tokenizer.json"


def train_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, *, vocab_size: int = DEFAULT_VOCAB_SIZE,
                    min_frequency: int = 2) -> Path:
    """Train a byte-level BPE on ``texts`` and write ``out_dir/tokenizer.json``; returns that path.

    Deterministic for a given sequence of texts. ``vocab_size`` must be at least 257 (the 256 byte symbols
    plus the special token).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"vocab_size={vocab_size} must be >= 257 (256 byte symbols + special tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    # Compact JSON (no pretty-printing) keeps the shipped file small; the content is deterministic.
    path.write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
    return path


def train_default_tokenizer(out_dir: str | os.PathLike, *, vocab_size: int = DEFAULT_VOCAB_SIZE,
                            max_docs: int | None = None) -> Path:
    """Train the default tokenizer on the running interpreter's stdlib corpus (code and prose).

    ``max_docs`` keeps only the first documents of the corpus (for quick tests). Returns the written path.
    """
    from sglang_hybrid.calibration.corpus import stdlib_documents

    docs = stdlib_documents()
    if max_docs is not None:
        docs = docs[:max_docs]
    return train_tokenizer((d.text for d in docs), out_dir, vocab_size=vocab_size)


def load_tokenizer(path: str | os.PathLike | None = None):
    """Load a ``tokenizers.Tokenizer``.

    ``path`` is ``None`` (the shipped default), a ``tokenizer.json`` file, or a directory holding one (any
    Hugging Face tokenizer directory with a fast tokenizer). Raises ``FileNotFoundError`` naming the path.
    """
    from tokenizers import Tokenizer

    p = DEFAULT_TOKENIZER_PATH if path is None else Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(f"tokenizer {str(p)!r} not found "
                                "(expected a tokenizer.json file or a directory holding one)")
    return Tokenizer.from_file(str(p))


def tokenizer_digest(path: str | os.PathLike | None = None) -> str:
    """SHA-256 (first 16 hex digits) of a tokenizer file, to record in fit metadata."""
    import hashlib

    p = DEFAULT_TOKENIZER_PATH if path is None else Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sglang_hybrid.tokenizer [--out DIR] [--vocab-size N]``: (re)train the default tokenizer."""
    ap = argparse.ArgumentParser(prog="python -m sglang_hybrid.tokenizer", description=main.__doc__)
    ap.add_argument("--out", default=str(DEFAULT_TOKENIZER_PATH.parent), help="output directory")
    ap.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    args = ap.parse_args(argv)
    path = train_default_tokenizer(args.out, vocab_size=args.vocab_size)
    print(f"wrote {path} ({path.stat().st_size} bytes, sha256 {tokenizer_digest(path)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
