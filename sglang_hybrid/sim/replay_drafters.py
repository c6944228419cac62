"""``hybrid-spark replay-drafters``: replay the model-free drafters on a workload, the peers' protocol.

Protocol (as ``../shared/peers/suffix-decoding``): requests in file order, one at a time; the history starts
as the prompt; each step the drafter proposes up to K tokens, the accepted count is the longest prefix equal
to the reference output, the request advances by accepted + 1 (the bonus token; capped at the end of the
output) and those tokens are appended to the history (and inserted into the corpus, which so learns from
earlier requests' outputs and from the running one's). Reported per drafter and K: output tokens per step,
proposed tokens per step, accepted per step and the share of steps with at least one accepted token.

Drafters (the project's own code on CPU, torch backends; no SGLang import):
  ngram     the per-request n-gram drafter (``TokenHistory.lookup``, n 2-8, window 0, max_draft K);
  corpus    the cross-request corpus alone (``NgramCorpus.lookup``; draft length set by its confidence);
  combined  both candidates, each priced by its online-calibrated survival (``calibration/candidate_online.py``:
            priors from the shipped n-gram table and from the corpus's own q, corrected by the verify
            outcomes seen so far), each cut where the survival falls below ``min_survival`` (the price of a
            verified token), and per step the one with the higher expected accepted length proposed. This is
            the choice the worker makes between the two sources.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from ..ngram import NgramConfig, TokenHistory
from ..ngram.corpus import CorpusConfig, NgramCorpus

__all__ = ["load_workload", "replay", "DRAFTERS", "main"]

DRAFTERS = ("ngram", "corpus", "combined")


def load_workload(path: str, limit: int = 0) -> list[tuple[list[int], list[int]]]:
    """``[(prompt_ids, output_ids)]`` in file order, records with an empty output dropped.

    A line is either a workload record (``prompt`` / ``output`` text, tokenized with the shipped tokenizer,
    no special tokens) or already tokenized (``prompt_ids`` / ``output_ids``).
    """
    recs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                obj = json.loads(line)
                if not isinstance(obj, dict) or not (("prompt_ids" in obj and "output_ids" in obj)
                                                     or ("prompt" in obj and "output" in obj)):
                    raise ValueError(f"{path}:{n}: expected prompt/output or prompt_ids/output_ids fields")
                recs.append(obj)
            if limit and len(recs) >= limit:
                break
    texts = [r for r in recs if "prompt_ids" not in r]
    if texts:
        from ..tokenizer import load_tokenizer

        tok = load_tokenizer()
        ps = tok.encode_batch([r["prompt"] for r in texts], add_special_tokens=False)
        os_ = tok.encode_batch([r["output"] for r in texts], add_special_tokens=False)
        for r, p, o in zip(texts, ps, os_):
            r["prompt_ids"], r["output_ids"] = p.ids, o.ids
    return [(list(r["prompt_ids"]), list(r["output_ids"])) for r in recs if len(r["output_ids"]) >= 1]


@dataclass
class _Tally:
    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    hit: int = 0
    out: int = 0
    from_corpus: int = 0
    per_request_steps: list = field(default_factory=list)


class _Replayer:
    """One drafter over one workload at one K; a single history slot reused request after request."""

    def __init__(self, drafter: str, K: int, width: int, corpus_cfg: CorpusConfig,
                 min_survival: float = 0.2, combined_n_max: int = 8) -> None:
        if drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {DRAFTERS}, got {drafter!r}")
        self.drafter, self.K = drafter, K
        self.hist = TokenHistory(1, width, "cpu", backend="torch", max_batch_size=1, max_draft=K)
        n_max = combined_n_max if drafter == "combined" else 8
        self.cfg = NgramConfig(n_min=2, n_max=n_max, max_draft=K, window=0)
        self.slot = torch.zeros(1, dtype=torch.int64)
        self.tenant = torch.zeros(1, dtype=torch.int32)  # = request index with isolation "tenant"
        self.new = torch.zeros((1, K + 1), dtype=torch.int32)
        self.cnt = torch.zeros(1, dtype=torch.int32)
        self.corpus = None
        if drafter != "ngram":
            self.corpus = NgramCorpus(corpus_cfg, "cpu", backend="torch", max_batch_size=1, max_draft=K)
        self.cal = None
        if drafter == "combined":
            from ..calibration import CalibrationTable

            from ..calibration.candidate_online import OnlineCalibration

            self.cal = CalibrationTable.load_default().to_device("cpu")
            self.online = OnlineCalibration(K, "cpu")
            self.prior = [torch.zeros((1, K), dtype=torch.float32) for _ in range(2)]
            self.q = [torch.zeros((1, K), dtype=torch.float32) for _ in range(2)]
            self.surv = [torch.zeros((1, K), dtype=torch.float32) for _ in range(2)]
            self._scratch = torch.zeros((1, K), dtype=torch.float32)
        self.min_survival = min_survival
        self._cands: tuple = ()

    def _propose(self) -> tuple[list[int], bool]:
        """(draft tokens, from the corpus?)."""
        ng = cp = None
        if self.drafter in ("ngram", "combined"):
            ng = self.hist.lookup(self.slot, self.cfg)
        if self.corpus is not None:
            cp = self.corpus.lookup(self.hist, self.slot, self.tenant)
        if self.drafter == "ngram":
            return ng.tokens[0, : int(ng.length[0])].tolist(), False
        if self.drafter == "corpus":
            return cp.tokens[0, : int(cp.length[0])].tolist(), True
        # Both candidates priced by their online-calibrated survival; each is cut where the survival falls
        # below min_survival (the price of a verified token), and the one with more expected tokens wins.
        self.cal.apply(ng, None, self.prior[0], self._scratch)
        self.prior[1].copy_(cp.q.float() / 65536.0)
        best, pick = 0.0, None
        for src, d in enumerate((ng, cp)):
            self.online.estimate(src, d.length, d.match_len, d.match_count, self.prior[src], self.q[src],
                                 self.surv[src])
            sv = self.surv[src][0]
            keep = int((sv >= self.min_survival).sum())
            e = float(sv[:keep].sum())
            if keep and e > best:
                best, pick = e, (d.tokens[0, :keep].tolist(), src == 1)
        self._cands = (ng, cp)
        return pick if pick is not None else ([], False)

    def _learn(self) -> None:
        """Shadow-verify both candidates against the produced tokens (combined drafter only)."""
        for src, d in enumerate(self._cands):
            self.online.update(src, d.tokens, d.length, d.match_len, d.match_count, self.prior[src], self.new,
                               self.cnt)

    def run(self, recs: Sequence[tuple[list[int], list[int]]]) -> _Tally:
        t = _Tally()
        for rid, (prompt, out) in enumerate(recs):
            self.tenant[0] = rid
            p = torch.tensor([prompt], dtype=torch.int32) if prompt else torch.zeros((1, 1), dtype=torch.int32)
            self.hist.write_prompt(self.slot, p, torch.tensor([len(prompt)], dtype=torch.int32))
            if self.corpus is not None and self.corpus.cfg.insert_prompts and prompt:
                self.corpus.insert_prompt(self.hist, self.slot, torch.tensor([len(prompt)], dtype=torch.int32),
                                          self.tenant)
            pos, steps, olen = 0, 0, len(out)
            while pos < olen:
                draft, from_corpus = self._propose()
                acc = 0
                while acc < len(draft) and pos + acc < olen and draft[acc] == out[pos + acc]:
                    acc += 1
                produced = min(acc + 1, olen - pos)
                self.new[0, :produced] = torch.tensor(out[pos: pos + produced], dtype=torch.int32)
                self.cnt[0] = produced
                self.hist.append(self.slot, self.new, self.cnt)
                if self.drafter == "combined":
                    self._learn()
                if self.corpus is not None:
                    self.corpus.insert(self.hist, self.slot, self.cnt, self.tenant)
                steps += 1
                t.proposed += len(draft)
                t.accepted += acc
                t.hit += acc >= 1
                t.from_corpus += from_corpus and len(draft) > 0
                pos += produced
            t.steps += steps
            t.out += olen
            t.per_request_steps.append(steps)
        return t


def replay(recs: Sequence[tuple[list[int], list[int]]], drafter: str, K: int,
           corpus_cfg: Optional[CorpusConfig] = None, min_survival: float = 0.2, combined_n_max: int = 8) -> dict:
    """Replay one drafter at one K; returns the figures (plus ``per_request_steps``)."""
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    corpus_cfg = corpus_cfg or CorpusConfig(entries=1 << 20)
    width = max(len(p) + len(o) for p, o in recs) + 1
    width = (width + 63) // 64 * 64
    t0 = time.time()
    t = _Replayer(drafter, K, width, corpus_cfg, min_survival, combined_n_max).run(recs)
    S = max(t.steps, 1)
    res = {"drafter": drafter, "K": K, "requests": len(recs), "output_tokens": t.out, "steps": t.steps,
           "tokens_per_step": t.out / S, "proposed_per_step": t.proposed / S, "accepted_per_step": t.accepted / S,
           "frac_steps_accepted": t.hit / S, "seconds": round(time.time() - t0, 1),
           "per_request_steps": t.per_request_steps}
    if drafter == "combined":
        res["corpus_share_of_drafts"] = t.from_corpus / S
    return res


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hybrid-spark replay-drafters", description=__doc__.split("\n")[0])
    p.add_argument("--workload", required=True, action="append", help="workload JSONL (repeatable)")
    p.add_argument("--k", default="8,16", help="draft budgets K, comma-separated (default 8,16)")
    p.add_argument("--drafters", default=",".join(DRAFTERS), help=f"subset of {','.join(DRAFTERS)}")
    p.add_argument("--limit", type=int, default=0, help="replay only the first N records (0 = all)")
    p.add_argument("--json", action="store_true", help="print one JSON object per line")
    p.add_argument("--per-request", action="store_true", help="include per-request step counts in --json")
    p.add_argument("--corpus-entries", type=int, default=1 << 20, help="corpus table entries (power of two)")
    p.add_argument("--corpus-tau", type=float, default=CorpusConfig.tau, help="corpus survival threshold")
    p.add_argument("--corpus-n-max", type=int, default=CorpusConfig.n_max)
    p.add_argument("--corpus-prompts", action="store_true", help="also insert prompts into the corpus")
    p.add_argument("--corpus-isolation", default="shared", choices=("shared", "tenant"),
                   help="shared: one corpus for all requests; tenant: every request is its own tenant (the "
                        "corpus then only holds the request's own tokens)")
    p.add_argument("--min-survival", type=float, default=0.2,
                   help="combined: cut a candidate where its calibrated survival falls below this (the price)")
    p.add_argument("--combined-n-max", type=int, default=8,
                   help="combined: longest suffix the per-request n-gram compares (the ngram drafter keeps 8)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        ks = [int(x) for x in args.k.split(",") if x.strip()]
    except ValueError:
        print(f"replay-drafters: --k must be comma-separated ints, got {args.k!r}", file=sys.stderr)
        return 2
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    bad = [d for d in drafters if d not in DRAFTERS] + [str(k) for k in ks if k < 1]
    if bad or not ks or not drafters:
        print(f"replay-drafters: bad --drafters/--k value(s) {bad}; drafters are {DRAFTERS}, K >= 1",
              file=sys.stderr)
        return 2
    cfg = CorpusConfig(entries=args.corpus_entries, tau=args.corpus_tau, n_max=args.corpus_n_max,
                       insert_prompts=args.corpus_prompts, isolation=args.corpus_isolation)
    try:
        cfg.validate()
    except (TypeError, ValueError) as e:
        print(f"replay-drafters: {e} (from --corpus-* options)", file=sys.stderr)
        return 2
    if not 0.0 < args.min_survival <= 1.0:
        print(f"replay-drafters: --min-survival must be in (0, 1], got {args.min_survival}", file=sys.stderr)
        return 2
    if not args.json:
        print("| workload | K | drafter | tokens/step | proposed/step | steps with >= 1 accepted |")
        print("|---|---:|---|---:|---:|---:|")
    for path in args.workload:
        recs = load_workload(path, args.limit)
        for K in ks:
            for d in drafters:
                res = replay(recs, d, K, cfg, args.min_survival, args.combined_n_max)
                res["workload"] = path
                if args.json:
                    if not args.per_request:
                        res.pop("per_request_steps")
                    print(json.dumps(res), flush=True)
                else:
                    print(f"| {path} | {K} | {d} | {res['tokens_per_step']:.3f} | {res['proposed_per_step']:.3f} "
                          f"| {res['frac_steps_accepted']:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
