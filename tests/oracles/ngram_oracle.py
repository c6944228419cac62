"""Brute-force oracle for the n-gram drafter (the original Python-loop references, moved here unchanged).

These loops define the semantics documented in ``sglang_hybrid/ngram/reference.py``; the vectorized torch
reference and the Triton kernels are both checked against them. Two additions over the original loops make
the oracle total on invalid device data, matching what the reference and the kernels do:

* a slot outside ``[0, num_slots)`` is ignored (no write; lookup outputs stay 0);
* ``prompt_len`` and ``counts`` are clamped to ``[0, prompt.shape[1]]`` / ``[0, new_tokens.shape[1]]``.
"""

from __future__ import annotations

import torch

__all__ = [
    "history_write_prompt_oracle",
    "history_append_oracle",
    "history_reset_oracle",
    "ngram_lookup_oracle",
]


def _slot(slots: torch.Tensor, b: int, num_slots: int) -> int | None:
    s = int(slots[b])
    return s if 0 <= s < num_slots else None


def history_write_prompt_oracle(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    prompt_lens: torch.Tensor,
    slots: torch.Tensor,
    prompt: torch.Tensor,
    prompt_len: torch.Tensor,
) -> None:
    """Start each slot afresh with ``prompt[b, :prompt_len[b]]``; rows keep their newest ``W`` tokens."""
    width = tokens.shape[1]
    for b in range(slots.shape[0]):
        s = _slot(slots, b, tokens.shape[0])
        if s is None:
            continue
        n = min(max(int(prompt_len[b]), 0), prompt.shape[1])
        start = max(0, n - width)
        for p in range(start, n):
            tokens[s, p % width] = prompt[b, p]
        lens[s] = n
        prompt_lens[s] = n


def history_append_oracle(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    slots: torch.Tensor,
    new_tokens: torch.Tensor,
    counts: torch.Tensor,
) -> None:
    """Append ``new_tokens[b, :counts[b]]`` to each slot (accepted draft tokens plus the bonus token)."""
    width = tokens.shape[1]
    for b in range(slots.shape[0]):
        s = _slot(slots, b, tokens.shape[0])
        if s is None:
            continue
        t = int(lens[s])
        c = min(max(int(counts[b]), 0), new_tokens.shape[1])
        for i in range(c):
            tokens[s, (t + i) % width] = new_tokens[b, i]
        lens[s] = t + c


def history_reset_oracle(lens: torch.Tensor, prompt_lens: torch.Tensor, slots: torch.Tensor) -> None:
    """Forget the history of finished, aborted or retracted requests."""
    for b in range(slots.shape[0]):
        s = _slot(slots, b, lens.shape[0])
        if s is None:
            continue
        lens[s] = 0
        prompt_lens[s] = 0


def ngram_lookup_oracle(
    tokens: torch.Tensor,
    lens: torch.Tensor,
    prompt_lens: torch.Tensor,
    slots: torch.Tensor,
    out_tokens: torch.Tensor,
    out_len: torch.Tensor,
    out_match_len: torch.Tensor,
    out_match_count: torch.Tensor,
    out_in_prompt: torch.Tensor,
    n_min: int,
    n_max: int,
    window: int,
) -> None:
    """Batched prompt lookup by brute force; writes the ``out_*`` tensors in place."""
    width = tokens.shape[1]
    max_draft = out_tokens.shape[1]
    out_tokens.zero_()
    out_len.zero_()
    out_match_len.zero_()
    out_match_count.zero_()
    out_in_prompt.zero_()
    for b in range(slots.shape[0]):
        s = _slot(slots, b, tokens.shape[0])
        if s is None:
            continue
        T = int(lens[s])
        lo = max(0, T - width)
        row = tokens[s]
        first = lo if window <= 0 else max(lo, T - 1 - window)
        best_m, best_e = 0, -1
        ms = []
        for e in range(first, T - 1):
            m = 0
            while m < n_max and e - m >= lo and int(row[(e - m) % width]) == int(row[(T - 1 - m) % width]):
                m += 1
            ms.append(m)
            if m >= best_m and m > 0:
                best_m, best_e = m, e
        if best_m < n_min or best_e < 0:
            continue
        n = min(max_draft, T - 1 - best_e)
        for i in range(n):
            out_tokens[b, i] = row[(best_e + 1 + i) % width]
        out_len[b] = n
        out_match_len[b] = best_m
        out_match_count[b] = sum(1 for m in ms if m >= best_m)
        out_in_prompt[b] = int(best_e + 1 < int(prompt_lens[s]))


def lookup_from_list(
    history: list[int], prompt_len: int, width: int, n_min: int, n_max: int, window: int, max_draft: int
) -> tuple[list[int], int, int, int, int]:
    """Lookup over a plain list holding the *whole* logical history, independent of the ring layout.

    Only the newest ``width`` positions are visible, as the table keeps them. Returns
    ``(draft, draft_len, match_len, match_count, in_prompt)``.
    """
    T = len(history)
    lo = max(0, T - width)
    first = lo if window <= 0 else max(lo, T - 1 - window)
    scored = []
    for e in range(first, T - 1):
        m = 0
        while m < n_max and e - m >= lo and history[e - m] == history[T - 1 - m]:
            m += 1
        scored.append((m, e))
    if not scored:
        return [], 0, 0, 0, 0
    best_m, best_e = max(scored)  # largest m, then largest e
    if best_m < n_min:
        return [], 0, 0, 0, 0
    draft = history[best_e + 1 : min(best_e + 1 + max_draft, T)]
    count = sum(1 for m, _ in scored if m >= best_m)
    return draft, len(draft), best_m, count, int(best_e + 1 < prompt_len)


def new_outputs(bs: int, max_draft: int, fill: int = 7) -> list[torch.Tensor]:
    """Lookup output tensors pre-filled with garbage (so a missing write shows)."""
    return [torch.full((bs, max_draft), fill, dtype=torch.int32)] + [
        torch.full((bs,), fill, dtype=torch.int32) for _ in range(4)
    ]
