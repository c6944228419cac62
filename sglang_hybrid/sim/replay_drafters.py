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
  combined  up to three candidates: the per-request n-gram (recency, suffixes up to ``n_max`` 32), the shared
            corpus (frequency, earlier requests' outputs and the running one's) and, with ``local`` (default),
            a per-request corpus (frequency over the request's own prompt and output, every order down to 1:
            SuffixDecoding's per-request tree; cleared at every request). Each is priced by its
            online-calibrated survival (``calibration/candidate_online.py``: priors from the shipped n-gram
            table and from the corpora's own q, the shared corpus's through its fitted table
            (``corpus_calibration``, the step's default), corrected by the verify outcomes seen so far: per
            cell of the traffic, then by the running request's own odds ratio, ``request_strength``, as the
            worker's per-request record) and cut where the survival falls below the
            price of a proposed token: the larger of ``min_survival`` (0.1 = SuffixDecoding's
            ``min_token_prob``) and ``price_share`` times the square (``price_power``) of what a proposed token
            earns (accepted / proposed: the running request's, starting from the traffic's over its last
            ``price_memory`` steps, ``TrafficPrice``); the per-request n-gram, which copies a whole continuation
            after one suffix match, is also cut at ``cap_by_match`` times its match length (SuffixDecoding's
            ``max_spec_factor``; the corpora's walks re-check their evidence at every drafted token, so
            ``cap_sources="ngram"`` leaves them uncapped).
            Per step the candidate with the higher expected accepted length is proposed.

The combination is the worker's choice between sources, with the peer's proposal rules and a traffic price in
place of the SPS price (which has no meaning without a batch): the worker prices chains against the model chain
and the batch instead. The traffic price is the replay's stand-in for that opportunity cost: a verify slot
spent on a long shot could have held a token of the usual acceptance (on a code edit, ~0.85; on chat, ~0.23,
where the floor ``min_survival`` rules). It follows the request, so chat requests in mixed traffic keep the
floor while the code edits beside them are priced higher.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import torch

from ..calibration.candidates import STEP_CORPUS_TAU
from ..ngram import NgramConfig, TokenHistory
from ..ngram.corpus import CorpusConfig, NgramCorpus

__all__ = ["load_workload", "replay", "CombinedOptions", "TrafficPrice", "DRAFTERS", "main"]

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


@dataclass(frozen=True)
class CombinedOptions:
    """Settings of the ``combined`` drafter (see the module docstring)."""

    min_survival: float = 0.1
    n_max: int = 32
    local: bool = True
    cap_by_match: float = 1.0
    cap_sources: str = "ngram"  # "ngram" (the per-request n-gram only) or "all"
    corpus_tau: float = STEP_CORPUS_TAU  # the corpora's kernel-side cut, the step's; the calibrated price cuts after it
    corpus_calibration: str = "default"  # the shared corpus's fitted table before the online stage, as the step's
    price_share: float = 0.51  # the price is at least this share of (accepted / proposed) ** power (0 = off)
    price_power: float = 2.0  # 1: linear in the rate (the default to session 23, with share 0.35)
    price_memory: int = 8192  # steps the traffic's rate is averaged over (exponential memory)
    price_prior: float = 8.0  # a new request starts from the traffic's rate, weighted as this many proposed tokens
    request_strength: float = 2.0  # the per-request odds-ratio layer's prior strength (0 = off), as the worker's

    def validate(self) -> None:
        if not 0.0 < self.min_survival <= 1.0:
            raise ValueError(f"--min-survival must be in (0, 1], got {self.min_survival}")
        if not 2 <= self.n_max <= 32:
            raise ValueError(f"--combined-n-max must be in [2, 32], got {self.n_max}")
        if self.cap_by_match < 0:
            raise ValueError(f"--cap-by-match must be >= 0 (0 = no cap), got {self.cap_by_match}")
        if self.cap_sources not in ("ngram", "all"):
            raise ValueError(f"--cap-sources must be 'ngram' or 'all', got {self.cap_sources!r}")
        if not 0.0 < self.corpus_tau <= 1.0:
            raise ValueError(f"--corpus-tau must be in (0, 1], got {self.corpus_tau}")
        if not 0.0 <= self.price_share <= 1.0:
            raise ValueError(f"--price-share must be in [0, 1], got {self.price_share}")
        if not 0.0 < self.price_power <= 8.0:
            raise ValueError(f"--price-power must be in (0, 8], got {self.price_power}")
        if self.price_memory < 1:
            raise ValueError(f"--price-memory must be >= 1, got {self.price_memory}")
        if self.price_prior < 0:
            raise ValueError(f"--price-prior must be >= 0, got {self.price_prior}")
        if self.request_strength < 0:
            raise ValueError(f"--request-strength must be >= 0 (0 = off), got {self.request_strength}")


class TrafficPrice:
    """The price of a proposed token: ``max(floor, share * r ** power)``, ``r`` the running request's accepted /
    proposed tokens, with the traffic's rate (exponentially averaged over its last ``memory`` steps) counted as
    ``prior`` proposed tokens of evidence: ``r = (a_req + prior * A / P) / (p_req + prior)``. A new request
    starts at the traffic's rate and moves to its own. With nothing proposed yet, the floor.

    ``power`` 2 (the replay's default since session 24) makes the price convex in the rate: a request whose
    drafts mostly hold (a code edit, r ~ 0.9) pays more per proposed token than the linear rule charged, and
    one whose drafts mostly fail (chat, r ~ 0.25) less, so the floor rules it."""

    def __init__(self, floor: float, share: float, memory: int, prior: float, power: float = 1.0) -> None:
        self.floor, self.share, self.decay, self.prior = floor, share, 1.0 - 1.0 / memory, prior
        self.power = power
        self.accepted = self.proposed = 0.0  # the traffic's, decayed
        self.req_accepted = self.req_proposed = 0  # the running request's

    def price(self) -> float:
        w = self.prior if self.proposed > 0 else 0.0  # no traffic rate yet: the request's own evidence alone
        den = self.req_proposed + w
        if self.share <= 0 or den <= 0:
            return self.floor
        r = (self.req_accepted + (w * self.accepted / self.proposed if w else 0.0)) / den
        return max(self.floor, self.share * r ** self.power)

    def update(self, accepted: int, proposed: int) -> None:
        self.accepted = self.accepted * self.decay + accepted
        self.proposed = self.proposed * self.decay + proposed
        self.req_accepted += accepted
        self.req_proposed += proposed

    def new_request(self) -> None:
        self.req_accepted = self.req_proposed = 0


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
                 opts: CombinedOptions = CombinedOptions(), corpus_table=None) -> None:
        if drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {DRAFTERS}, got {drafter!r}")
        self.drafter, self.K, self.opts = drafter, K, opts
        self.hist = TokenHistory(1, width, "cpu", backend="torch", max_batch_size=1, max_draft=K)
        n_max = opts.n_max if drafter == "combined" else 8
        self.cfg = NgramConfig(n_min=2, n_max=n_max, max_draft=K, window=0)
        self.slot = torch.zeros(1, dtype=torch.int64)
        self.tenant = torch.zeros(1, dtype=torch.int32)  # = request index with isolation "tenant"
        self.new = torch.zeros((1, K + 1), dtype=torch.int32)
        self.cnt = torch.zeros(1, dtype=torch.int32)
        self.corpus = self.local = None
        if drafter == "combined":
            corpus_cfg = replace(corpus_cfg, tau=opts.corpus_tau)
        if drafter != "ngram":
            self.corpus = NgramCorpus(corpus_cfg, "cpu", backend="torch", max_batch_size=1, max_draft=K)
        if drafter == "combined" and opts.local:
            # Its own table, cleared at every request (a deployment would key it by a per-request tenant in the
            # shared one); prompts in. Sized for the longest request, every order of every token, at most half
            # full: never cleared, a fixed 2^18 entries filled up with earlier requests' text (99% on the
            # mixed streams) and crowded out the running request's own.
            lcfg = replace(corpus_cfg, isolation="tenant", insert_prompts=True,
                           entries=max(1 << 12, 1 << (2 * corpus_cfg.n_max * width - 1).bit_length()))
            self.local = NgramCorpus(lcfg, "cpu", backend="torch", max_batch_size=1, max_draft=K)
        self.cal = self.req_cal = None
        if drafter == "combined":
            from ..calibration import CalibrationTable

            from ..calibration.candidate_online import OnlineCalibration

            self.cal = CalibrationTable.load_default().to_device("cpu")
            ns = 3 if self.local is not None else 2
            self.online = OnlineCalibration(K, "cpu", sources=ns)
            if opts.request_strength > 0:
                from ..calibration.candidate_online import RequestOddsRatio

                self.req_cal = RequestOddsRatio(ns, 1, K, "cpu", strength=opts.request_strength)
            self.prior = [torch.zeros((1, K), dtype=torch.float32) for _ in range(ns)]
            self.q = [torch.zeros((1, K), dtype=torch.float32) for _ in range(ns)]
            self.surv = [torch.zeros((1, K), dtype=torch.float32) for _ in range(ns)]
            self._scratch = torch.zeros((1, K), dtype=torch.float32)
            from ..calibration.corpus_table import load_corpus_table

            fitted = corpus_table if corpus_table is not None else load_corpus_table(opts.corpus_calibration)
            if fitted is not None:
                fitted.check_corpus(corpus_cfg)
            self.ctable = None if fitted is None else fitted.to_device(1, K, "cpu")
        self._cands: tuple = ()
        self.price = TrafficPrice(opts.min_survival, opts.price_share, opts.price_memory, opts.price_prior,
                                  opts.price_power)

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
        # Every candidate priced by its online-calibrated survival; each is cut where the survival falls
        # below the price of a proposed token and, where capped, at cap_by_match times its match length; the
        # one with more expected tokens wins (ties: the earlier source).
        o = self.opts
        price = self.price.price()
        cands = [ng, cp]
        if self.local is not None:
            cands.append(self.local.lookup(self.hist, self.slot, self.tenant))
        self.cal.apply(ng, None, self.prior[0], self._scratch)
        for src in range(1, len(cands)):  # the corpora: their own q is the prior
            self.prior[src].copy_(cands[src].q.float() / 65536.0)
            if src == 1 and self.ctable is not None:  # the shared corpus (the table's own kind)
                self.ctable.apply(cands[src].match_len, cands[src].match_count, self.prior[src])
        best, pick = 0.0, None
        for src, d in enumerate(cands):
            self.online.estimate(src, d.length, d.match_len, d.match_count, self.prior[src], self.q[src],
                                 self.surv[src])
            if self.req_cal is not None:  # the request's own odds ratio on top of the traffic's cells
                self.req_cal.apply(src, self.q[src], self._scratch, self.surv[src])
            sv = self.surv[src][0]
            keep = int((sv >= price).sum())  # survivals fall along the draft: a prefix
            if o.cap_by_match > 0 and (src == 0 or o.cap_sources == "all"):
                keep = min(keep, int(o.cap_by_match * int(d.match_len[0]) + 1e-6))
            e = float(sv[:keep].sum())
            if keep and e > best:
                best, pick = e, (d.tokens[0, :keep].tolist(), src >= 1)
        self._cands = tuple(cands)
        return pick if pick is not None else ([], False)

    def _learn(self) -> None:
        """Shadow-verify both candidates against the produced tokens (combined drafter only)."""
        for src, d in enumerate(self._cands):
            self.online.update(src, d.tokens, d.length, d.match_len, d.match_count, self.prior[src], self.new,
                               self.cnt)
            if self.req_cal is not None:
                self.req_cal.update(src, d.tokens, d.length, self.q[src], self.new, self.cnt)

    def run(self, recs: Sequence[tuple[list[int], list[int]]]) -> _Tally:
        t = _Tally()
        for rid, (prompt, out) in enumerate(recs):
            self.tenant[0] = rid
            self.price.new_request()
            if self.req_cal is not None:
                self.req_cal.reset(self.slot)
            p = torch.tensor([prompt], dtype=torch.int32) if prompt else torch.zeros((1, 1), dtype=torch.int32)
            self.hist.write_prompt(self.slot, p, torch.tensor([len(prompt)], dtype=torch.int32))
            plen = torch.tensor([len(prompt)], dtype=torch.int32)
            if self.local is not None:
                self.local.reset()  # the request's own text only
            for c in (self.corpus, self.local):
                if c is not None and c.cfg.insert_prompts and prompt:
                    c.insert_prompt(self.hist, self.slot, plen, self.tenant)
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
                if self.local is not None:
                    self.local.insert(self.hist, self.slot, self.cnt, self.tenant)
                steps += 1
                t.proposed += len(draft)
                self.price.update(acc, len(draft))
                t.accepted += acc
                t.hit += acc >= 1
                t.from_corpus += from_corpus and len(draft) > 0
                pos += produced
            t.steps += steps
            t.out += olen
            t.per_request_steps.append(steps)
        return t


def replay(recs: Sequence[tuple[list[int], list[int]]], drafter: str, K: int,
           corpus_cfg: Optional[CorpusConfig] = None, opts: CombinedOptions = CombinedOptions(),
           corpus_table=None) -> dict:
    """Replay one drafter at one K; returns the figures (plus ``per_request_steps``). ``corpus_cfg`` is the
    shared corpus's (the ``combined`` drafter takes its ``tau`` from ``opts``). ``corpus_table``: the
    ``CorpusTable`` named by ``opts.corpus_calibration``, already loaded (else it is loaded here)."""
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    opts.validate()
    corpus_cfg = corpus_cfg or CorpusConfig()  # the step's default size (2^21 entries)
    width = max(len(p) + len(o) for p, o in recs) + 1
    width = (width + 63) // 64 * 64
    t0 = time.time()
    t = _Replayer(drafter, K, width, corpus_cfg, opts, corpus_table).run(recs)
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
    p.add_argument("--corpus-entries", type=int, default=CorpusConfig.entries,
                   help="corpus table entries (power of two; default the step's)")
    p.add_argument("--corpus-n-max", type=int, default=CorpusConfig.n_max)
    p.add_argument("--corpus-prompts", action="store_true", help="also insert prompts into the corpus")
    p.add_argument("--corpus-isolation", default="shared", choices=("shared", "tenant"),
                   help="shared: one corpus for all requests; tenant: every request is its own tenant (the "
                        "corpus then only holds the request's own tokens)")
    d = CombinedOptions()
    p.add_argument("--corpus-tau", type=float, default=None,
                   help=f"corpus survival threshold (default: {CorpusConfig.tau} for the corpus drafter, "
                        f"{d.corpus_tau} inside combined, whose calibrated price cuts after it)")
    p.add_argument("--corpus-calibration", default=d.corpus_calibration, metavar="default|none|FILE",
                   help="combined: the shared corpus's fitted table (hybrid-spark calibrate --candidate corpus) "
                        "applied before the online calibration; default: the shipped table, as the step's "
                        "(none = the corpus's own q)")
    p.add_argument("--min-survival", type=float, default=d.min_survival,
                   help="combined: cut a candidate where its calibrated survival falls below this (the price's "
                        "floor)")
    p.add_argument("--combined-n-max", type=int, default=d.n_max,
                   help="combined: longest suffix the per-request n-gram compares (the ngram drafter keeps 8)")
    p.add_argument("--price-share", type=float, default=d.price_share,
                   help="combined: the price is at least this share of the request's accepted / proposed tokens "
                        "to the --price-power (from the traffic's rate at its start; 0 = the floor "
                        "--min-survival alone)")
    p.add_argument("--price-memory", type=int, default=d.price_memory,
                   help="combined: steps the traffic's rate (a new request's starting point) is averaged over")
    p.add_argument("--price-prior", type=float, default=d.price_prior,
                   help="combined: a new request's price starts from the traffic's rate, weighted as this many "
                        "proposed tokens of its own")
    p.add_argument("--price-power", type=float, default=d.price_power,
                   help="combined: the price is share * rate ** power (1: linear in the rate, the old rule; "
                        "2: convex, code edits priced higher and chat lower)")
    p.add_argument("--local-corpus", action=argparse.BooleanOptionalAction, default=d.local,
                   help="combined: a per-request corpus (the request's own prompt and output, by frequency)")
    p.add_argument("--cap-by-match", type=float, default=d.cap_by_match,
                   help="combined: a capped candidate drafts at most this times its match length (0 = no cap)")
    p.add_argument("--cap-sources", default=d.cap_sources, choices=("ngram", "all"),
                   help="combined: which candidates the cap applies to")
    p.add_argument("--request-strength", type=float, default=d.request_strength,
                   help="combined: prior strength of each request's own odds-ratio correction on top of the "
                        "traffic's calibration cells, per source (0 = off)")
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
    tau = CorpusConfig.tau if args.corpus_tau is None else args.corpus_tau
    cfg = CorpusConfig(entries=args.corpus_entries, tau=tau, n_max=args.corpus_n_max,
                       insert_prompts=args.corpus_prompts, isolation=args.corpus_isolation)
    opts = CombinedOptions(min_survival=args.min_survival, n_max=args.combined_n_max, local=args.local_corpus,
                           cap_by_match=args.cap_by_match, cap_sources=args.cap_sources,
                           price_share=args.price_share, price_memory=args.price_memory,
                           price_prior=args.price_prior, request_strength=args.request_strength,
                           price_power=args.price_power,
                           corpus_calibration=args.corpus_calibration,
                           corpus_tau=CombinedOptions.corpus_tau if args.corpus_tau is None else args.corpus_tau)
    try:
        cfg.validate()
    except (TypeError, ValueError) as e:
        print(f"replay-drafters: {e} (from --corpus-* options)", file=sys.stderr)
        return 2
    try:
        opts.validate()
    except ValueError as e:
        print(f"replay-drafters: {e}", file=sys.stderr)
        return 2
    table = None  # loaded once here, checked before any replay, and handed to every replay
    if "combined" in drafters and opts.corpus_calibration != "none":
        from ..calibration.corpus_table import load_corpus_table

        try:  # a missing, malformed or mismatched table fails before any replay
            table = load_corpus_table(opts.corpus_calibration)
            table.check_corpus(replace(cfg, tau=opts.corpus_tau))
        except (OSError, ValueError) as e:
            print(f"replay-drafters: --corpus-calibration: {e} (--corpus-calibration none: the corpus's own q)",
                  file=sys.stderr)
            return 2
    if not args.json:
        print("| workload | K | drafter | tokens/step | proposed/step | steps with >= 1 accepted |")
        print("|---|---:|---|---:|---:|---:|")
    for path in args.workload:
        recs = load_workload(path, args.limit)
        for K in ks:
            for d in drafters:
                res = replay(recs, d, K, cfg, opts, table)
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
