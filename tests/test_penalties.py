"""Sampling penalties at every verify position (sglang_hybrid/penalties.py).

- ``apply_window_penalties`` equals SGLang's own penalizers (frequency, presence, repetition; the overlap
  scheduler's path: one additive tensor, then the scaling), run one position at a time on the output so far plus the
  drafts before the position, bit for bit (penalties exactly representable, so repeated addition equals the
  product);
- ``PenaltyTable``: rows given at prefill (output so far after a retraction, first token), released on slot reuse
  and re-prefill, refused when full, reclaimed from finished requests; ``commit`` adds the accepted prefix only;
- a toy greedy decoder: speculative verify with the table (drafts right and wrong, duplicates in the window)
  commits exactly the tokens plain penalised decoding produces.
"""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import pytest
import torch

from sglang_hybrid.penalties import (
    PenaltyTable,
    apply_window_penalties,
    apply_window_penalties_ref,
    is_penalised,
    mask_stop_tokens,
    stop_token_ids,
)

V = 37


def _params(freq=0.0, pres=0.0, rep=1.0, min_new=0, stop=None):
    return SimpleNamespace(frequency_penalty=freq, presence_penalty=pres, repetition_penalty=rep,
                           min_new_tokens=min_new, stop_token_ids=stop)


_TOKENIZER = SimpleNamespace(additional_stop_token_ids={V - 2}, eos_token_id=V - 1)


class _Req:
    def __init__(self, rid, sp, output_ids=(), done=False, eos=None):
        self.rid, self.sampling_params, self.output_ids, self._done = rid, sp, list(output_ids), done
        self.eos_token_ids, self.tokenizer = eos, _TOKENIZER

    def finished(self):
        return self._done


class _Batch:  # what SGLang's penalizers read: reqs and the device (weak-referenced)
    def __init__(self, reqs):
        self.reqs, self.device = reqs, "cpu"


def _sglang_penalised(logits_row: torch.Tensor, sp, history):
    """One position through SGLang 0.5.23's penalizers, as the overlap scheduler applies them."""
    from sglang.srt.sampling import penaltylib
    from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

    batch = _Batch([SimpleNamespace(sampling_params=sp, eos_token_ids=None, tokenizer=_TOKENIZER)])
    orch = penaltylib.BatchedPenalizerOrchestrator(
        vocab_size=V, batch=batch,
        penalizers={penaltylib.BatchedFrequencyPenalizer, penaltylib.BatchedPresencePenalizer,
                    penaltylib.BatchedRepetitionPenalizer, penaltylib.BatchedMinNewTokensPenalizer})
    for t in history:
        orch.cumulate_output_tokens(torch.tensor([t]))
    out = logits_row.clone().view(1, V)
    if orch.is_required:
        acc = torch.zeros(1, V)
        orch.accumulate_additive_penalties(acc)
        out.add_(acc)
        scaling = orch.accumulate_scaling_penalties()
        if scaling is not None:
            getattr(apply_scaling_penalties, "_torchdynamo_orig_callable", apply_scaling_penalties)(out, scaling)
    del batch
    return out.view(V)


def _case(g: torch.Generator, k: int, w: int):
    logits = torch.randn(k, w, V, generator=g) * 3
    outputs = [torch.randint(0, V, (int(torch.randint(0, 9, (1,), generator=g)) + 1,), generator=g).tolist()
               for _ in range(k)]
    ids = torch.randint(0, 6, (k, w), generator=g)  # a small range: drafts repeat each other and the output
    ids[:, 0] = torch.tensor([o[-1] for o in outputs])  # the root is the last committed token
    return logits, outputs, ids


