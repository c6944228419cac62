#!/usr/bin/env bash
# One-shot GPU check of sglang-hybrid on a lent GPU machine (an H200: python3, torch, triton, CUDA; no
# sglang, no internet). Run from the repository root:
#
#     bash scripts/gpu_check.sh            # the check (under GPU_CHECK_BUDGET_S seconds, default 450)
#     bash scripts/gpu_check.sh --dry-run  # print what would run, run nothing (works on a CPU machine)
#
# Sections, in priority order, each time-boxed with `timeout` (a failing or timed-out section does not stop
# the others; a late section gets what is left of the budget, down to 0 = not run):
#   env             nvidia-smi, python / torch / triton / CUDA versions, pytest availability
#   wheels          install carried wheels from .whl/ (if present) into /tmp/site, put it on PYTHONPATH
#   tests_calibration  tests/test_calibration_apply.py,    } HYBRID_TEST_DEVICE=cuda TRITON_INTERPRET=0: the
#                      tests/test_calibration_{deferred,online}_kernel.py }
#   tests_ngram        tests/test_ngram_*.py               } compiled Triton kernels vs the torch reference, exactly
#   tests_selection tests/test_selection_*.py that take the kernel_device fixture (likewise on CUDA); files that
#                   import sglang are not run when sglang is absent, files without kernel_device are not run
#                   (their CPU tensors cannot go through compiled Triton): both are printed
#   e2e             scripts/gpu_e2e_check.py: tiny-model SGLang launches, HYBRID_SPARK greedy output (verify
#                   windows 4, 9, and 9 narrowed above bs 2) ==
#                   plain decoding; prints "skipped: sglang not installed" and passes where sglang is absent
#   tests_step_graphs  tests/test_step_graphs.py: the decode step replayed as real CUDA graphs (graphs.py, option
#                   step_graphs) equals the eager step bit for bit
#   bench_step      scripts/bench_step.py: the whole decode step (propose + record, DSpark shape, corpus off and
#                   shared) at bs {1,4,32,128}, eager and as a CUDA-graph replay; also a test: the graph's
#                   proposals and final state must equal the eager step's bit for bit
#   bench_step_fair scripts/bench_step.py --fairness 2 --fairness-scope tenant --corpus off at bs {32,128}: the
#                   step with the fairness weights between two tenants (a second selection per step, on the
#                   model chains alone, and the tenants' sums), eager and as a CUDA-graph replay, and the same
#                   graph == eager test
#   bench_step_splice scripts/bench_step.py --model-splices 4 --corpus off at bs {32,128}: the step with the model
#                   chain's splices (four more stash / append / lookup / restore / calibration per step), eager and
#                   as a CUDA-graph replay, and the same graph == eager test
#   bench_step_noprobe scripts/bench_step.py --echo-probes 0 --corpus off at bs {32,128}: the step without the
#                   echo's probes (calibration/echo.py; one probe kernel for four points per step by default);
#                   compare with the bench_step rows of the same batch size (corpus off)
#   bench_online    scripts/bench_online.py: the online calibration's apply and deferred scoring, torch against
#                   their Triton kernels, eager and as a CUDA-graph replay, bs {1,4,32,128}
#   bench_penalties scripts/bench_penalties.py: the DSpark worker's penalties at every verify position (in place
#                   against the reference, time and peak memory, bit-equal check) at k x W x V up to 48 x 16 x 152064
#   device_memory   scripts/device_memory.py on CUDA: the plugin state's device memory by part, beside what the
#                   allocator handed out while it was built (memory.py's count should miss nothing)
#   bench_ngram     scripts/bench_ngram.py on CUDA, bs {1,4,32,128} x history {1k,8k,32k,128k}, torch and
#                   Triton; then the Triton column again as CUDA-graph replays (bench_ngram_graph)
#   bench_corpus    scripts/bench_ngram.py --corpus: the cross-request corpus's lookup and insert, torch and
#                   Triton (bench_corpus_graph, run right after tests_ngram: Triton as CUDA-graph replays, bs 128
#                   first; the issue's budget is under 30 us together at bs 128), and the corpus tail's second
#                   lookup after the model chain (option corpus_tail)
#   bench_selection scripts/bench_selection.py on CUDA (if present), bs {1,4,32,128,512} x L {8,16,32}; it gets
#                   what is left of the budget (the bs=512 kernel alone takes ~1 min to compile)
#
# Output: everything to $OUT/gpu_check.log and a summary with the benchmark tables to $OUT/gpu_results.md
# ($OUT set by the device tool; else ./gpu_out/). Exit status: 0 if every test section (tests_calibration,
# tests_ngram, tests_selection, e2e) passed, 1 otherwise; benchmark failures are reported in the summary only.
#
# Environment (all optional):
#   PYTHON                 interpreter (default python3)
#   GPU_CHECK_BUDGET_S     total seconds for all sections (default 450)
#   GPU_CHECK_SKIP         space-separated section names not to run
#   GPU_CHECK_SELECTION_K  a pytest -k expression for the selection tests
#   GPU_CHECK_SITE         where carried wheels are installed (default /tmp/site)
#   GPU_CHECK_NGRAM_SIZES  bench_ngram sizes (default "--bs 1,4,32,128 --hist 1k,8k,32k,128k")
#   GPU_CHECK_STEP_SIZES   bench_step arguments (default "--bs 1,4,32,128")
#   GPU_CHECK_CORPUS_GRAPH_SIZES  bench_corpus_graph sizes (default "--bs 128,1,32 --hist 1k,8k": the issue's
#                          bs 128 budget first)
#   GPU_CHECK_DEVICE       cuda (default); "cpu" rehearses the whole script on a CPU machine (interpreter tests,
#                          CPU benchmarks), e.g. GPU_CHECK_DEVICE=cpu GPU_CHECK_NGRAM_SIZES="--bs 1 --hist 1k"
#
# pytest: the device image ships pytest, pluggy, iniconfig, packaging and pygments; this script disables pytest's
# plugin autoload so that the image's other pytest plugins cannot interfere. To carry our own versions instead
# (or if the image lacks pytest), download the wheels here once (see scripts/gpu_wheels.txt):
#
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#         -d .whl pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 pygments==2.21.0
#
# and name `.whl` in the device tool's `carry`; this script installs them with
#     python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
# and puts /tmp/site first on PYTHONPATH.

