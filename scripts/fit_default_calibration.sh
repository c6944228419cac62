#!/usr/bin/env bash
# Rebuild the shipped default tokenizer and n-gram calibration table, byte for byte.
#
#   bash scripts/fit_default_calibration.sh            # PYTHON=/path/to/python to choose the interpreter
#
# Exact reproduction needs the interpreter the files were made with (CPython 3.11.7): the corpus is that
# interpreter's own standard library. The JSON records the corpus digest, the tokenizer digest and every
# option; a different Python version gives a (slightly) different, equally valid table.
#
# A deployment refits for its own target model instead (source b, greedy continuations of the target):
#   hybrid-spark calibrate --source model --model /path/to/target --corpus /path/to/prompts \
#       --device cuda --out my_calibration.json --plot my_calibration.png
# and points the plugin at it (option `calibration`, e.g. SGLANG_HYBRID_CALIBRATION=my_calibration.json).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
"$PY" -m sglang_hybrid.tokenizer --out sglang_hybrid/data/tokenizer
"$PY" -m sglang_hybrid.calibration.cli --source text --corpus stdlib --seed 0 \
    --n-min 2 --n-max 8 --max-draft 16 \
    --out sglang_hybrid/data/calibration/default.json \
    --plot sglang_hybrid/data/calibration/default_reliability.png