@pytest.mark.parametrize("seed", range(6))
def test_window_penalties_equal_sglangs_penalizers_position_by_position(seed):
    g = torch.Generator().manual_seed(seed)
    k, w = 4, 6
    logits, outputs, ids = _case(g, k, w)
    choices = [(0.5, 0.0, 1.0), (0.0, 1.25, 1.0), (0.0, 0.0, 1.5), (-0.75, 0.5, 2.0)]
    sps = [_params(*choices[(seed + i) % 4]) for i in range(k)]
    counts = torch.zeros(k, V)
    for i, o in enumerate(outputs):
        for t in o:
            counts[i, t] += 1
    f = torch.tensor([sp.frequency_penalty for sp in sps])
    p = torch.tensor([sp.presence_penalty for sp in sps])
    r = torch.tensor([sp.repetition_penalty for sp in sps])
    got = apply_window_penalties_ref(logits, counts, ids, f, p, r)
    for i in range(k):
        for j in range(w):
            want = _sglang_penalised(logits[i, j], sps[i], outputs[i] + ids[i, 1: j + 1].tolist())
            assert torch.equal(got[i, j], want), (i, j)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("w", [1, 2, 5, 9])
def test_in_place_window_penalties_equal_the_reference_bit_for_bit(seed, w):
    """The in-place version (the block at the counts before the window, the drafts' entries recomputed) against
    the reference that materialises every position's counts: random logits and parameters, drafts drawn from a
    few tokens (repeats, the root among them), tokens with and without counts, logits exactly 0."""
    g = torch.Generator().manual_seed(100 + seed)
    k = 5
    logits = torch.randn(k, w, V, generator=g) * 4
    logits[:, :, 0] = 0.0
    counts = torch.randint(0, 3, (k, V), generator=g).float() * (torch.rand(k, V, generator=g) < 0.3)
    ids = torch.randint(0, 4 if seed % 2 else V, (k, w), generator=g)
    f = torch.randn(k, generator=g).clamp(-2, 2)
    p = torch.randn(k, generator=g).clamp(-2, 2)
    r = torch.rand(k, generator=g) * 1.9 + 0.1
    if seed == 0:  # neutral rows
        f[0], p[0], r[0] = 0.0, 0.0, 1.0
    want = apply_window_penalties_ref(logits, counts, ids, f, p, r)
    got = apply_window_penalties(logits.clone(), counts, ids, f, p, r)
    assert torch.equal(got, want)


@pytest.mark.parametrize("impl", [apply_window_penalties, apply_window_penalties_ref])
def test_window_penalties_leave_neutral_rows_and_negative_infinities_alone(impl):
    g = torch.Generator().manual_seed(0)
    logits, outputs, ids = _case(g, 2, 4)
    logits[1, 2, 3] = float("-inf")  # a grammar mask's -inf stays -inf under every penalty
    counts = torch.zeros(2, V)
    counts[1, 3] = 2
    got = impl(logits.clone(), counts, ids, torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]),
               torch.tensor([1.0, 1.3]))
    assert torch.equal(got[0], logits[0])
    assert got[1, 2, 3] == float("-inf")
    assert not torch.equal(got[1], logits[1])


def test_a_logit_bias_the_logits_carry_is_added_after_the_penalties_as_plain_decoding_does():
    """DSpark's verify has added ``logit_bias`` already; plain decoding adds it after the penalties (which differs
    where a repetition penalty scales a biased token), so ``apply`` takes it out and puts it back."""
    g = torch.Generator().manual_seed(3)
    logits, _outputs, ids = _case(g, 2, 4)
    reqs = [_Req("a", _params(rep=2.0)), _Req("b", _params(freq=0.5, rep=1.5))]
    table = PenaltyTable(num_slots=2, vocab=V, rows=2, device="cpu")
    table.on_prefill(reqs, [0, 1], torch.tensor([0, 1]), first_tokens=ids[:, 0])
    bias = torch.zeros(2, V)
    bias[:, ids[:, 0]] = 8.0  # biased tokens that are also in the counts: the order matters for them
    got = logits + bias[:, None, :]
    table.apply(got, ids, torch.tensor([0, 1]), [0, 1], bias=bias)
    counts = table.counts[:2]
    want = apply_window_penalties_ref(logits, counts, ids, table.frequency[:2], table.presence[:2],
                                      table.repetition[:2]) + bias[:, None, :]
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    wrong = apply_window_penalties_ref(logits + bias[:, None, :], counts, ids, table.frequency[:2], table.presence[:2],
                                   table.repetition[:2])
    assert not torch.allclose(got, wrong, atol=1e-3, rtol=0)


