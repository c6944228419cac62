#!/usr/bin/env python
"""Which features would predict the hybrid's n-gram chains better than its calibrated estimate? Prints tables.

    python scripts/step_features.py --workload sglang_hybrid/data/workloads/chat.jsonl --batch-size 4
    python scripts/step_features.py --workload W.jsonl --batch-size 32 --corpus off --max-requests 60 --save log.npz

Runs the simulator's hybrid (``sim/steplog.py: StepLogPolicy``, the default options: the same choices and
figures as ``hybrid-spark simulate --policy hybrid``) and logs every request-step's model-free candidates beside
the tokens the reference accepts. Then, per candidate source (the request's own history, the corpus), and for the
own drafts whose first token differs from the model chain's (the steps where the choice between the chains
matters):

* calibration: the first-token estimate ``q0`` (after the online calibration and the agreement with the model
  chain) against the observed rate, by bucket;
* feature gains: the mean log-loss of "token 0 accepted" under a logistic model on ``logit(q0)`` alone, and the
  drop when each feature is added (``sim/steplog.py: feature_gains``). A feature the estimate already carries
  gains about 0.

A research instrument: it reads the reference output, which no server has.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from sglang_hybrid.sim.jsonl import read_workload  # noqa: E402
from sglang_hybrid.sim.runner import SimOptions, load_sps, make_policy, prepare_requests, run_built  # noqa: E402
from sglang_hybrid.sim.steplog import StepLogPolicy, calibration_rows, feature_gains  # noqa: E402


def run(workload: str, batch_size: int, corpus: str = "shared", max_requests: int = 0):
    """``(log, summary)``: the step log and the hybrid's figures (as ``hybrid-spark simulate`` reports them)."""
    opts = SimOptions(batch_size=batch_size, policies=("hybrid",), corpus=corpus, max_requests=max_requests)
    opts.validate()
    sps = load_sps(opts.sps_table)
    reqs, vocab, _ = prepare_requests(read_workload(workload), opts)
    pol = make_policy("hybrid", opts, sps, hybrid_cls=StepLogPolicy)
    res = run_built(pol, reqs, vocab, opts, sps)
    return pol.table(), res.summary()


def report(log: dict) -> str:
    lines = []
    sections = [("own", None, "own-history drafts"),
                ("own", log["own_agree_model"] == 0, "own-history drafts whose token 0 differs from the model's"),
                ("corpus", None, "corpus drafts")]
    for source, where, title in sections:
        m = log[f"{source}_len"] > 0 if where is None else (log[f"{source}_len"] > 0) & where
        if m.sum() < 20:
            continue
        lines += [f"\n### {title}: {int(m.sum())} request-steps, token 0 accepted on "
                  f"{np.mean(log[f'{source}_accepted'][m] >= 1):.3f}", "",
                  "| q0 bucket | drafts | mean q0 | observed |", "|---|---:|---:|---:|"]
        for lo, hi, n, q, obs in calibration_rows(log, source, where=where):
            lines.append(f"| [{lo:.1f}, {min(hi, 1.0):.1f}) | {n} | {q:.3f} | {obs:.3f} |")
        lines += ["", "| feature | log-loss | gain over the estimate | weight |", "|---|---:|---:|---:|"]
        for name, ll, gain, w in feature_gains(log, source, where=where):
            lines.append(f"| {name} | {ll:.4f} | {gain:+.4f} | {w:+.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", required=True, help="workload JSONL ({id, kind, prompt, output} per line)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--corpus", choices=("off", "shared"), default="shared")
    p.add_argument("--max-requests", type=int, default=0, help="the first M records only (default: all)")
    p.add_argument("--save", default=None, help="also write the log (one array per field) to this .npz")
    args = p.parse_args(argv)
    if not Path(args.workload).is_file():
        p.error(f"--workload: no such file: {args.workload}")
    t0 = time.time()
    try:
        log, summary = run(args.workload, args.batch_size, args.corpus, args.max_requests)
    except ValueError as e:  # bad settings (SimOptions / run_policy name the argument)
        p.error(str(e))
    if not log:
        p.error("--workload: no decode step ran (too few requests for the batch size?)")
    print(f"# step features: {args.workload}, batch {args.batch_size}, corpus {args.corpus}, "
          f"{len(log['request'])} request-steps, hybrid accepted/step {summary['accepted_per_step']}, "
          f"{time.time() - t0:.0f} s")
    print(report(log))
    if args.save:
        np.savez_compressed(args.save, **log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
