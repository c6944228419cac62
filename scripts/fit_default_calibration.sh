#!/usr/bin/env bash
# Rebuild the shipped default tokenizer, n-gram calibration table and corpus calibration table, byte for byte.
#
#   bash scripts/fit_default_calibration.sh     # PYTHON=/path/to/python, SDIST_CACHE=dir to reuse downloads
#
# The corpus is two parts, fit together (source "text itself": the text after each prompt plays the target):
#   1. this interpreter's standard library (code, docstrings, reference topics);
#   2. served-request pairs (prompt -> output) of the two kinds the project targets: every code-edit and chat
#      record `hybrid-spark workloads build` makes from its default PyPI release pairs, MINUS the 480 records
#      shipped in sglang_hybrid/data/workloads/ (the simulator's evaluation set), so the evaluation never sees
#      its own requests. They come from the same packages, so they are representative, not independent.
# Exact reproduction needs the interpreter the files were made with (CPython 3.11.7) and the same sdists (the
# workloads manifest records their sha256); another Python gives a slightly different, equally valid table.
# Step 2 downloads about 40 sdists from PyPI (about 3 minutes the first time).
#
# A deployment refits for its own traffic instead, from its request log (JSONL of {"prompt", "output"}):
#   hybrid-spark calibrate --source text --corpus stdlib my_requests.jsonl --out my_calibration.json
# or from its target model's own greedy continuations:
#   hybrid-spark calibrate --source model --model /path/to/target --corpus /path/to/prompts \
#       --device cuda --out my_calibration.json --plot my_calibration.png
# and points the plugin at it (option `calibration`, e.g. SGLANG_HYBRID_CALIBRATION=my_calibration.json).
# The corpus table (option `corpus_calibration`) is fitted on the same two parts by replaying them through a
# cross-request corpus (calibration/corpus_samples.py; up to an hour on 2 cores: the step's walks are long):
#   hybrid-spark calibrate --candidate corpus --corpus stdlib my_requests.jsonl --out my_corpus_table.json
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
WORK=build/calibration
mkdir -p "$WORK"
"$PY" -m sglang_hybrid.tokenizer --out sglang_hybrid/data/tokenizer
"$PY" -m sglang_hybrid.cli workloads build --max-code 0 --max-chat 0 --no-token-counts \
    --out "$WORK/all" --cache "${SDIST_CACHE:-$WORK/sdists}"
"$PY" - "$WORK" <<'EOF'
import json, sys
work = sys.argv[1]
shipped = {json.loads(line)["id"] for k in ("code_edit", "chat")
           for line in open(f"sglang_hybrid/data/workloads/{k}.jsonl", encoding="utf-8")}
kept = 0
with open(f"{work}/requests.jsonl", "w", encoding="utf-8") as out:
    for k in ("code_edit", "chat"):
        for line in open(f"{work}/all/{k}.jsonl", encoding="utf-8"):
            if json.loads(line)["id"] not in shipped:
                out.write(line)
                kept += 1
print(f"{kept} served-request pairs for calibration ({len(shipped)} evaluation records left out)")
EOF
"$PY" -m sglang_hybrid.calibration.cli --source text --corpus stdlib "$WORK/requests.jsonl" --seed 0 \
    --n-min 2 --n-max 8 --max-draft 16 \
    --out sglang_hybrid/data/calibration/default.json \
    --plot sglang_hybrid/data/calibration/default_reliability.png
"$PY" -m sglang_hybrid.calibration.cli --candidate corpus --source text --corpus stdlib "$WORK/requests.jsonl" \
    --seed 0 --max-draft 16 --out sglang_hybrid/data/calibration/corpus_default.json
