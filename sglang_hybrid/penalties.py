"""Sampling penalties at every position of a verify window, exactly as plain decoding applies them.

SGLang's penalizers (``sampling/penaltylib``) count a request's *output* tokens: frequency subtracts
``frequency_penalty * n``, presence subtracts ``presence_penalty`` where ``n > 0`` (the two summed into one
additive tensor first, as the overlap scheduler's ``acc_additive_penalties``), and repetition then divides
positive logits by ``repetition_penalty`` where ``n > 0`` and multiplies negative ones. Plain decoding applies
them to one token at a time. A speculative verify scores ``window`` positions at once, and position ``j``'s
next token follows the drafts at positions ``1..j``: were they accepted, they are output too. So position ``j``
is penalised with the counts of the output so far *plus* those drafts; that is what :func:`apply_window_penalties`
does, and it is what makes a greedy verify commit exactly plain decoding's tokens. ``min_new_tokens`` likewise:
position ``j``'s stop tokens are held back while the output before it is shorter (:func:`mask_stop_tokens`).

:class:`PenaltyTable` keeps the counts on the device: one ``[rows, vocab]`` float32 row per penalised request (a
fixed number of rows, option ``penalty_rows``; one more row is a sink the unpenalised requests' commits land in),
the per-row parameters (and ``min_new_tokens``: the output length so far and the stop tokens it holds back), and
the map request-pool slot -> row. The host assigns rows at prefill (it knows each
request's sampling parameters); the device adds every committed token after each verify (no sync, stream order
keeps the next verify reading the counts the last one committed). Memory: ``(rows + 1) * vocab * 5`` bytes.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

import torch


def _penalise(x: torch.Tensor, n: torch.Tensor, f: torch.Tensor, p: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """SGLang's formula on logits ``x`` with counts ``n`` (parameters broadcast against them): the additive term
    ``-(n f) - p [n > 0]`` first, then positive logits divided by ``r`` where ``n > 0``, negative ones multiplied."""
    seen = n > 0
    out = x + (n * f).neg_().sub_(seen * p).to(x.dtype)
    scale = torch.where(seen, r.to(x.dtype), torch.ones((), dtype=x.dtype, device=x.device))
    return torch.where(out < 0, out * scale, out / scale)


def apply_window_penalties_ref(logits: torch.Tensor, counts: torch.Tensor, verify_ids: torch.Tensor,
                               frequency: torch.Tensor, presence: torch.Tensor,
                               repetition: torch.Tensor) -> torch.Tensor:
    """Reference of :func:`apply_window_penalties`: every position's counts materialised (``[k, W, V]``, a
    cumulative sum of the drafts' one-hots), then the formula everywhere. Returns a new tensor."""
    k, w, v = logits.shape
    drafts = torch.zeros(k, w, v, dtype=counts.dtype, device=counts.device)
    if w > 1:
        drafts[:, 1:].scatter_(2, verify_ids[:, 1:, None].to(torch.int64), 1.0)
    n = drafts.cumsum_(1).add_(counts[:, None, :])
    return _penalise(logits, n, frequency.view(k, 1, 1), presence.view(k, 1, 1), repetition.view(k, 1, 1))


