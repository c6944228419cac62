"""Where the replayed token sequences come from.

* ``text_token_docs``: source (a), "text itself": tokenize a corpus, cut long documents into chunks of at most
  ``max_doc_tokens`` (the history then never wraps), and give each chunk a prompt of a seeded random fraction of
  its length (uniform in ``prompt_frac``). The text after the prompt plays the target model.
* ``model_token_docs``: source (b), a Hugging Face causal LM's own greedy continuations: the first
  ``prompt_tokens`` of each corpus document are the prompt, the model's greedy continuation (up to
  ``max_new_tokens``, cut at EOS) is the text that the n-gram drafts are scored against.
* ``request_token_docs``: served requests (``Document.prompt`` set): the prompt's tokens then the output's; the
  prompt length is the real one, and the output plays the target.
* ``draft_first_tokens``: a draft model's first-token proposals at every position of each sequence (teacher
  forcing: its argmax next token), giving the optional ``agree`` feature.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import numpy as np

from .corpus import Document

__all__ = ["select_documents", "tokenize_documents", "text_token_docs", "request_token_docs", "load_causal_lm",
           "model_token_docs", "draft_first_tokens"]


def select_documents(docs: Sequence[Document], max_docs: Optional[int], seed: int) -> list[Document]:
    """All documents, or a seeded random subset of ``max_docs`` of them (kept in corpus order)."""
    if max_docs is None or max_docs >= len(docs):
        return list(docs)
    if max_docs < 1:
        raise ValueError(f"max_docs must be >= 1, got {max_docs}")
    keep = np.sort(np.random.default_rng(seed).permutation(len(docs))[:max_docs])
    return [docs[i] for i in keep]


def tokenize_documents(docs: Sequence[Document], tokenizer: Any) -> list[np.ndarray]:
    """Token ids (int64) of each document with a ``tokenizers.Tokenizer`` (no special tokens added)."""
    enc = tokenizer.encode_batch([d.text for d in docs], add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int64) for e in enc]


def request_token_docs(docs: Sequence[Document], tokenizer: Any) -> tuple[list[np.ndarray], np.ndarray]:
    """``(sequences, prompt_lens)`` of served requests: prompt tokens then output tokens, tokenized apart."""
    if any(d.prompt is None for d in docs):
        raise ValueError("request_token_docs: every document needs a prompt (a served request)")
    prompts = tokenizer.encode_batch([d.prompt for d in docs], add_special_tokens=False)
    outputs = tokenizer.encode_batch([d.text for d in docs], add_special_tokens=False)
    seqs, plens = [], []
    for p, o in zip(prompts, outputs):
        if len(p.ids) == 0 or len(o.ids) == 0:
            continue  # nothing to search or nothing to draft
        seqs.append(np.asarray(list(p.ids) + list(o.ids), dtype=np.int64))
        plens.append(len(p.ids))
    return seqs, np.asarray(plens, dtype=np.int64)


def _chunks(ids: np.ndarray, max_len: int, min_len: int) -> list[np.ndarray]:
    out = [ids[s: s + max_len] for s in range(0, len(ids), max_len)]
    if len(out) > 1 and len(out[-1]) < min_len:
        out.pop()
    return [c for c in out if len(c) >= min_len]


def text_token_docs(
    token_docs: Sequence[np.ndarray],
    *,
    seed: int,
    max_doc_tokens: int = 8192,
    min_doc_tokens: int = 32,
    prompt_frac: tuple[float, float] = (0.2, 0.8),
) -> tuple[list[np.ndarray], np.ndarray]:
    """Chunk documents and draw prompt lengths; returns ``(sequences, prompt_lens)``."""
    if max_doc_tokens < min_doc_tokens:
        raise ValueError(f"max_doc_tokens={max_doc_tokens} must be >= min_doc_tokens={min_doc_tokens}")
    lo, hi = prompt_frac
    if not 0.0 < lo <= hi < 1.0:
        raise ValueError(f"prompt_frac must satisfy 0 < lo <= hi < 1, got {prompt_frac}")
    seqs = [c for ids in token_docs for c in _chunks(ids, max_doc_tokens, min_doc_tokens)]
    frac = np.random.default_rng(seed + 1).uniform(lo, hi, size=len(seqs))
    plen = np.array([max(1, int(f * len(s))) for f, s in zip(frac, seqs)], dtype=np.int64)
    return seqs, plen


def load_causal_lm(model_dir: str | os.PathLike, device: str = "cpu") -> Any:
    """A local Hugging Face causal LM in eval mode (float32 on CPU). Raises ``FileNotFoundError`` naming the dir."""
    import torch
    from transformers import AutoModelForCausalLM

    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"model directory {str(model_dir)!r} not found")
    dtype = torch.float32 if str(device) == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    return model.to(device).eval()


def model_token_docs(
    model: Any,
    token_docs: Sequence[np.ndarray],
    *,
    prompt_tokens: int = 512,
    max_new_tokens: int = 256,
    batch_size: int = 8,
    eos_token_id: Optional[int] = None,
    min_prompt_tokens: int = 8,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Greedy continuations: returns ``(prompt + continuation sequences, prompt_lens)``.

    Prompts are the first ``prompt_tokens`` of each document (documents shorter than ``min_prompt_tokens`` are
    skipped); batches are left-padded. The continuation stops after the first EOS (``eos_token_id``, default
    the model's) or at ``max_new_tokens``.
    """
    import torch

    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    if eos_token_id is None:
        eos = getattr(model.config, "eos_token_id", None)
        eos_token_id = eos[0] if isinstance(eos, (list, tuple)) else eos
    pad = int(eos_token_id) if eos_token_id is not None else 0
    prompts = [np.asarray(d[:prompt_tokens], dtype=np.int64) for d in token_docs if len(d) >= min_prompt_tokens]
    for p in prompts:
        if p.size and int(p.max()) >= vocab:
            raise ValueError(f"token id {int(p.max())} >= the model's vocab_size {vocab}: tokenizer and model differ")
    seqs: list[np.ndarray] = []
    plens: list[int] = []
    for b0 in range(0, len(prompts), batch_size):
        batch = prompts[b0: b0 + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, p in enumerate(batch):
            ids[r, width - len(p):] = torch.as_tensor(p)
            mask[r, width - len(p):] = 1
        with torch.no_grad():
            out = model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                min_new_tokens=1, do_sample=False, num_beams=1, pad_token_id=pad,
                eos_token_id=eos_token_id, temperature=None, top_p=None, top_k=None,
            )
        gen = out[:, width:].cpu().numpy()
        for r, p in enumerate(batch):
            cont = gen[r]
            if eos_token_id is not None:
                stop = np.nonzero(cont == eos_token_id)[0]
                if stop.size:
                    cont = cont[: stop[0]]
            seqs.append(np.concatenate([p, cont.astype(np.int64)]))
            plens.append(len(p))
    return seqs, np.asarray(plens, dtype=np.int64)


