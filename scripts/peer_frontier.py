"""Is any SuffixDecoding setting ahead of ours? The peer's frontier beside our replay figures. Prints tables.

Issue 14's replay goal compares one point of each drafter: SuffixDecoding-global at its defaults
(``min_token_prob`` 0.1, ``max_spec_factor`` 1.0) against ours at ours. Each drafter trades proposals for tokens,
so a single point can land on either side of the other's proposal count. This runs the peer over a grid of its
two knobs on the same tokenized workloads and asks, per workload and K:

* the peer's default point (the issue's goal: ours has at least its tokens with no more proposals);
* the peer's best at our budget: the most tokens any grid setting reaches with no more proposals than ours;
* the peer's envelope at our proposals: the most tokens a mix of two settings reaches at exactly our proposals
  (each request run at one of the two, in the proportion that spends our proposals; read as the straight line
  between the two points), so a grid too coarse for a single setting to land near ours does not flatter us;
* which settings dominate ours (at least our tokens and no more proposals); none means no setting of the
  grid is ahead of ours.

Needs the peer built and the workloads tokenized by ``../shared/peers/suffix-decoding/run_all.sh`` (names as
given there, e.g. ``shipped_chat`` or ``u_chat`` from ``scripts/unseen_check.sh``); the peer runs in its own
venv (seconds per point). Not part of the tests' dependencies: a benchmark, run by hand.

    python scripts/peer_frontier.py --ours shipped_chat=replay_chat.jsonl --ours shipped_code_edit=replay_code.jsonl
    python scripts/peer_frontier.py --ours u_chat=/tmp/unseen-check/replay_chat.jsonl --min-prob 0.05,0.1,0.2

``--ours NAME=FILE``: ``hybrid-spark replay-drafters --json`` output (one JSON object per K; the ``combined``
drafter's lines are read). Environment: ``PEER_WORK`` (default ``./.peer-work``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_SCRIPT = ROOT.parent / "shared" / "peers" / "suffix-decoding" / "replay_suffix.py"
DEFAULT = (0.1, 1.0)  # SuffixDecoding's min_token_prob and max_spec_factor


def compare(ours: tuple[float, float], points: list[tuple[tuple[float, float], float, float]]) -> dict:
    """``ours`` = (tokens, proposed) per step; ``points`` = [((min_prob, factor), tokens, proposed)].

    Returns ``best_at_budget`` (the point with the most tokens among those proposing no more than ours, or
    None), ``dominating`` (points with tokens >= ours and proposed <= ours) and ``default`` (the point at
    ``DEFAULT``, or None)."""
    t, p = ours
    within = [x for x in points if x[2] <= p]
    best = max(within, key=lambda x: (x[1], -x[2])) if within else None
    return {"best_at_budget": best,
            "dominating": [x for x in points if x[1] >= t and x[2] <= p],
            "default": next((x for x in points if x[0] == DEFAULT), None)}


def envelope(points: list[tuple[tuple[float, float], float, float]], proposed: float) -> float | None:
    """The most tokens per step a mix of at most two of ``points`` reaches with ``proposed`` proposals per step:
    a single point at or under ``proposed``, or the line between two points on either side of it. None when
    every point proposes more."""
    best = max((t for _, t, p in points if p <= proposed), default=None)
    for (_, t0, p0), (_, t1, p1) in itertools.combinations(points, 2):
        if p0 > p1:
            t0, p0, t1, p1 = t1, p1, t0, p0
        if p0 <= proposed <= p1 and p1 > p0:
            t = t0 + (t1 - t0) * (proposed - p0) / (p1 - p0)
            best = t if best is None else max(best, t)
    return best


def read_ours(path: str) -> dict[int, tuple[float, float]]:
    """K -> (tokens, proposed) per step of the ``combined`` drafter in a ``replay-drafters --json`` file."""
    out = {}
    for line in open(path):
        if line.strip():
            o = json.loads(line)
            if o.get("drafter", "combined") == "combined":
                out[int(o["K"])] = (float(o["tokens_per_step"]), float(o["proposed_per_step"]))
    if not out:
        raise SystemExit(f"--ours {path}: no combined-drafter lines")
    return out


def run_peer(work: Path, names: list[str], min_prob: float, factor: float) -> None:
    """One grid point over every workload (K 8 and 16), results under a tag of its own."""
    env = {**os.environ, "PEER_WORK": str(work), "SUFFIX_MIN_PROB": str(min_prob), "SUFFIX_FACTOR": str(factor),
           "TAG": tag(min_prob, factor)}
    subprocess.run([str(work / "venv" / "bin" / "python"), str(PEER_SCRIPT), "global", *names], env=env,
                   check=True, stdout=subprocess.DEVNULL)


def tag(min_prob: float, factor: float) -> str:
    return f"_frontier_p{min_prob:g}_f{factor:g}"


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", action="append", required=True, metavar="NAME=FILE",
                    help="a workload tokenized under NAME in PEER_WORK/tok, and our replay-drafters --json file")
    ap.add_argument("--min-prob", type=_floats, default=[0.03, 0.05, 0.07, 0.1, 0.13, 0.16, 0.2, 0.3])
    ap.add_argument("--factor", type=_floats, default=[0.5, 1.0, 2.0])
    ap.add_argument("--reuse", action="store_true",
                    help="skip a setting whose result files already exist (after a change of tokens, rerun without)")
    args = ap.parse_args(argv)
    work = Path(os.environ.get("PEER_WORK", ROOT / ".peer-work")).resolve()
    if not (work / "venv" / "bin" / "python").exists():
        raise SystemExit(f"no peer build at {work}: see ../shared/peers/suffix-decoding/README.md")
    ours = {}
    for spec in args.ours:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--ours: expected NAME=FILE, got {spec!r}")
        if not (work / "tok" / f"{name}.jsonl").exists():
            raise SystemExit(f"--ours {name}: {work}/tok/{name}.jsonl is missing (tokenize it with run_all.sh)")
        ours[name] = read_ours(path)
    grid = sorted({(p, f) for p in args.min_prob for f in args.factor} | {DEFAULT})
    def result(p: float, f: float, name: str, K: int) -> Path:
        return work / "results" / f"suffix-global{tag(p, f)}_{name}_{K}.json"

    for i, (p, f) in enumerate(grid):
        if args.reuse and all(result(p, f, n, K).exists() for n in ours for K in (8, 16)):
            continue
        print(f"peer point {i + 1}/{len(grid)}: min_token_prob {p:g}, max_spec_factor {f:g}", file=sys.stderr)
        run_peer(work, list(ours), p, f)
    print("| workload | K | ours | peer default | peer's best at our proposals | peer's envelope there | "
          "settings ahead of ours |")
    print("|---|---:|---|---|---|---|---|")
    for name, by_k in ours.items():
        for K, (t, pr) in sorted(by_k.items()):
            pts = []
            for p, f in grid:
                r = json.load(open(result(p, f, name, K)))
                pts.append(((p, f), r["tokens_per_step"], r["proposed_per_step"]))
            c = compare((t, pr), pts)
            d, b = c["default"], c["best_at_budget"]
            best = "none within" if b is None else f"{b[1]:.4f} / {b[2]:.4f} ({t / b[1] - 1:+.2%} ours)"
            ahead = ", ".join(f"p{x[0][0]:g} f{x[0][1]:g}" for x in c["dominating"]) or "none"
            e = envelope(pts, pr)
            env = "none within" if e is None else f"{e:.4f} ({t / e - 1:+.2%} ours)"
            print(f"| {name} | {K} | {t:.4f} / {pr:.4f} | {d[1]:.4f} / {d[2]:.4f} | {best} | {env} | {ahead} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