def apply_window_penalties(logits: torch.Tensor, counts: torch.Tensor, verify_ids: torch.Tensor,
                           frequency: torch.Tensor, presence: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
    """Penalise the verify logits of ``k`` requests in place (and return them).

    ``logits [k, W, V]``: the target's logits at the ``W`` verify positions; ``counts [k, V]``: each request's output
    token counts before the window (its root token, the last committed, included); ``verify_ids [k, W]``: the
    window's tokens (column 0 the root, columns ``1..`` the drafts; position ``j`` adds columns ``1..j``);
    ``frequency`` / ``presence`` / ``repetition`` ``[k]``.

    Only the drafts' own tokens see counts that differ along the window, so the whole block takes the counts before
    the window (broadcast, in place: besides ``logits`` it holds one ``[k, W, V]`` temporary at a time), and the
    ``W x (W - 1)`` entries at the drafts' tokens are recomputed from their raw values with their position's counts
    and written back. Bit for bit :func:`apply_window_penalties_ref`."""
    k, w, v = logits.shape
    f, p, r = frequency.view(k, 1), presence.view(k, 1), repetition.view(k, 1)
    ids = verify_ids[:, 1:].to(torch.int64)  # [k, w - 1] the drafts
    at = ids.view(k, 1, w - 1).expand(k, w, w - 1)
    raw = logits.gather(2, at)  # [k, w, w - 1]: every position's logits at every draft's token, before
    seen = counts > 0
    logits.add_((counts * f).neg_().sub_(seen * p).to(logits.dtype).unsqueeze(1))
    scale = torch.where(seen, r.to(logits.dtype), torch.ones((), dtype=logits.dtype, device=logits.device))
    one = torch.ones((), dtype=logits.dtype, device=logits.device)
    logits.mul_(torch.where(logits < 0, scale.unsqueeze(1), one))  # x * 1 and x / 1 are exact: the two passes
    logits.div_(torch.where(logits < 0, one, scale.unsqueeze(1)))  # equal where(x < 0, x * s, x / s)
    if w > 1:
        # counts at position j of draft i's token: before the window, plus its occurrences among drafts 1..j
        same = (ids.unsqueeze(2) == ids.unsqueeze(1)).to(counts.dtype)  # [k, i, i']
        occ = torch.zeros(k, w, w - 1, dtype=counts.dtype, device=counts.device)
        occ[:, 1:] = same.cumsum(2).transpose(1, 2)  # occ[:, j, i] = #{1 <= i' <= j: ids[i'] == ids[i]}
        n = counts.gather(1, ids).unsqueeze(1) + occ
        logits.scatter_(2, at, _penalise(raw, n, f.unsqueeze(2), p.unsqueeze(2), r.unsqueeze(2)))
    return logits


def to_device(values, dtype, device) -> torch.Tensor:
    """A small host list on the device without waiting on it (pinned where there is a GPU)."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def is_penalised(sampling_params) -> bool:
    """Whether a request's ``SamplingParams`` set a penalty :class:`PenaltyTable` applies: frequency, presence or
    repetition, or ``min_new_tokens``."""
    return (sampling_params.frequency_penalty != 0.0 or sampling_params.presence_penalty != 0.0
            or sampling_params.repetition_penalty != 1.0 or sampling_params.min_new_tokens > 0)


def stop_token_ids(req) -> List[int]:
    """The tokens ``min_new_tokens`` holds back, as SGLang's ``BatchedMinNewTokensPenalizer`` gathers them: the
    request's ``stop_token_ids``, its ``eos_token_ids``, and its tokenizer's additional stop tokens and EOS."""
    tok = getattr(req, "tokenizer", None)
    ids = set(req.sampling_params.stop_token_ids or ()) | set(req.eos_token_ids or ())
    if tok is not None:
        ids |= set(getattr(tok, "additional_stop_token_ids", None) or ())
        if getattr(tok, "eos_token_id", None) is not None:
            ids.add(tok.eos_token_id)
    return sorted(i for i in ids if i is not None)


def mask_stop_tokens(logits: torch.Tensor, out_len: torch.Tensor, min_new: torch.Tensor,
                     stop: torch.Tensor) -> torch.Tensor:
    """``min_new_tokens`` at every verify position, in place: ``logits [k, W, V]``, ``out_len [k]`` the output tokens
    before the window's first prediction (its root included), ``min_new [k]``, ``stop [k, V]`` bool. Position ``j``
    predicts output token ``out_len + j + 1``; while ``out_len + j < min_new`` its stop tokens get ``-inf`` (SGLang adds
    ``-inf`` to them while the output is shorter than ``min_new_tokens``)."""
    k, w, _ = logits.shape
    pos = torch.arange(w, device=logits.device, dtype=out_len.dtype).view(1, w)
    held = (out_len.view(k, 1) + pos) < min_new.view(k, 1)
    return logits.masked_fill_(held.unsqueeze(2) & stop.unsqueeze(1), float("-inf"))


class PenaltyTable:
    """Per-request output token counts and penalty parameters on the device (module docstring)."""

    def __init__(self, num_slots: int, vocab: int, rows: int, device) -> None:
        if rows < 1:
            raise ValueError(f"PenaltyTable needs rows >= 1, got {rows}")
        self.rows, self.vocab, self.device = rows, vocab, device
        self.sink = rows  # where the commits of unpenalised requests land; never read
        self.counts = torch.zeros(rows + 1, vocab, dtype=torch.float32, device=device)
        self.frequency = torch.zeros(rows + 1, dtype=torch.float32, device=device)
        self.presence = torch.zeros(rows + 1, dtype=torch.float32, device=device)
        self.repetition = torch.ones(rows + 1, dtype=torch.float32, device=device)
        self.min_new = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.out_len = torch.zeros(rows + 1, dtype=torch.int32, device=device)  # output tokens committed
        self.stop = torch.zeros(rows + 1, vocab, dtype=torch.bool, device=device)  # min_new_tokens' stop tokens
        self.slot_row = torch.full((num_slots,), self.sink, dtype=torch.int64, device=device)
        # host side: which request holds each row (its rid and slot), and the free rows
        self._free: List[int] = list(range(rows - 1, -1, -1))
        self._holder: dict = {}  # row -> (rid, slot, req)
        self._row_of_slot: dict = {}  # slot -> row
        self.refused = 0  # penalised requests that found no free row (metric)

    @property
    def rows_in_use(self) -> int:
        """Rows held by requests still running (host side; a finished request's row stays allocated until its slot
        is reused or the table needs it, but is not counted)."""
        return sum(not req.finished() for _rid, _slot, req in self._holder.values())

    def row_of_slot(self, slot: int) -> Optional[int]:
        return self._row_of_slot.get(slot)

    # ---- host: rows at prefill ---------------------------------------------------------------------
    def _release(self, row: int) -> None:
        _rid, slot, _req = self._holder.pop(row)
        if self._row_of_slot.get(slot) == row:
            del self._row_of_slot[slot]
        self._free.append(row)

    def _take(self) -> Optional[int]:
        if not self._free:  # reclaim the rows of requests that have finished since
            for row, (_rid, _slot, req) in list(self._holder.items()):
                if req.finished():
                    self._release(row)
        return self._free.pop() if self._free else None

    def on_prefill(self, reqs: Sequence, slots: Sequence[int], slots_dev: torch.Tensor,
                   first_tokens: torch.Tensor) -> None:
        """Host side, after a prefill of ``reqs`` in slots ``slots`` (host ints; ``slots_dev`` the same on the
        device): give each penalised request a row and start it with its output so far (after a retraction) and
        its first sampled token ``first_tokens [bs]`` (device). A slot's previous request, or the same request's
        earlier row (a chunk of a chunked prefill, a retracted request back in another slot), lets go of its row."""
        rows: List[int] = []
        pen_idx: List[int] = []
        params: List[tuple] = []
        history: List[List[int]] = []
        lens: List[tuple] = []  # (min_new_tokens, output tokens with the first one)
        stops: List[List[int]] = []
        for i, (req, slot) in enumerate(zip(reqs, slots)):
            for row, (rid, held_slot, _req) in list(self._holder.items()):
                if held_slot == slot or rid == req.rid:
                    self._release(row)
            row = self.sink
            sp = req.sampling_params
            if is_penalised(sp):
                got = self._take()
                if got is None:
                    self.refused += 1
                else:
                    row = got
                    self._holder[row] = (req.rid, slot, req)
                    self._row_of_slot[slot] = row
                    pen_idx.append(i)
                    params.append((sp.frequency_penalty, sp.presence_penalty, sp.repetition_penalty))
                    history.append(list(req.output_ids))
                    lens.append((sp.min_new_tokens, len(history[-1]) + 1))
                    stops.append(stop_token_ids(req) if sp.min_new_tokens > 0 else [])
            rows.append(row)
        dev = self.device
        self.slot_row.index_copy_(0, slots_dev.to(torch.int64), to_device(rows, torch.int64, dev))
        if not pen_idx:
            return
        taken = to_device([rows[i] for i in pen_idx], torch.int64, dev)
        p = to_device(params, torch.float32, dev)
        self.counts.index_fill_(0, taken, 0.0)
        self.frequency.index_copy_(0, taken, p[:, 0])
        self.presence.index_copy_(0, taken, p[:, 1])
        self.repetition.index_copy_(0, taken, p[:, 2])
        n = to_device(lens, torch.int32, dev)
        self.min_new.index_copy_(0, taken, n[:, 0])
        self.out_len.index_copy_(0, taken, n[:, 1])
        self.stop.index_fill_(0, taken, False)
        held = [(j, t) for j, ids in enumerate(stops) for t in ids if 0 <= t < self.vocab]
        if held:
            at = to_device(held, torch.int64, dev)
            self.stop.index_put_((taken[at[:, 0]], at[:, 1]), torch.ones((), dtype=torch.bool, device=dev))
        longest = max(len(h) for h in history)
        if longest:  # a retracted request's output before its re-prefill
            toks = torch.zeros(len(history), longest, dtype=torch.int64)
            mask = torch.zeros(len(history), longest, dtype=torch.float32)
            for j, h in enumerate(history):
                toks[j, : len(h)] = torch.tensor(h, dtype=torch.int64)
                mask[j, : len(h)] = 1.0
            self.counts.index_put_((taken.view(-1, 1).expand(-1, longest), toks.to(dev, non_blocking=True)),
                                   mask.to(dev, non_blocking=True), accumulate=True)
        first = first_tokens.view(-1).to(torch.int64)[to_device(pen_idx, torch.int64, dev)]
        self.counts.index_put_((taken, first), torch.ones(len(pen_idx), dtype=torch.float32, device=dev),
                               accumulate=True)

    # ---- device: every step ------------------------------------------------------------------------
    def commit(self, slots: torch.Tensor, committed: torch.Tensor, accept_lens: torch.Tensor) -> None:
        """Add ``committed[b, :accept_lens[b]]`` to each request's counts (unpenalised rows land in the sink)."""
        bs, w = committed.shape
        rows = self.slot_row[slots.to(torch.int64)]
        live = torch.arange(w, device=committed.device).view(1, w) < accept_lens.view(bs, 1)
        self.counts.index_put_((rows.view(bs, 1).expand(bs, w), committed.to(torch.int64)), live.to(torch.float32),
                               accumulate=True)
        self.out_len.index_add_(0, rows, accept_lens.to(torch.int32))

    def apply(self, logits: torch.Tensor, verify_ids: torch.Tensor, slots: torch.Tensor, batch_rows: Iterable[int],
              bias: Optional[torch.Tensor] = None, min_new: bool = False) -> None:
        """Penalise, in place, the verify logits ``[bs, W, V]`` of the batch rows ``batch_rows`` (host ints: the
        requests that hold a row), whose request-pool slots are ``slots [bs]``. ``bias [bs, V]``: a logit bias the
        logits already carry; plain decoding adds it after the penalties, so it is taken out first and put back.
        ``min_new``: some of these requests may still be under ``min_new_tokens`` (host-known; the device decides
        per position)."""
        batch_rows = list(batch_rows)
        idx = to_device(batch_rows, torch.int64, logits.device)
        rows = self.slot_row[slots.to(torch.int64).index_select(0, idx)]
        every = batch_rows == list(range(logits.shape[0]))  # host-known: then in place, no gather
        picked = logits if every else logits.index_select(0, idx)
        if bias is not None:
            b = (bias if every else bias.index_select(0, idx)).unsqueeze(1).to(logits.dtype)
            picked.sub_(b)
        apply_window_penalties(picked, self.counts.index_select(0, rows),
                               verify_ids if every else verify_ids.index_select(0, idx),
                               self.frequency[rows], self.presence[rows], self.repetition[rows])
        if min_new:
            mask_stop_tokens(picked, self.out_len[rows], self.min_new[rows], self.stop[rows])
        if bias is not None:
            picked.add_(b)
        if not every:
            logits.index_copy_(0, idx, picked)
