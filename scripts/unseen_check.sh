#!/usr/bin/env bash
# The unseen check (issue 14): rebuild workloads from 17 release pairs that were never used for the shipped
# workloads or for either calibration table, then measure on them what the issue's goals measure:
#   1. the simulator: hybrid / DSpark at batch 4 and 32, the corpus shared and off;
#   2. the replay: the combined drafter at K = 8 and 16 (the peers' protocol);
#   3. with the peer built by ../shared/peers/suffix-decoding/README.md (.peer-work/venv), SuffixDecoding on the
#      same files, and one table of both; then the peer's frontier (scripts/peer_frontier.py: its settings
#      over a grid, and whether any of them is ahead of ours).
# Run from the project root with its .venv made. Needs the package index (pip download of 34 sdists, cached).
# usage: bash scripts/unseen_check.sh [OUT_DIR]    (default /tmp/unseen-check; about 30 minutes on 2 cores)
# Environment: BATCH_SIZES (default 4,32, the goals'), REPLAY_ARGS (extra replay-drafters options),
# PEER_WORK (the peer's build, default ./.peer-work), PAIRS (space-separated NAME:OLD:NEW release pairs; default
# the 17 below), SET_NAME (names the peer's result files; give a new set its own). Rerunning with the same OUT_DIR
# reuses the workloads.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${1:-/tmp/unseen-check}" && cd "${1:-/tmp/unseen-check}" && pwd)
HS=.venv/bin/hybrid-spark
BATCH_SIZES=${BATCH_SIZES:-4,32}
PAIRS=${PAIRS:-"requests:2.31.0:2.32.0 rich:13.6.0:13.7.0 httpx:0.26.0:0.27.0 urllib3:2.1.0:2.2.0 pytest:7.4.4:8.0.0
black:23.12.1:24.1.0 packaging:23.2:24.0 pluggy:1.4.0:1.5.0 alembic:1.12.1:1.13.0 marshmallow:3.20.2:3.21.0
itsdangerous:2.1.2:2.2.0 more-itertools:10.1.0:10.2.0 isort:5.12.0:5.13.0 pyparsing:3.1.4:3.2.0
jsonschema:4.22.0:4.23.0 sqlparse:0.4.4:0.5.0 tomlkit:0.12.5:0.13.0"}
SET_NAME=${SET_NAME:-u}  # names the peer's result files (not TAG: the peer's scripts read TAG)
args=(); for p in $PAIRS; do args+=(--pair "$p"); done

if [ ! -s "$OUT/workloads/chat.jsonl" ] || [ ! -s "$OUT/workloads/code_edit.jsonl" ]; then
  echo "== building the unseen workloads in $OUT/workloads" >&2
  "$HS" workloads build --out "$OUT/workloads" --cache "$OUT/sdists" "${args[@]}" >&2
fi

echo "== simulator (hybrid / DSpark; corpus shared and off)" >&2
for kind in chat code_edit; do
  for corpus in shared off; do
    "$HS" simulate --workload "$OUT/workloads/$kind.jsonl" --batch-size "$BATCH_SIZES" --jobs 1 --json \
      --no-progress --policy all --corpus "$corpus" > "$OUT/sim_${kind}_${corpus}.json"
  done
done
.venv/bin/python - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
print("| workload | corpus | batch | hybrid / DSpark | hybrid / NGRAM |\n|---|---|---:|---:|---:|")
for kind in ("chat", "code_edit"):
    for corpus in ("shared", "off"):
        for x in json.load(open(f"{out}/sim_{kind}_{corpus}.json"))["runs"]:
            tp = {p: v["throughput"] for p, v in x["policies"].items()}
            print(f"| {kind} | {corpus} | {x['batch_size']} | {tp['hybrid'] / tp['dspark']:.4f} | "
                  f"{tp['hybrid'] / tp['ngram']:.4f} |")
EOF

echo "== replay (combined drafter, K 8 and 16)" >&2
for kind in chat code_edit; do
  "$HS" replay-drafters --workload "$OUT/workloads/$kind.jsonl" --k 8,16 --json --drafters combined \
    ${REPLAY_ARGS:-} > "$OUT/replay_${kind}.jsonl"
done

peer=${PEER_WORK:-$PWD/.peer-work}
if [ -x "$peer/venv/bin/python" ]; then
  echo "== SuffixDecoding on the same files ($peer)" >&2
  env -u TAG bash ../shared/peers/suffix-decoding/run_all.sh "${SET_NAME}_chat=$OUT/workloads/chat.jsonl" \
    "${SET_NAME}_code_edit=$OUT/workloads/code_edit.jsonl" > "$OUT/peer.log" 2>&1 ||
    { echo "unseen_check: the peer's run failed; see $OUT/peer.log" >&2; exit 1; }
else
  echo "== no peer build at $peer: the replay table shows ours only" >&2
fi
.venv/bin/python - "$OUT" "$peer/results" "$SET_NAME" <<'EOF'
import json, os, sys
out, res, tag = sys.argv[1:]
print("\n| workload | K | ours (combined) | SuffixDecoding-global | goal |\n|---|---:|---|---|---|")
for kind in ("chat", "code_edit"):
    for line in open(f"{out}/replay_{kind}.jsonl"):
        o = json.loads(line)
        peer_f = f"{res}/suffix-global_{tag}_{kind}_{o['K']}.json"
        ours = f"{o['tokens_per_step']:.3f} / {o['proposed_per_step']:.3f}"
        if not os.path.exists(peer_f):
            print(f"| {kind} | {o['K']} | {ours} | (not run) | |")
            continue
        p = json.load(open(peer_f))
        met = o["tokens_per_step"] >= p["tokens_per_step"] and o["proposed_per_step"] <= p["proposed_per_step"]
        print(f"| {kind} | {o['K']} | {ours} | {p['tokens_per_step']:.3f} / {p['proposed_per_step']:.3f} | "
              f"tokens {o['tokens_per_step'] / p['tokens_per_step'] - 1:+.1%}, proposals "
              f"{o['proposed_per_step'] / p['proposed_per_step'] - 1:+.1%}: {'met' if met else 'not met'} |")
EOF
if [ -x "$peer/venv/bin/python" ]; then
  echo "== the peer's frontier: is any of its settings ahead of ours? (scripts/peer_frontier.py)" >&2
  PEER_WORK="$peer" .venv/bin/python scripts/peer_frontier.py --ours "${SET_NAME}_chat=$OUT/replay_chat.jsonl" \
    --ours "${SET_NAME}_code_edit=$OUT/replay_code_edit.jsonl"
fi
