"""Replay a workload through a policy, step by step, as a server with ``batch_size`` slots would run it.

Per decode step, for the running requests (a finished request's slot is refilled from the queue; a new request
starts with its prompt and the first output token, which prefill produced):

1. the model drafter's chain and confidences come from ``ModelDraws`` (declared acceptance model or trace): its
   tokens equal the reference output up to its drawn acceptance length and differ right after it. Its wrong
   tokens are ``ref + 1`` (``wrong_tokens="shift"``), which never echo the history; ``"history"`` makes them
   plausible instead, an adversary for the echo (``calibration/echo.py``): after its right prefix the drafter
   copies what the request's own history says follows it (the lookup on ``history ++ prefix``; ``shift`` where
   that lookup finds nothing or its first token would be right), a drafter that copies the wrong passage;
2. the policy runs the real code (``policies.py``) and picks, per request, a chain and how many of its draft
   tokens to verify;
3. acceptance: the verified prefix that matches the reference output (the target's output is known), so the
   n-gram chain is checked token by token and the model chain accepts exactly its drawn length; the bonus
   token is always produced; a request never produces past the end of its reference output;
4. the accepted tokens and the bonus are appended to the request's token history (``TokenHistory.append``);
5. step cost: ``1 / SPS(B)`` at the verify batch ``B = sum_r (1 + verified_r)`` (NGRAM: ``bs * width``), times
   ``1 + draft_cost_frac`` when the policy runs the model drafter (the n-gram lookup is counted as free).

Prefill is not modelled: its time is not counted and neither is the first output token it produces.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..ngram import NgramConfig, NgramDraft, TokenHistory
from ..selection.sps import SpsTable
from .policies import StepInput


# Set by a report's worker process: called with the number of requests a step finished (its progress bar).
ON_REQUESTS_DONE = None


@dataclass
class PolicyResult:
    """Totals of one policy on one workload at one batch size."""

    policy: str
    batch_size: int
    requests: int = 0
    steps: int = 0
    request_steps: int = 0
    output_tokens: int = 0  # produced by decode steps (the first token of each request is prefill's)
    verify_tokens: int = 0  # sum of B over steps (roots included)
    draft_verified: int = 0
    draft_accepted: int = 0
    ngram_chosen: int = 0
    verify_seconds: float = 0.0  # sum of 1/SPS(B)
    step_seconds: float = 0.0  # including the model drafter's cost
    ngram_drafts: int = 0  # hybrid: request-steps with an n-gram draft (chosen or not)
    ngram_pred: float = 0.0  # sum over them of the calibrated expected accepted length (sum of survivals)
    ngram_obs: int = 0  # sum over them of the accepted length the draft really had (against the reference)
    accepted_hist: list[int] = field(default_factory=list)  # per request-step tokens produced, if recorded
    chains: dict = field(default_factory=dict)  # hybrid: its chain counters (HybridPolicy.counts), as the worker's
    # Per request kind: [request-steps, output tokens, request-seconds] (a request-second is one running request
    # for one second of step time: a kind's requests produce tokens at output tokens / request-seconds each).
    kinds: dict = field(default_factory=dict)

    def kind_summary(self) -> dict:
        """Per kind (only when the workload mixes kinds): tokens per request-step, and each request's own speed
        (tokens per second while it runs, step time shared by the whole batch)."""
        if len(self.kinds) < 2:
            return {}
        return {k: {"accepted_per_step": round(t / max(rs, 1), 4),
                    "tokens_per_second_per_request": round(t / sec, 2) if sec else 0.0}
                for k, (rs, t, sec) in sorted(self.kinds.items())}

    @property
    def accepted_per_step(self) -> float:
        """Tokens produced per request per step, bonus included (SGLang's accept length)."""
        return self.output_tokens / max(self.request_steps, 1)

    @property
    def verified_per_step(self) -> float:
        """Verify tokens per request per step, root included (what a request costs in B)."""
        return self.verify_tokens / max(self.request_steps, 1)

    @property
    def theta(self) -> float:
        """Realised Theta: output tokens per second of target verify time (DSpark's objective)."""
        return self.output_tokens / self.verify_seconds if self.verify_seconds else 0.0

    @property
    def throughput(self) -> float:
        """Modelled output throughput (tokens/s): output tokens / sum of step times (drafting included)."""
        return self.output_tokens / self.step_seconds if self.step_seconds else 0.0

    def summary(self) -> dict:
        return {
            "accepted_per_step": round(self.accepted_per_step, 4),
            "verified_per_step": round(self.verified_per_step, 4),
            "theta": round(self.theta, 2),
            "throughput": round(self.throughput, 2),
            "steps": self.steps,
            "mean_batch": round(self.request_steps / max(self.steps, 1), 2),
            "output_tokens": self.output_tokens,
            "draft_acceptance": round(self.draft_accepted / max(self.draft_verified, 1), 4),
            "ngram_chosen_frac": round(self.ngram_chosen / max(self.request_steps, 1), 4),
            **({"ngram_calibration": {"drafts": self.ngram_drafts,
                                      "predicted_accepted_per_draft": round(self.ngram_pred / self.ngram_drafts, 4),
                                      "actual_accepted_per_draft": round(self.ngram_obs / self.ngram_drafts, 4)}}
               if self.ngram_drafts else {}),
            **({"chains": self.chains} if self.chains else {}),
            **({"by_kind": self.kind_summary()} if len(self.kinds) > 1 else {}),
        }


@dataclass
class Request:
    index: int
    id: str
    prompt: np.ndarray  # int32 token ids
    output: np.ndarray  # int32 reference output ids
    conf: np.ndarray  # [len(output), gamma] float32
    accept_len: np.ndarray  # [len(output)] int64 model-chain acceptance length at each start position
    kind: str = ""  # the workload record's kind ("chat", "code-edit"): figures are also kept per kind


def accepted_len(chain: np.ndarray, ref: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Per row, the leading tokens of ``chain [bs, C]`` that equal the reference ``ref [bs, >= C]``, counting only
    the first ``length [bs]`` (the verified ones)."""
    c = chain.shape[1]
    m = (chain == ref[:, :c]) & (np.arange(c)[None, :] < length[:, None])
    return np.where(m.all(axis=1), c, np.argmin(m, axis=1))


def run_policy(
    policy,
    requests: Sequence[Request],
    batch_size: int,
    sps: SpsTable,
    *,
    gamma: int,
    vocab_size: int,
    draft_cost_frac: float = 0.15,
    lookahead: int = 16,
    progress: bool = False,
    record_hist: bool = False,
    label: str = "",
    measure: str = "all",
    cost=None,
    wrong_tokens: str = "shift",
) -> PolicyResult:
    """Simulate ``policy`` over ``requests`` (in order) with ``batch_size`` slots; see the module docstring.

    ``measure="all"`` replays every request to the end (the batch drains at the tail); ``"steady"`` stops at
    the first step the queue can no longer fill every slot, so every counted step runs a full batch (a
    server under sustained load). ``cost`` prices a step (``cost.py``; default ``1 / sps.lookup(B)``).
    """
    if cost is None:
        from .cost import SpsCost

        cost = SpsCost(sps)
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    if measure not in ("all", "steady"):
        raise ValueError(f"measure: must be 'all' or 'steady', got {measure!r}")
    if measure == "steady" and sum(1 for r in requests if len(r.output) >= 2) <= batch_size:
        raise ValueError(f"measure 'steady' needs more requests than batch_size={batch_size} "
                         f"(got {len(requests)}); use measure 'all' or more requests")
    if draft_cost_frac < 0:
        raise ValueError(f"draft_cost_frac: must be >= 0, got {draft_cost_frac}")
    if wrong_tokens not in WRONG_TOKENS:
        raise ValueError(f"wrong_tokens: choose from {WRONG_TOKENS}, got {wrong_tokens!r}")
    # Reference columns a step can read: the longest chain plus its bonus token (a chain of ``lookahead`` tokens
    # accepted whole commits ``lookahead + 1``).
    look = max(lookahead, gamma) + 1
    width = max(len(r.prompt) + len(r.output) for r in requests) + 1
    width = (width + 63) // 64 * 64
    draft_cols = max(look, 16)
    hist = TokenHistory(batch_size, width, "cpu", backend="torch", max_batch_size=batch_size, max_draft=draft_cols)
    res = PolicyResult(policy.name, batch_size)
    # Every request's reference output (padded with -1), confidences and model acceptance lengths, flattened:
    # a step gathers all running requests' rows at once.
    reqs_list = list(requests)
    pad = np.full(look + 1, -1, dtype=np.int64)
    ref_flat = np.concatenate([np.concatenate([r.output.astype(np.int64), pad]) for r in reqs_list])
    ref_off = np.cumsum([0] + [len(r.output) + look + 1 for r in reqs_list])[:-1]
    conf_flat = np.concatenate([np.asarray(r.conf, dtype=np.float32).reshape(-1, gamma) for r in reqs_list])
    acc_flat = np.concatenate([np.asarray(r.accept_len, dtype=np.int64) for r in reqs_list])
    row_off = np.cumsum([0] + [len(r.output) for r in reqs_list])[:-1]
    out_len = np.array([len(r.output) for r in reqs_list], dtype=np.int64)
    prompt_len = np.array([len(r.prompt) for r in reqs_list], dtype=np.int64)
    req_index = np.array([r.index for r in reqs_list], dtype=np.int64)
    kind_names = sorted({r.kind for r in reqs_list})
    req_kind = np.array([kind_names.index(r.kind) for r in reqs_list], dtype=np.int64)
    kind_acc = np.zeros((len(kind_names), 3), dtype=np.float64)  # request-steps, output tokens, request-seconds
    queue = deque(i for i, r in enumerate(reqs_list) if len(r.output) >= 2)
    res.requests = len(queue)
    slot_req = np.full(batch_size, -1, dtype=np.int64)  # position in reqs_list of each slot's request
    slot_pos = np.zeros(batch_size, dtype=np.int64)  # its output position
    bar = _bar(len(queue), progress, label or policy.name)
    clairvoyant = bool(getattr(policy, "clairvoyant", False))  # sees the reference (oracle.py), a yardstick only
    col = np.arange(gamma)
    ar_look = np.arange(look)
    if wrong_tokens == "history":  # the adversary's lookup after the model's right prefix
        hist.reserve_after(gamma)
        wcfg = NgramConfig(max_draft=gamma)
        wout = NgramDraft.zeros(batch_size, gamma, "cpu")
    while queue or (slot_req >= 0).any():
        free = np.flatnonzero(slot_req < 0)[: len(queue)]  # the lowest free slots, in order
        if len(free):
            new_reqs = [queue.popleft() for _ in range(len(free))]
            slot_req[free] = new_reqs
            slot_pos[free] = 1
            _prefill(hist, [(int(sl), reqs_list[i]) for sl, i in zip(free, new_reqs)])
            if hasattr(policy, "on_prefill"):
                policy.on_prefill(torch.from_numpy(free))
        order = np.flatnonzero(slot_req >= 0)
        bs = len(order)
        if measure == "steady" and bs < batch_size:
            break
        slots = torch.from_numpy(order)
        ri, pos = slot_req[order], slot_pos[order]
        ref = ref_flat[(ref_off[ri] + pos)[:, None] + ar_look[None, :]]  # [bs, look], -1 past the end
        row = row_off[ri] + pos
        acc_m = acc_flat[row]
        conf = conf_flat[row]
        wrong = np.where(ref[:, :gamma] < 0, 0, (ref[:, :gamma] + 1) % vocab_size)
        if wrong_tokens == "history":
            wrong = _history_wrong(hist, slots, ref[:, :gamma], acc_m, wrong, wcfg, wout)
        model_tok = np.where(col[None, :] < acc_m[:, None], ref[:, :gamma], wrong)
        inp = StepInput(slots, req_index[ri], torch.from_numpy(model_tok.astype(np.int32)),
                        torch.from_numpy(np.ascontiguousarray(conf, dtype=np.float32)),
                        torch.tensor(float(prompt_len[ri].sum() + pos.sum())),
                        reference=ref if clairvoyant else None,
                        tenant=torch.from_numpy(req_kind[ri].astype(np.int32)))
        out = policy.step(inp, hist)
        vl = out.verify_len.numpy().astype(np.int64)
        chain = out.tokens.numpy().astype(np.int64)
        c = chain.shape[1]
        if c + 1 > look:
            raise ValueError(f"policy chain width {c} exceeds the simulator lookahead {look - 1}")
        accepted = accepted_len(chain, ref, vl)
        if out.second_len is not None:  # two-branch verify: the longer accepted branch is kept
            vl2 = out.second_len.numpy().astype(np.int64)
            accepted = np.maximum(accepted, accepted_len(out.second_tokens.numpy().astype(np.int64), ref, vl2))
            vl = vl + vl2
        remaining = out_len[ri] - pos
        produced = np.minimum(accepted + 1, remaining)
        new = np.where(ar_look[None, :] < produced[:, None], ref, 0).astype(np.int32)
        hist.append(slots, torch.from_numpy(new), torch.from_numpy(produced.astype(np.int32)))
        if hasattr(policy, "record"):
            policy.record(inp, out, torch.from_numpy(new), torch.from_numpy(produced))
        t = cost.seconds(out.batch_tokens, bs, int(prompt_len[ri].sum() + pos.sum()))
        res.steps += 1
        res.request_steps += bs
        res.output_tokens += int(produced.sum())
        res.verify_tokens += out.batch_tokens
        res.draft_verified += int(vl.sum())
        res.draft_accepted += int(np.minimum(accepted, vl).sum())
        res.ngram_chosen += int(out.ngram_chosen.sum())
        res.verify_seconds += t
        step_t = t * (1.0 + (draft_cost_frac if policy.uses_model else 0.0))
        res.step_seconds += step_t
        kr = req_kind[ri]
        np.add.at(kind_acc[:, 0], kr, 1.0)
        np.add.at(kind_acc[:, 1], kr, produced.astype(np.float64))
        np.add.at(kind_acc[:, 2], kr, step_t)
        if out.ngram_tokens is not None:
            nl = out.ngram_len.numpy().astype(np.int64)
            nt = out.ngram_tokens.numpy().astype(np.int64)
            L = nt.shape[1]
            res.ngram_drafts += int((nl > 0).sum())
            res.ngram_obs += int(accepted_len(nt, ref, nl).sum())
            res.ngram_pred += float((out.ngram_surv.numpy() * (np.arange(L)[None, :] < nl[:, None])).sum())
        if record_hist:
            res.accepted_hist.extend(int(x) for x in produced)
        new_pos = pos + produced
        slot_pos[order] = new_pos
        done = order[new_pos >= out_len[ri]]
        if len(done):
            hist.reset(torch.from_numpy(done))
            slot_req[done] = -1
            if bar is not None:
                bar.update(len(done))
            if ON_REQUESTS_DONE is not None:
                ON_REQUESTS_DONE(len(done))
    if bar is not None:
        bar.close()
    if hasattr(policy, "counts"):
        res.chains = policy.counts()
    res.kinds = {k: [int(kind_acc[i, 0]), int(kind_acc[i, 1]), float(kind_acc[i, 2])] for i, k in enumerate(kind_names)}
    return res


WRONG_TOKENS = ("shift", "history")


def _history_wrong(hist: TokenHistory, slots: torch.Tensor, ref: np.ndarray, acc: np.ndarray, shift: np.ndarray,
                   cfg: NgramConfig, out: NgramDraft) -> np.ndarray:
    """``wrong_tokens="history"``: per row, the wrong tokens from column ``acc`` on are what the history says
    follows ``history ++ ref[:acc]`` (its lookup's draft), where that draft exists and its first token is not the
    reference's; ``shift`` elsewhere (and past the draft)."""
    bs, g = ref.shape
    a = np.minimum(acc, g)
    prefix = torch.from_numpy(np.where(ref < 0, 0, ref).astype(np.int32))
    o = out.rows(bs)
    hist.run_after(slots, prefix, lambda: hist.lookup(slots, cfg, o), counts=torch.from_numpy(a.astype(np.int32)))
    d, dl = o.tokens.numpy().astype(np.int64), o.length.numpy().astype(np.int64)
    j = np.arange(g)[None, :] - a[:, None]  # the draft's column for each chain column (negative before acc)
    jc = np.clip(j, 0, g - 1)
    cand = np.take_along_axis(d, jc, axis=1)
    rows = np.arange(bs)
    first_right = (a < g) & (dl > 0) & (d[:, 0] == ref[rows, np.minimum(a, g - 1)])
    use = (j >= 0) & (j < dl[:, None]) & ~first_right[:, None]
    return np.where(use, cand, shift)


def _prefill(hist: TokenHistory, admitted: list[tuple[int, Request]]) -> None:
    """Write each new request's prompt and its first output token (prefill's) into its history row."""
    slots = torch.tensor([s for s, _ in admitted], dtype=torch.int64)
    plen = max(len(r.prompt) for _, r in admitted)
    prompt = np.zeros((len(admitted), max(plen, 1)), dtype=np.int32)
    for i, (_, r) in enumerate(admitted):
        prompt[i, : len(r.prompt)] = r.prompt
    hist.write_prompt(slots, torch.from_numpy(prompt),
                      torch.tensor([len(r.prompt) for _, r in admitted], dtype=torch.int32))
    first = torch.tensor([[int(r.output[0])] for _, r in admitted], dtype=torch.int32)
    hist.append(slots, first, torch.ones(len(admitted), dtype=torch.int32))


def _bar(total: int, enabled: bool, label: str):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="req", file=sys.stderr, leave=False, dynamic_ncols=True)