def draft_first_tokens(model: Any, seqs: Sequence[np.ndarray], *, batch_size: int = 8,
                       max_len: int = 4096) -> list[np.ndarray]:
    """The draft model's argmax next token after every prefix ``x[0..i]`` of each sequence (teacher forcing).

    Sequences longer than ``max_len`` are processed in windows of ``max_len`` with no carried state (the first
    tokens of each later window see a shortened context).
    """
    import torch

    device = next(model.parameters()).device
    out: list[np.ndarray] = []
    for b0 in range(0, len(seqs), batch_size):
        batch = list(seqs[b0: b0 + batch_size])
        preds = [np.zeros(len(s), dtype=np.int64) for s in batch]
        longest = max((len(s) for s in batch), default=0)
        for w0 in range(0, longest, max_len):
            parts = [s[w0: w0 + max_len] for s in batch]
            width = max(len(p) for p in parts)
            if width == 0:
                continue
            ids = torch.zeros((len(parts), width), dtype=torch.long)
            mask = torch.zeros((len(parts), width), dtype=torch.long)
            for r, p in enumerate(parts):  # right padding: positions keep their natural order
                ids[r, : len(p)] = torch.as_tensor(np.asarray(p, dtype=np.int64))
                mask[r, : len(p)] = 1
            with torch.no_grad():
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            arg = logits.argmax(-1).cpu().numpy()
            for r, p in enumerate(parts):
                preds[r][w0: w0 + len(p)] = arg[r, : len(p)]
        out.extend(preds)
    return out