def test_is_penalised_reads_the_count_penalties_and_min_new_tokens():
    assert not is_penalised(_params())
    assert is_penalised(_params(freq=0.1)) and is_penalised(_params(pres=-0.1)) and is_penalised(_params(rep=1.1))
    assert is_penalised(_params(min_new=4))


def test_stop_tokens_gather_what_sglangs_min_new_tokens_penalizer_holds_back():
    req = _Req("a", _params(min_new=3, stop={4, 9}), eos={7})
    assert stop_token_ids(req) == [4, 7, 9, V - 2, V - 1]
    req.tokenizer = None  # no tokenizer (skip_tokenizer_init): the request's own
    assert stop_token_ids(req) == [4, 7, 9]


def test_mask_stop_tokens_holds_them_back_until_the_output_is_long_enough():
    g = torch.Generator().manual_seed(5)
    k, w = 3, 6
    logits = torch.randn(k, w, V, generator=g)
    stop = torch.zeros(k, V, dtype=torch.bool)
    stop[:, 2] = True
    stop[1, 5] = True
    out_len, min_new = torch.tensor([1, 3, 9], dtype=torch.int32), torch.tensor([4, 3, 12], dtype=torch.int32)
    got = mask_stop_tokens(logits.clone(), out_len, min_new, stop)
    for i in range(k):
        for j in range(w):
            held = int(out_len[i]) + j < int(min_new[i])  # plain decoding: output shorter than min_new_tokens
            want = logits[i, j].masked_fill(stop[i] & held, float("-inf"))
            assert torch.equal(got[i, j], want), (i, j)


def test_table_rows_at_prefill_release_refuse_and_reclaim():
    table = PenaltyTable(num_slots=6, vocab=V, rows=2, device="cpu")
    a = _Req("a", _params(freq=0.5), output_ids=[4, 4, 9])  # back from a retraction: its output so far counts
    b = _Req("b", _params())
    table.on_prefill([a, b], [0, 1], torch.tensor([0, 1]), first_tokens=torch.tensor([7, 8]))
    ra = table.row_of_slot(0)
    assert ra is not None and table.row_of_slot(1) is None and table.rows_in_use == 1
    assert table.counts[ra, 4] == 2 and table.counts[ra, 9] == 1 and table.counts[ra, 7] == 1
    assert table.counts[ra].sum() == 4 and table.frequency[ra] == 0.5
    assert table.slot_row.tolist()[:2] == [ra, table.sink]
    c, d = _Req("c", _params(rep=1.2)), _Req("d", _params(pres=1.0))
    table.on_prefill([c, d], [2, 3], torch.tensor([2, 3]), first_tokens=torch.tensor([1, 2]))
    assert table.row_of_slot(2) is not None and table.row_of_slot(3) is None and table.refused == 1
    assert table.slot_row[3] == table.sink
    assert table.rows_in_use == 2
    a._done = True  # a finished: no longer counted in use, and its row is reclaimed for the next penalised request
    assert table.rows_in_use == 1
    e = _Req("e", _params(freq=1.0))
    table.on_prefill([e], [4], torch.tensor([4]), first_tokens=torch.tensor([5]))
    assert table.row_of_slot(4) == ra and table.row_of_slot(0) is None
    assert table.counts[ra].sum() == 1 and table.counts[ra, 5] == 1  # a fresh row
    # A new request in c's slot releases c's row; a retracted e back in another slot lets go of its old row.
    table.on_prefill([_Req("f", _params())], [2], torch.tensor([2]), first_tokens=torch.tensor([0]))
    assert table.row_of_slot(2) is None and table.rows_in_use == 1
    e.output_ids = [5, 6]
    table.on_prefill([e], [5], torch.tensor([5]), first_tokens=torch.tensor([6]))
    assert table.row_of_slot(4) is None and table.row_of_slot(5) is not None and table.rows_in_use == 1
    r = table.row_of_slot(5)
    assert table.counts[r, 5] == 1 and table.counts[r, 6] == 2