set -u
set -o pipefail

DRY=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument '$arg' (use --dry-run or --help)" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2

PY="${PYTHON:-python3}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-450}"
SKIP=" ${GPU_CHECK_SKIP:-} "
OUTDIR="${OUT:-$ROOT/gpu_out}"
LOG="$OUTDIR/gpu_check.log"
RESULTS="$OUTDIR/gpu_results.md"
START_S=$SECONDS
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

export PYTHONUNBUFFERED=1
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1  # only our conftest: none of the image's pytest plugins
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/gpu_check_triton_cache}"
export TOKENIZERS_PARALLELISM=false

DEV="${GPU_CHECK_DEVICE:-cuda}"
if [ "$DEV" = cpu ]; then INTERP=1; else INTERP=0; fi
KERNEL_ENV=(HYBRID_TEST_DEVICE="$DEV" TRITON_INTERPRET="$INTERP")
PYTEST=("$PY" -m pytest -v -p no:cacheprovider -rfE --durations=8 --tb=short)
read -r -a NGRAM_SIZES <<< "${GPU_CHECK_NGRAM_SIZES:---bs 1,4,32,128 --hist 1k,8k,32k,128k}"
NGRAM_BENCH=(scripts/bench_ngram.py --device "$DEV" "${NGRAM_SIZES[@]}" --repeats 20 --warmup 3)
CORPUS_BENCH=(scripts/bench_ngram.py --device "$DEV" --corpus "${NGRAM_SIZES[@]}" --repeats 20 --warmup 3)
read -r -a CORPUS_GRAPH_SIZES <<< "${GPU_CHECK_CORPUS_GRAPH_SIZES:---bs 128,1,32 --hist 1k,8k}"
CORPUS_BENCH_GRAPH=(scripts/bench_ngram.py --device "$DEV" --corpus "${CORPUS_GRAPH_SIZES[@]}" --backends triton
                    --cuda-graph --repeats 20 --warmup 3)
