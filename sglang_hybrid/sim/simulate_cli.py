"""``hybrid-spark simulate``: replay a workload through the real n-gram drafter, calibration and selection.

    hybrid-spark simulate --workload FILE.jsonl --batch-size N [--policy dspark|ngram|hybrid|all] [--json] ...
    hybrid-spark simulate --default [--plot PNG] [--json]     # the shipped workloads at batch 4, 32, 128

The model drafter is a declared acceptance model (or a recorded trace, --trace); the step cost comes from an SPS
table (default: the shipped roofline table for an 8B model on an H200). See ``sglang_hybrid/sim/simulator.py``.
"""

from __future__ import annotations

import argparse
import os
import dataclasses
import json
import sys
from pathlib import Path
from typing import Sequence

from .acceptance import DEFAULT_CONCENTRATION, DEFAULT_DECAY
from ..config import FAIRNESS_SCOPES, HybridConfig
from .oracle import ORACLE_MODES
from .runner import DEFAULT_DRAFT_COST_FRAC, DEFAULT_NGRAM_WIDTH, ORACLE, POLICIES, SimOptions


def _batch_sizes(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch-size: expected N or N,M,..., got {s!r}") from None
    if not out or any(b < 1 for b in out):
        raise argparse.ArgumentTypeError(f"--batch-size: batch sizes must be >= 1, got {s!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hybrid-spark simulate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    w = p.add_mutually_exclusive_group(required=True)
    w.add_argument("--workload", help="workload JSONL file ({id, kind, prompt, output} per line)")
    w.add_argument("--default", action="store_true",
                   help="run the shipped code-edit and chat workloads at batch 4, 32 and 128 (subsampled to stay fast)")
    p.add_argument("--batch-size", type=_batch_sizes, default=None,
                   help="concurrent requests; a comma list runs each (default: 4,32,128 with --default)")
    p.add_argument("--policy", choices=POLICIES + ("all",), default="all")
    p.add_argument("--oracle", choices=ORACLE_MODES, default=None,
                   help="also run a clairvoyant bound over DSpark (sim/oracle.py: 'choice' = the better chain at "
                   "DSpark's lengths, 'lengths' = the model chain verified only as far as it is accepted, 'both'; "
                   "'estimate' = the hybrid with its n-gram candidates priced by their true outcome); "
                   "a yardstick that reads the reference output, not a policy")
    p.add_argument("--sps-table", default=None, help="SPS table JSON (SGLang DSpark SpsCostTable format); "
                   "default: the shipped roofline table (8B bf16 on one H200)")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer directory (default: the shipped tokenizer)")
    p.add_argument("--calibration", default=None, help="n-gram calibration JSON (default: the shipped table)")
    p.add_argument("--trace", default=None, help="replay the model drafter from a worker trace (JSONL)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-requests", type=int, default=None,
                   help="replay only the first M requests (default: all; --default picks per batch size)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--plot", default=None, help="write a PNG of the throughput ratios versus batch size")
    m = p.add_argument_group("model drafter (declared acceptance model)")
    m.add_argument("--gamma", type=int, default=7, help="model chain length")
    m.add_argument("--accept-length", type=float, default=None,
                   help="full-gamma accepted length incl. bonus (default: DSpark's published 5.0 code / 3.7 chat)")
    m.add_argument("--concentration", type=float, default=DEFAULT_CONCENTRATION,
                   help="Beta concentration of per-step confidences (inf: no per-step variation)")
    m.add_argument("--decay", type=float, default=DEFAULT_DECAY, help="per-position decay of mean acceptance")
    m.add_argument("--draft-cost-frac", type=float, default=DEFAULT_DRAFT_COST_FRAC,
                   help="model drafter's cost as a fraction of the step (dspark and hybrid)")
    m.add_argument("--dspark-lag", type=int, default=2, help="steps of staleness of DSpark's budget survivals")
    n = p.add_argument_group("n-gram drafter and selection")
    n.add_argument("--ngram-width", type=int, default=DEFAULT_NGRAM_WIDTH,
                   help="NGRAM policy: verify tokens per request (root + drafts), SGLang's default 12")
    n.add_argument("--max-draft", type=int, default=None,
                   help="hybrid n-gram chain length (default gamma; above gamma the n-gram chain runs past the model's)")
    n.add_argument("--hybrid-verify", choices=("ragged", "fixed"), default="ragged",
                   help="ragged: DSpark-style verify of the chosen lengths under the SPS budget; fixed: the "
                        "EAGLE-family worker, a max(gamma, max-draft) + 1 window for every request")
    n.add_argument("--two-branch", action="store_true",
                   help="ragged hybrid: a request may verify both chains as a two-branch tree (keeps the longer "
                        "accepted branch) where the SPS objective says it pays")
    n.add_argument("--model-tail", type=int, default=HybridConfig.model_tail,
                   help="hybrid: n-gram tail drafted after the model chain, at most this many tokens (capped by the "
                        "chain width minus gamma); 0 = off")
    n.add_argument("--corpus-tail", action=argparse.BooleanOptionalAction, default=HybridConfig.corpus_tail,
                   help="hybrid, with --corpus shared and the tail on: the corpus's continuation after the model "
                        "chain competes with the n-gram tail (the better of the two per request; default on, as "
                        "the plugin's corpus_tail)")
    n.add_argument("--model-splices", type=int, default=HybridConfig.model_splices,
                   help="hybrid: splice points just before the model chain's end (the chain cut after token k = "
                        "gamma - N .. gamma - 1 and continued by the request's own n-gram; calibration/splice.py, "
                        "the plugin's model_splices); 0 = off")
    n.add_argument("--splice-margin", type=float, default=HybridConfig.splice_margin,
                   help="hybrid, with --model-splices: expected tokens a splice must add over the model chain (the "
                        "plugin's splice_margin)")
    n.add_argument("--no-model-echo", dest="model_echo", action="store_false",
                   help="hybrid: do not lift the model tokens the history echoes (the tail's and the splices' "
                        "lookups after them matched; calibration/echo.py; default on, as the plugin's model_echo)")
    n.add_argument("--echo-probes", type=int, default=HybridConfig.echo_probes,
                   help="hybrid, with the echo: lookups after the model chain's first k tokens, k = gamma - N .. "
                        "gamma - 1, that only extend the echo's reach (the plugin's echo_probes); 0 = off")
    n.add_argument("--fairness", type=float, default=HybridConfig.fairness,
                   help="hybrid: weight each request's survivals by (the batch's lowest speed relative to DSpark's "
                        "plan for the same request / its own) ** FAIRNESS before the selection (selection/"
                        "fairness.py; the plugin's fairness): 0 = the batch total alone; ragged verify only")
    n.add_argument("--fairness-scope", choices=FAIRNESS_SCOPES, default=HybridConfig.fairness_scope,
                   help="hybrid, with --fairness: what the weights even out: every request, or each tenant's "
                        "requests together (here each request kind is its own tenant; the plugin's "
                        "fairness_scope)")
    n.add_argument("--no-model-agreement", dest="model_agreement", action="store_false",
                   help="hybrid: price the n-gram tokens without the model chain beside them (calibration/"
                        "agreement.py; default on, as the plugin's model_agreement)")
    n.add_argument("--corpus", choices=("off", "shared"), default=HybridConfig.corpus,
                   help="hybrid: the cross-request n-gram corpus (every request's committed tokens, shared)")
    n.add_argument("--corpus-entries", type=int, default=HybridConfig.corpus_entries,
                   help="corpus table entries (a power of two)")
    n.add_argument("--corpus-calibration", default=HybridConfig.corpus_calibration, metavar="default|none|FILE",
                   help="hybrid: the corpus drafts' fitted odds-ratio table, as the plugin's corpus_calibration")
    n.add_argument("--n-min", type=int, default=2)
    n.add_argument("--n-max", type=int, default=8)
    n.add_argument("--num-iters", type=int, default=2)
    n.add_argument("--no-ngram", action="store_true", help="hybrid with its n-gram drafter disabled (ablation)")
    n.add_argument("--online-calibration", dest="online_calibration", action="store_true", default=None,
                   help="per-request recalibration of the n-gram estimates (default: the plugin's default, on)")
    n.add_argument("--no-online-calibration", dest="online_calibration", action="store_false",
                   help="the shipped calibration table alone")
    n.add_argument("--online-strength", type=float, default=None,
                   help="prior strength of the recalibration (larger: trust the table longer; default: the plugin's)")
    n.add_argument("--online-bins", type=int, default=None,
                   help="bins of the recalibration's second, traffic-level stage by the estimate's value (0: off; "
                        "default: the plugin's, 8)")
    n.add_argument("--online-defer", type=int, default=None,
                   help="steps an n-gram draft stays open to be scored against the history as it arrives (0: "
                        "against its own step's commit only; default: the plugin's, 8)")
    p.add_argument("--cost", choices=("sps", "roofline-2d"), default="sps",
                   help="step cost: 1/SPS(B) from the table, or a roofline charging each request's KV (see cost.py)")
    p.add_argument("--sps2d", default="auto",
                   help="hybrid's price table: auto (a 2-D table matching the cost model under roofline-2d, the 1-D "
                        "SPS table under sps), off (always 1-D), roofline, or a 2-D table JSON (selection/sps2d.py)")
    p.add_argument("--measure", choices=("steady", "all"), default="steady",
                   help="steady: count only full-batch steps (stop when the queue runs dry); all: replay to the end")
    p.add_argument("--wrong-tokens", choices=("shift", "history"), default="shift",
                   help="the model chain's wrong tokens: shift (ref + 1, never in the history) or history (an "
                        "adversary for the echo: after its right prefix it copies what the request's history says "
                        "follows it)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads; the replay runs many small tensor ops, which one thread does fastest "
                        "(on a shared 2-core machine, 2 threads ran 10x slower)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="--default: processes that run the (workload, batch size) cells side by side")
    p.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="tqdm bar of finished requests on stderr (default: when stderr is a terminal)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def _policies(args: argparse.Namespace) -> tuple[str, ...]:
    pols = POLICIES if args.policy == "all" else (args.policy,)
    if args.oracle:  # the bound is read against DSpark, so DSpark runs too
        pols = tuple(dict.fromkeys(pols + ("dspark", ORACLE)))
    return pols


def _options(args: argparse.Namespace, batch_size: int) -> SimOptions:
    return SimOptions(
        batch_size=batch_size, policies=_policies(args), oracle=args.oracle or "", gamma=args.gamma,
        seed=args.seed, max_requests=args.max_requests or 0, draft_cost_frac=args.draft_cost_frac,
        dspark_lag=args.dspark_lag, ngram_width=args.ngram_width, accept_length=args.accept_length,
        concentration=args.concentration, decay=args.decay, trace=args.trace, n_min=args.n_min, n_max=args.n_max,
        max_draft=args.max_draft, num_iters=args.num_iters, enable_ngram=not args.no_ngram,
        hybrid_verify=args.hybrid_verify, two_branch=args.two_branch, corpus=args.corpus,
        corpus_entries=args.corpus_entries, corpus_calibration=args.corpus_calibration, model_tail=args.model_tail,
        model_agreement=args.model_agreement, corpus_tail=args.corpus_tail, fairness=args.fairness,
        fairness_scope=args.fairness_scope, model_splices=args.model_splices, splice_margin=args.splice_margin,
        model_echo=args.model_echo, echo_probes=args.echo_probes,
        online_calibration=HybridConfig.online_calibration if args.online_calibration is None
        else args.online_calibration,
        online_strength=HybridConfig.online_strength if args.online_strength is None else args.online_strength,
        online_defer=HybridConfig.online_defer if args.online_defer is None else args.online_defer,
        online_bins=HybridConfig.online_bins if args.online_bins is None else args.online_bins,
        calibration=args.calibration, sps_table=args.sps_table, tokenizer=args.tokenizer,
        measure=args.measure, wrong_tokens=args.wrong_tokens, cost=args.cost, sps2d=args.sps2d, progress=sys.stderr.isatty() if args.progress is None else args.progress,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hybrid-spark simulate``; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.jobs < 1:
        print(f"hybrid-spark simulate: error: --jobs: must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    if args.threads < 1:
        print(f"hybrid-spark simulate: error: --threads: must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    from .report import run_report
    from .runner import load_calibration, simulate
    from .jsonl import read_workload
    from .table import format_run, format_summary

    try:
        if args.default:
            from .report import REPORT_BATCH_SIZES

            bss = args.batch_size or list(REPORT_BATCH_SIZES)
            runs = run_report(bss, max_requests=args.max_requests, base=_options(args, bss[0]), jobs=args.jobs)
        else:
            records = read_workload(args.workload)
            bss = args.batch_size or [4]
            base = _options(args, bss[0])
            cal = load_calibration(base.calibration) if "hybrid" in base.policies else None
            runs = []
            for bs in bss:
                r = simulate(records, dataclasses.replace(base, batch_size=bs), calibration=cal)
                r["workload"] = Path(args.workload).name
                r["total_requests"] = len(records)
                runs.append(r)
    except (ValueError, FileNotFoundError) as e:
        print(f"hybrid-spark simulate: error: {e}", file=sys.stderr)
        return 2
    if args.plot:
        from .plot import plot_ratios

        plot_ratios(runs, args.plot)
    if args.json:
        print(json.dumps(runs[0] if len(runs) == 1 else {"runs": runs}, indent=1))
    else:
        for r in runs:
            print(format_run(r))
            print()
        if len(runs) > 1:
            print(format_summary(runs))
        if any(r.get("subsampled") for r in runs):
            print("note: some runs replayed only the first requests of the workload (see 'subsampled' above).")
        print("note: the model drafter is a declared acceptance model (DSpark's published accepted lengths), "
              "not a real draft model; step times come from the SPS table "
              f"({runs[0]['settings']['sps_table']}).")
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
