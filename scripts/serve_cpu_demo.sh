#!/usr/bin/env bash
# Try HYBRID_SPARK through SGLang's HTTP server without a GPU.
#
#   scripts/serve_cpu_demo.sh [--port P] [--dry-run] [more launch_server flags]
#
# Builds the tiny test models if needed (tests/e2e/tiny_models.py, cached under ~/.cache/sglang_hybrid_tests),
# checks that SGLang will load the plugin (one line if SGLANG_PLUGINS filters it out or it is not installed),
# prints curl and bench_serving commands to try, then runs `python -m sglang.launch_server` with HYBRID_SPARK
# on CPU in the foreground (127.0.0.1 only; Ctrl-C stops it). --dry-run prints everything and starts nothing.
# PYTHON selects the interpreter (default: python3). The CPU settings are those of the e2e tests
# (tests/e2e/engine_harness.py): fp32, Triton attention under the interpreter, no CUDA graphs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
PORT=30000
DRY=0
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --port) PORT="$2"; shift 2 ;;
    --port=*) PORT="${1#--port=}"; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done

WORK="$(mktemp -d -t hybrid-spark-demo-XXXXXX)"
mapfile -t LINES < <(cd "$ROOT" && PYTHONPATH="$ROOT/tests/e2e:$ROOT" "$PY" "$ROOT/tests/e2e/server_harness.py" \
  "$PORT" "$WORK" "${EXTRA[@]+"${EXTRA[@]}"}" 2>/dev/null)
ENVS=(); ARGS=(); TOKENIZER=""; part=0
for line in "${LINES[@]}"; do
  if [[ "$line" == "--" ]]; then part=$((part + 1)); continue; fi
  case $part in
    0) ENVS+=("$line") ;;
    1) ARGS+=("$line") ;;
    2) TOKENIZER="${line#TOKENIZER=}" ;;
  esac
done
if [[ ${#ARGS[@]} -eq 0 ]]; then
  echo "serve_cpu_demo: could not build the tiny models / command (run with PYTHON=path/to/venv/python?)" >&2
  exit 1
fi
export "${ENVS[@]}"

# The start-up check: SGLang's own error would only say "Unknown speculative algorithm name: HYBRID_SPARK".
if ! "$PY" -m sglang_hybrid.sglang_plugin.startup_check "${ARGS[@]}"; then
  [[ $DRY -eq 1 ]] || exit 1
fi

URL="http://127.0.0.1:$PORT"
cat <<EOF
== HYBRID_SPARK on CPU: tiny models under $(dirname "$TOKENIZER")
== server: $PY ${ARGS[*]}
== wait for "The server is fired up and ready to roll!" (about 40 s), then in another shell try:

curl -s $URL/generate -H 'Content-Type: application/json' \\
  -d '{"text": "def add(a, b):\\n    return a + b\\n\\ndef add", "sampling_params": {"temperature": 0, "max_new_tokens": 16}}'
curl -s $URL/v1/completions -H 'Content-Type: application/json' \\
  -d '{"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0, "return_token_ids": true}'
curl -s $URL/v1/chat/completions -H 'Content-Type: application/json' \\
  -d '{"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 12, "temperature": 0}'
curl -s $URL/server_info | $PY -c 'import json,sys; s=json.load(sys.stdin)["internal_states"][0]; print(s.get("avg_spec_accept_length"), s.get("hybrid_spark"))'
$PY -m sglang.benchmark.serving --backend sglang --host 127.0.0.1 --port $PORT --dataset-name random-ids \\
  --num-prompts 8 --random-input-len 32 --random-output-len 16 --tokenizer $TOKENIZER --model $(dirname "$TOKENIZER")/target

EOF
if [[ $DRY -eq 1 ]]; then
  rm -rf "$WORK"
  exit 0
fi
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
"$PY" "${ARGS[@]}"