read -r -a STEP_SIZES <<< "${GPU_CHECK_STEP_SIZES:---bs 1,4,32,128}"
STEP_BENCH=(scripts/bench_step.py --device "$DEV" "${STEP_SIZES[@]}")
STEP_FAIR_BENCH=(scripts/bench_step.py --device "$DEV" --bs 32,128 --corpus off --fairness 2 --fairness-scope tenant)
STEP_SPLICE_BENCH=(scripts/bench_step.py --device "$DEV" --bs 32,128 --corpus off --model-splices 4)
STEP_NOPROBE_BENCH=(scripts/bench_step.py --device "$DEV" --bs 32,128 --corpus off --echo-probes 0)
NGRAM_BENCH_GRAPH=(scripts/bench_ngram.py --device "$DEV" "${NGRAM_SIZES[@]}" --backends triton --cuda-graph
                   --repeats 20 --warmup 3)

declare -a SUMMARY=()
TEST_FAILED=0
BENCH_FAILED=0

if [ "$DRY" = 0 ]; then
    mkdir -p "$OUTDIR" || exit 2
    : > "$LOG"
    : > "$RESULTS"
fi

log() {  # a line to stdout and (for a real run) the log
    if [ "$DRY" = 1 ]; then echo "$*"; else echo "$*" | tee -a "$LOG"; fi
}

remaining() { echo $(( BUDGET_S - (SECONDS - START_S) )); }

SHOW=""  # if set, printed instead of the command line of the next section (then cleared)

# run_section NAME KIND TIMEOUT_S CAPTURE_FILE ENV... -- CMD...
#   KIND: test (a failure fails the script), bench or info. CAPTURE_FILE: also keep the output there ("" = no).
run_section() {
    local name="$1" kind="$2" want="$3" capture="$4"
    shift 4
    local -a envs=()
    while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift  # the --
    local left t rc status t0 dt=0 shown
    left=$(remaining)
    t=$(( want < left ? want : left ))
    t=$(( t > 0 ? t : 0 ))
    shown="${SHOW:-$*}"
    SHOW=""
    log ""
    log "=== [$name] ($kind, timeout ${t}s of ${want}s, $(( left > 0 ? left : 0 ))s of budget left)"
    log "\$ ${envs[*]+${envs[*]} }$shown"
    if [[ "$SKIP" == *" $name "* ]]; then
        log "--- [$name] NOT RUN (GPU_CHECK_SKIP)"
        SUMMARY+=("| $name | not run (GPU_CHECK_SKIP) | 0 |")
        return 0
    fi
    if [ "$DRY" = 1 ]; then
        SUMMARY+=("| $name | dry run | 0 |")
        return 0
    fi
    if [ "$t" -le 5 ]; then
        log "--- [$name] NOT RUN: the ${BUDGET_S}s budget is spent"
        status="NOT RUN (budget spent)"
        rc=124
    else
        t0=$SECONDS
        if [ -n "$capture" ]; then
            env ${envs[@]+"${envs[@]}"} timeout --signal=TERM --kill-after=15 "$t" "$@" 2>&1 | tee -a "$LOG" \
                | tee "$capture"
        else
            env ${envs[@]+"${envs[@]}"} timeout --signal=TERM --kill-after=15 "$t" "$@" 2>&1 | tee -a "$LOG"
        fi
        rc=${PIPESTATUS[0]}
        dt=$(( SECONDS - t0 ))
        case "$rc" in
            0) status="ok" ;;
            124|137) status="TIMEOUT after ${dt}s (limit ${t}s)" ;;
            *) status="FAILED (exit $rc)" ;;
        esac
        log "--- [$name] $status in ${dt}s"
    fi
    SUMMARY+=("| $name | $status | $dt |")
    if [ "$rc" != 0 ]; then
        case "$kind" in
            test) TEST_FAILED=1 ;;
            bench) BENCH_FAILED=1 ;;
        esac
    fi
    return 0
}

note() {  # a section that is not run, with the reason (to the log and the summary)
    log ""
    log "=== [$1] NOT RUN: $2"
    SUMMARY+=("| $1 | not run: $2 | 0 |")
}

log "# sglang-hybrid GPU check  $(date -u +%Y-%m-%dT%H:%M:%SZ)  root=$ROOT"
log "device $DEV; budget ${BUDGET_S}s; log: $LOG; results: $RESULTS; python: $PY"
[ "$DRY" = 1 ] && log "DRY RUN: nothing is executed"