def test_commit_adds_the_accepted_prefix_and_sinks_unpenalised_rows():
    table = PenaltyTable(num_slots=4, vocab=V, rows=2, device="cpu")
    table.on_prefill([_Req("a", _params(freq=1.0)), _Req("b", _params())], [1, 3], torch.tensor([1, 3]),
                     first_tokens=torch.tensor([2, 2]))
    ra = table.row_of_slot(1)
    before = table.counts[ra].clone()
    table.commit(torch.tensor([3, 1]), torch.tensor([[5, 5, 5, 5], [6, 6, 9, 11]]), torch.tensor([4, 3]))
    delta = table.counts[ra] - before
    assert delta[6] == 2 and delta[9] == 1 and delta[11] == 0 and delta.sum() == 3
    assert table.counts[table.sink, 5] == 4  # b's commits land in the sink, which nothing reads


def _toy_logits(prev: int, pos: int) -> torch.Tensor:
    """A deterministic 'model': logits of the next token from the previous token and the position."""
    g = torch.Generator().manual_seed(1000 * prev + pos)
    return torch.randn(V, generator=g) * 2


def _plain(first: int, n: int, sp) -> list:
    out = [first]
    for pos in range(1, n):
        row = _sglang_penalised(_toy_logits(out[-1], pos), sp, out)
        out.append(int(row.argmax()))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_speculative_verify_with_the_table_commits_plain_decodings_tokens(seed):
    """Greedy verify of drafts (half of them plain decoding's own next tokens, the rest wrong; the window's drafts
    repeat each other) with the table's penalties and min_new_tokens commits exactly plain penalised decoding's
    tokens (SGLang's penalizers, min_new_tokens' included)."""
    g = torch.Generator().manual_seed(seed)
    n, w = 24, 5
    firsts = torch.randint(0, V, (6,), generator=g).tolist()
    free = [_plain(f, n, _params()) for f in firsts[4:]]  # min_new_tokens holds back what they emit at 1-3
    sps = [_params(freq=0.5), _params(pres=1.25), _params(rep=1.5), _params(freq=-0.5, pres=0.75, rep=1.25),
           _params(min_new=5, stop=set(free[0][1:4])), _params(freq=0.5, min_new=3, stop={free[1][1]})]
    want = [_plain(f, n, sp) for f, sp in zip(firsts, sps)]
    assert want[4] != free[0] and want[5][1] != free[1][1]  # min_new_tokens changes them
    reqs = [_Req(str(i), sp) for i, sp in enumerate(sps)]
    slots = torch.tensor([3, 0, 2, 1, 5, 4])
    table = PenaltyTable(num_slots=6, vocab=V, rows=6, device="cpu")
    table.on_prefill(reqs, slots.tolist(), slots, first_tokens=torch.tensor(firsts))
    outs = [[f] for f in firsts]
    while min(len(o) for o in outs) < n:
        ids = torch.zeros(len(sps), w, dtype=torch.int64)
        for i, o in enumerate(outs):
            ids[i, 0] = o[-1]
            for j in range(1, w):  # a draft is plain decoding's token, or a wrong one, by a coin
                right = want[i][len(o) + j - 1] if len(o) + j - 1 < n else 0
                ids[i, j] = right if torch.rand(1, generator=g) < 0.6 else int(ids[i, j - 1])
        logits = torch.stack([torch.stack([_toy_logits(int(ids[i, j]), len(outs[i]) + j) for j in range(w)])
                              for i in range(len(sps))])
        table.apply(logits, ids, slots, range(len(sps)), min_new=True)
        target = logits.argmax(-1)
        committed = torch.zeros(len(sps), w, dtype=torch.int64)
        lens = torch.zeros(len(sps), dtype=torch.int64)
        for i in range(len(sps)):
            j = 0
            while j + 1 < w and ids[i, j + 1] == target[i, j]:
                j += 1
            toks = ids[i, 1: j + 1].tolist() + [int(target[i, j])]
            committed[i, : len(toks)] = torch.tensor(toks)
            lens[i] = len(toks)
            outs[i] += toks
        table.commit(slots, committed, lens)
    assert [o[:n] for o in outs] == want