# ---------------------------------------------------------------------------------------------------- env
ENV_PY='
import os, sys
print("python", sys.version.split()[0], sys.executable)
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", torch.cuda.get_device_name(0), "cc", "%d.%d" % (p.major, p.minor), "SMs", p.multi_processor_count,
          "memory_GiB", round(p.total_memory / 2**30, 1))
import triton
print("triton", triton.__version__)
import numpy
print("numpy", numpy.__version__)
import importlib.metadata as md, importlib.util as iu
for mod in ("pytest", "sglang", "transformers", "tokenizers"):  # located, not imported (sglang is slow to import)
    spec = iu.find_spec(mod)
    if spec is None:
        print(mod, "NOT INSTALLED")
        continue
    try:
        ver = md.version(mod)
    except md.PackageNotFoundError:
        ver = "?"
    print(mod, ver, spec.origin)
sys.exit(0 if torch.cuda.is_available() else 3)
'
SHOW="nvidia-smi; $PY -c '<print python, torch, CUDA device, triton, numpy, pytest, sglang versions>'"
run_section env info 60 "$WORK/env.txt" -- \
    bash -c 'nvidia-smi || echo "nvidia-smi failed"; "$0" -c "$1"' "$PY" "$ENV_PY"

# ---------------------------------------------------------------------------------------------------- wheels
if compgen -G ".whl/*.whl" > /dev/null; then
    SITE="${GPU_CHECK_SITE:-/tmp/site}"
    run_section wheels info 90 "" -- "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    log "PYTHONPATH=$PYTHONPATH"
else
    note wheels "no .whl/ folder: using the image's pytest (see scripts/gpu_wheels.txt to carry one)"
fi
if [ "$DRY" = 0 ] && ! timeout 60 "$PY" -c "import pytest" > /dev/null 2>&1; then
    log "WARNING: pytest is not importable: the test sections will fail; carry wheels (scripts/gpu_wheels.txt)"
fi

# ---------------------------------------------------------------------------------------------------- tests
run_section tests_calibration test 120 "$WORK/tests_calibration.txt" "${KERNEL_ENV[@]}" -- \
    "${PYTEST[@]}" tests/test_calibration_apply.py tests/test_calibration_deferred_kernel.py \
    tests/test_calibration_online_kernel.py tests/test_calibration_agreement_kernel.py tests/test_stats_kernel.py \
    tests/test_corpus_table_kernel.py tests/test_calibration_choose.py tests/test_counters_kernel.py \
    tests/test_tail_kernel.py
run_section tests_ngram test 240 "$WORK/tests_ngram.txt" "${KERNEL_ENV[@]}" -- "${PYTEST[@]}" tests/test_ngram_*.py

# The corpus's lookup + insert as CUDA-graph replays, bs 128 first: issue 14's budget (under 30 us together)
run_section bench_corpus_graph bench 60 "$WORK/bench_corpus_graph.md" TRITON_INTERPRET="$INTERP" -- \
    "$PY" "${CORPUS_BENCH_GRAPH[@]}"
# The step replayed as CUDA graphs through sglang_hybrid/graphs.py (option step_graphs) == the eager step
run_section tests_step_graphs test 120 "$WORK/tests_step_graphs.txt" "${KERNEL_ENV[@]}" -- \
    "${PYTEST[@]}" tests/test_step_graphs.py

# ---------------------------------------------------------------------------------------------------- step
# The whole decode step (propose + record) eager and as a CUDA-graph replay, and the graph == eager check
# (a test: a graph that differs from the eager step, or fails to capture, fails the script).
run_section bench_step test 240 "$WORK/bench_step.md" TRITON_INTERPRET="$INTERP" -- "$PY" "${STEP_BENCH[@]}"
# The same with the option fairness (selection/fairness.py): its plan is a second selection per step
run_section bench_step_fair test 90 "$WORK/bench_step_fair.md" TRITON_INTERPRET="$INTERP" -- \
    "$PY" "${STEP_FAIR_BENCH[@]}"
# The same with the option model_splices 4 (calibration/splice.py): four more lookups per step; compare with the
# bench_step rows of the same batch size (corpus off)
run_section bench_step_splice test 90 "$WORK/bench_step_splice.md" TRITON_INTERPRET="$INTERP" -- \
    "$PY" "${STEP_SPLICE_BENCH[@]}"
# The same without the echo's probes (option echo_probes 0, calibration/echo.py): what the default's probe kernel
# costs; compare with the bench_step rows of the same batch size (corpus off)
run_section bench_step_noprobe test 90 "$WORK/bench_step_noprobe.md" TRITON_INTERPRET="$INTERP" -- \
    "$PY" "${STEP_NOPROBE_BENCH[@]}"
# The online calibration's apply and deferred scoring: torch against their Triton kernels, eager and graph
run_section bench_online bench 60 "$WORK/bench_online.md" TRITON_INTERPRET="$INTERP" -- \
    "$PY" scripts/bench_online.py --device "$DEV" --bs 1,4,32,128
# The penalties at every verify position (penalties.py): in place against the reference, time and peak memory
run_section bench_penalties bench 60 "$WORK/bench_penalties.md" -- \
    "$PY" scripts/bench_penalties.py --device "$DEV" --shapes 1x8x152064,8x8x152064,32x8x152064,48x16x152064
# The plugin state's device memory (memory.py), beside what the allocator handed out while it was built
run_section device_memory bench 60 "$WORK/device_memory.md" -- \
    "$PY" scripts/device_memory.py --device "$DEV" --configs 256x40960,1024x40960 --fairness-scope tenant

SEL_RUN=()
SEL_NOTES=()
# a module-level import of sglang (or of the plugin, which imports it); sglang_hybrid.* otherwise is fine
SGLANG_IMPORT_RE='^[[:space:]]*(import sglang([[:space:].,]|$)|from sglang([[:space:].]|$)'
SGLANG_IMPORT_RE+='|(from|import) sglang_hybrid\.sglang_plugin)'
HAVE_SGLANG=0
if [ "$DRY" = 0 ] && timeout 60 "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('sglang') is None)" \
        > /dev/null 2>&1; then
    HAVE_SGLANG=1
fi
for f in tests/test_selection_*.py; do
    [ -e "$f" ] || continue
    if [ "$HAVE_SGLANG" = 0 ] && grep -Eq "$SGLANG_IMPORT_RE" "$f"; then
        SEL_NOTES+=("$f: imports sglang, which is not installed here: not run")
    elif ! grep -q 'kernel_device' "$f"; then
        SEL_NOTES+=("$f: does not use the kernel_device fixture (CPU tensors only): not run on the GPU")
    else
        SEL_RUN+=("$f")
    fi
done
for n in ${SEL_NOTES[@]+"${SEL_NOTES[@]}"}; do log "tests_selection: $n"; done
if [ "${#SEL_RUN[@]}" -gt 0 ]; then
    SEL_K=()
    if [ -n "${GPU_CHECK_SELECTION_K:-}" ]; then SEL_K=(-k "$GPU_CHECK_SELECTION_K"); fi
    run_section tests_selection test 240 "$WORK/tests_selection.txt" "${KERNEL_ENV[@]}" -- \
        "${PYTEST[@]}" ${SEL_K[@]+"${SEL_K[@]}"} "${SEL_RUN[@]}"
elif compgen -G "tests/test_selection_*.py" > /dev/null; then
    note tests_selection "no selection test file can run on the GPU (see the lines above)"
else
    note tests_selection "no tests/test_selection_*.py in this tree"
fi

# ---------------------------------------------------------------------------------------------------- e2e
# (a one-second skip where sglang is absent; before the benchmarks, which take what is left of the budget)
run_section e2e test 240 "$WORK/e2e.txt" TRITON_INTERPRET="$INTERP" -- "$PY" scripts/gpu_e2e_check.py --device "$DEV"

# ---------------------------------------------------------------------------------------------------- benchmarks
run_section bench_ngram bench 110 "$WORK/bench_ngram.md" TRITON_INTERPRET="$INTERP" -- "$PY" "${NGRAM_BENCH[@]}"
run_section bench_corpus bench 90 "$WORK/bench_corpus.md" TRITON_INTERPRET="$INTERP" -- "$PY" "${CORPUS_BENCH[@]}"
run_section bench_ngram_graph bench 90 "$WORK/bench_ngram_graph.md" TRITON_INTERPRET="$INTERP" -- \
    "$PY" "${NGRAM_BENCH_GRAPH[@]}"

if [ -f scripts/bench_selection.py ]; then
    # Pass the table's axes with whichever flags the script declares (read from its --help).
    HELP_T=$(remaining); HELP_T=$(( HELP_T < 30 ? HELP_T : 30 )); HELP_T=$(( HELP_T > 1 ? HELP_T : 1 ))
    SEL_HELP="$(timeout "$HELP_T" env TRITON_INTERPRET="$INTERP" "$PY" scripts/bench_selection.py --help 2>&1 || true)"
    SEL_ARGS=()
    grep -q -- '--device' <<< "$SEL_HELP" && SEL_ARGS+=(--device "$DEV")
    grep -q -- '--bs' <<< "$SEL_HELP" && SEL_ARGS+=(--bs 1,4,32,128,512)
    for flag in --L --lens --chain-lens --lengths --max-len; do
        if grep -Eq -- "(^|[[:space:],\[])$flag([[:space:],=]|$)" <<< "$SEL_HELP"; then
            SEL_ARGS+=("$flag" 8,16,32)
            break
        fi
    done
    if [ -z "$SEL_HELP" ] && [ "$DRY" = 1 ]; then log "(dry run: bench_selection.py --help gave nothing)"; fi
    run_section bench_selection bench 180 "$WORK/bench_selection.md" TRITON_INTERPRET="$INTERP" -- \
        "$PY" scripts/bench_selection.py ${SEL_ARGS[@]+"${SEL_ARGS[@]}"}
else
    note bench_selection "scripts/bench_selection.py is not in this tree"
fi


# ---------------------------------------------------------------------------------------------------- summary
TOTAL=$(( SECONDS - START_S ))
if [ "$TEST_FAILED" = 0 ]; then VERDICT="PASS"; else VERDICT="FAIL"; fi
[ "$BENCH_FAILED" = 1 ] && VERDICT="$VERDICT (a benchmark failed)"
{
    echo "# sglang-hybrid GPU check: $VERDICT"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), ${TOTAL}s in all (budget ${BUDGET_S}s)."
    if [ -s "$WORK/env.txt" ]; then echo; echo '```'; grep -Ev '^\s*$' "$WORK/env.txt" | head -n 60; echo '```'; fi
    echo
    echo "| section | status | seconds |"
    echo "|---|---|---:|"
    printf '%s\n' "${SUMMARY[@]}"
    for n in ${SEL_NOTES[@]+"${SEL_NOTES[@]}"}; do echo "- tests_selection: $n"; done
    for sec in tests_calibration tests_ngram tests_step_graphs tests_selection; do
        if [ -s "$WORK/$sec.txt" ]; then
            echo; echo "## $sec (pytest summary)"; echo; echo '```'
            grep -E '(passed|failed|error|skipped)( |,|$)|^(FAILED|ERROR) ' "$WORK/$sec.txt" | tail -n 40
            echo '```'
        fi
    done
    for b in bench_step bench_step_fair bench_step_splice bench_step_noprobe bench_online bench_corpus_graph bench_ngram bench_corpus bench_ngram_graph bench_selection; do
        if [ -s "$WORK/$b.md" ]; then echo; echo "## $b"; echo; cat "$WORK/$b.md"; fi
    done
    if [ -s "$WORK/e2e.txt" ]; then echo; echo "## e2e"; echo; echo '```'; tail -n 30 "$WORK/e2e.txt"; echo '```'; fi
} > "$WORK/results.md"
if [ "$DRY" = 1 ]; then
    echo ""
    echo "=== summary (dry run)"
    printf '%s\n' "${SUMMARY[@]}"
    echo "RESULT: dry run, nothing executed"
    exit 0
fi
cp "$WORK/results.md" "$RESULTS"
log ""
log "=== summary"
printf '%s\n' "${SUMMARY[@]}" | tee -a "$LOG"
log "RESULT: $VERDICT in ${TOTAL}s; summary and tables in $RESULTS"
[ "$TEST_FAILED" = 0 ]
