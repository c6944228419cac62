#!/usr/bin/env python
"""GPU benchmark: DSPARK vs NGRAM vs HYBRID_SPARK served by SGLang on the code-edit and chat workloads.

For each policy it launches ``python -m sglang.launch_server`` with the same target (DSPARK with its DSpark draft
model; ``hybrid``: HYBRID_SPARK on the same DSpark draft, same SPS table and ragged mode; ``hybrid_eagle``:
HYBRID_SPARK on an EAGLE-family draft model, ``--hybrid-draft-model``, run when that is given), runs ``python -m sglang.benchmark.serving`` on both workloads (converted
to SGLang's ``custom`` dataset format) at each concurrency, temperature 0, then shuts the server down (also on
failure or Ctrl-C: every server runs in its own process group, killed on exit). It collects output throughput
and accept length into a table (stdout + ``OUT/results.json``) and a PNG of the ratios (``OUT/ratios.png``).

    python scripts/bench_serving.py --model /models/Qwen3-8B --draft-model /models/dspark_qwen3_8b_block7 \\
        --sps-table sps_8b.json --hybrid-max-draft 16 --out bench_out \
        [--hybrid-draft-model /models/eagle3_qwen3_8b]

``--dry-run`` (CPU, no GPU, nothing started): prints every command and checks them: the server flags against
SGLang's own ``ServerArgs`` parser, the benchmark flags against ``sglang.benchmark.serving``'s argparse, the
converted datasets against SGLang's ``custom`` loader, and that HYBRID_SPARK resolves through the plugin.

Notes. DSPARK schedules per-request verify lengths only in a ragged-verify mode, so its server runs with
``SGLANG_RAGGED_VERIFY_MODE=compact`` (``--ragged-mode``); give it a measured SPS table (``--sps-table``, made with
``python -m sglang.benchmark.dspark_sps_profiler``) or its budget degenerates to verify-all. The same table and mode
go to HYBRID_SPARK on DSpark (its selection prices with it, and DSpark's planner budgets the merged chains), not to
``hybrid_eagle``: an EAGLE-family verify has a fixed window, where a budget never pays. Every server gets
``--max-running-requests`` = the largest concurrency (SGLang's speculative defaults cap it at 48).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORKLOADS = ROOT / "sglang_hybrid" / "data" / "workloads"
WORKLOADS = {"code-edit": "code_edit.jsonl", "chat": "chat.jsonl"}
POLICIES = ("dspark", "ngram", "hybrid", "hybrid_eagle")
ALGORITHM = {"dspark": "DSPARK", "ngram": "NGRAM", "hybrid": "HYBRID_SPARK", "hybrid_eagle": "HYBRID_SPARK"}

_RUNNING: list[subprocess.Popen] = []


@dataclass
class Plan:
    """Every command of a run: servers (argv + env) and benchmark invocations."""

    servers: dict = field(default_factory=dict)  # policy -> (argv, extra env)
    benches: list = field(default_factory=list)  # (policy, kind, concurrency, argv)
    datasets: dict = field(default_factory=dict)  # kind -> converted dataset path


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="target model path (HF dir or repo id)")
    p.add_argument("--draft-model", required=True, help="DSpark draft model (DSPARK and HYBRID_SPARK)")
    p.add_argument("--hybrid-draft-model", default=None,
                   help="EAGLE / EAGLE-3 / stand-alone draft model: adds the hybrid_eagle policy")
    p.add_argument("--tokenizer", default=None, help="tokenizer for the benchmark client (default: --model)")
    p.add_argument("--workloads", default=str(DEFAULT_WORKLOADS), help="directory with code_edit.jsonl, chat.jsonl")
    p.add_argument("--concurrency", default="4,32,128", help="comma list of max concurrencies")
    p.add_argument("--num-prompts", type=int, default=0,
                   help="prompts per run (0: min(dataset, max(4 x concurrency, 32)))")
    p.add_argument("--policies", default=None,
                   help="comma list from dspark,ngram,hybrid,hybrid_eagle (default: dspark,ngram,hybrid, plus "
                        "hybrid_eagle with --hybrid-draft-model)")
    p.add_argument("--sps-table", default=None, help="SPS table JSON for DSPARK's budget")
    p.add_argument("--ngram-draft-tokens", type=int, default=12, help="NGRAM --speculative-num-draft-tokens")
    p.add_argument("--hybrid-steps", type=int, default=7, help="hybrid_eagle --speculative-num-steps (gamma)")
    p.add_argument("--hybrid-max-draft", type=int, default=0,
                   help="HYBRID_SPARK n-gram chain length (SGLANG_HYBRID_MAX_DRAFT); above the model chain (the "
                        "DSpark block, or --hybrid-steps) it widens the verify window")
    p.add_argument("--ragged-mode", default="compact", help="SGLANG_RAGGED_VERIFY_MODE for DSPARK and hybrid")
    p.add_argument("--hybrid-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the HYBRID_SPARK server (e.g. SGLANG_HYBRID_DRAFT_KIND=dspark)")
    p.add_argument("--extra-server-args", default="", help="appended to every server command (shell-quoted)")
    p.add_argument("--no-chat-template", action="store_true", help="send raw prompts (base models)")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds to wait for a server")
    p.add_argument("--bench-timeout", type=float, default=3600.0, help="seconds per benchmark run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="bench_out", help="output directory")
    p.add_argument("--dry-run", action="store_true", help="print and check the commands; start nothing")
    a = p.parse_args(argv)
    if a.policies is None:
        a.policies = "dspark,ngram,hybrid" + (",hybrid_eagle" if a.hybrid_draft_model else "")
    if "hybrid_eagle" in a.policies.split(",") and not a.hybrid_draft_model:
        p.error("policy hybrid_eagle needs --hybrid-draft-model (an EAGLE-family draft)")
    return a


# --------------------------------------------------------------------------------------------- datasets

def convert_workload(src: Path, dst: Path) -> int:
    """Our JSONL ({id, kind, prompt, output}) -> SGLang's custom dataset ({"conversations": [user, assistant]})."""
    sys.path.insert(0, str(ROOT))
    from sglang_hybrid.sim.jsonl import read_workload

    recs = read_workload(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with dst.open("w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps({"id": r.id, "conversations": [{"role": "user", "content": r.prompt},
                                                               {"role": "assistant", "content": r.output}]},
                               ensure_ascii=False) + "\n")
    return len(recs)


# --------------------------------------------------------------------------------------------- commands

def server_command(policy: str, a: argparse.Namespace, port: int, max_running: int) -> tuple[list[str], dict]:
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", a.model, "--host", "127.0.0.1",
            "--port", str(port), "--random-seed", "0", "--max-running-requests", str(max_running),
            "--speculative-algorithm", ALGORITHM[policy]]
    env: dict[str, str] = {}
    if policy in ("dspark", "hybrid"):
        argv += ["--speculative-draft-model-path", a.draft_model]
        if a.sps_table:
            argv += ["--speculative-dspark-sps-table-path", a.sps_table]
        env["SGLANG_RAGGED_VERIFY_MODE"] = a.ragged_mode
    if policy == "ngram":
        argv += ["--speculative-num-draft-tokens", str(a.ngram_draft_tokens)]
    if policy == "hybrid_eagle":
        argv += ["--speculative-draft-model-path", a.hybrid_draft_model,
                 "--speculative-num-steps", str(a.hybrid_steps)]
    if policy in ("hybrid", "hybrid_eagle"):
        if a.hybrid_max_draft:
            env["SGLANG_HYBRID_MAX_DRAFT"] = str(a.hybrid_max_draft)
        for kv in a.hybrid_env:
            k, sep, v = kv.partition("=")
            if not sep or not k:
                raise SystemExit(f"--hybrid-env: expected KEY=VALUE, got {kv!r}")
            env[k] = v
    argv += shlex.split(a.extra_server_args)
    return argv, env


def bench_command(a: argparse.Namespace, port: int, dataset: Path, n: int, conc: int, out_file: Path,
                  tag: str) -> list[str]:
    argv = [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--host", "127.0.0.1",
            "--port", str(port), "--model", a.model, "--tokenizer", a.tokenizer or a.model,
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--num-prompts", str(n),
            "--max-concurrency", str(conc), "--temperature", "0", "--seed", str(a.seed),
            "--output-file", str(out_file), "--tag", tag, "--warmup-requests", "2", "--disable-tqdm"]
    if not a.no_chat_template:
        argv.append("--apply-chat-template")
    return argv


def make_plan(a: argparse.Namespace, out: Path) -> Plan:
    concs = [int(c) for c in a.concurrency.split(",") if c.strip()]
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies or not concs or min(concs) < 1:
        raise SystemExit(f"bad --policies/--concurrency: {a.policies!r} / {a.concurrency!r}")
    plan = Plan()
    sizes = {}
    for kind, name in WORKLOADS.items():
        dst = out / f"sglang_custom_{name}"
        sizes[kind] = convert_workload(Path(a.workloads) / name, dst)
        plan.datasets[kind] = dst
    for i, pol in enumerate(policies):
        port = a.port + i
        plan.servers[pol] = (*server_command(pol, a, port, max(concs)), port)
        for kind, ds in plan.datasets.items():
            for c in concs:
                n = a.num_prompts or min(sizes[kind], max(4 * c, 32))
                plan.benches.append((pol, kind, c, bench_command(a, port, ds, n, c, out / "raw.jsonl",
                                                                 f"{pol}|{kind}|{c}")))
    return plan


# --------------------------------------------------------------------------------------------- dry-run checks

def check_server_argv(argv: list[str]) -> None:
    """Parse the server flags with SGLang's own ServerArgs parser (nothing is constructed or started)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    i = argv.index("sglang.launch_server") + 1
    ns = parser.parse_args(argv[i:])
    if ns.speculative_algorithm is None or ns.max_running_requests is None:
        raise ValueError("server command lost its --speculative-algorithm / --max-running-requests")


def check_bench_argv(argv: list[str]) -> argparse.Namespace:
    """Run sglang.benchmark.serving's own CLI parser on the flags, capturing instead of benchmarking."""
    import sglang.benchmark.serving as serving

    captured = {}
    saved_run, saved_argv = serving.run_benchmark, sys.argv
    serving.run_benchmark = lambda args: captured.setdefault("args", args)
    try:
        sys.argv = ["sglang.benchmark.serving"] + argv[argv.index("sglang.benchmark.serving") + 1:]
        serving.cli_main()
    finally:
        serving.run_benchmark, sys.argv = saved_run, saved_argv
    if "args" not in captured:
        raise ValueError("the benchmark parser did not accept the command")
    return captured["args"]


def check_dataset(path: Path, n: int) -> int:
    """Load a converted dataset with SGLang's own custom-dataset sampler (our tokenizer stands in)."""
    from sglang.benchmark.datasets.custom import sample_custom_requests

    sys.path.insert(0, str(ROOT))
    from sglang_hybrid.tokenizer import load_tokenizer

    tok = load_tokenizer()

    class _Tok:  # the sampler only calls encode() (no chat template in this check)
        bos_token = None

        def encode(self, text: str) -> list[int]:
            return tok.encode(text, add_special_tokens=False).ids

    rows = sample_custom_requests(str(path), n, _Tok(), apply_chat_template=False)
    if len(rows) < min(n, 1):
        raise ValueError(f"SGLang's custom loader read no rows from {path}")
    return len(rows)


def check_plugin() -> None:
    """HYBRID_SPARK must resolve through SGLang's plugin registry."""
    sys.path.insert(0, str(ROOT))
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_hybrid.sglang_plugin.plugin import register

    register()
    SpeculativeAlgorithm.from_string("HYBRID_SPARK")


def dry_run(a: argparse.Namespace, plan: Plan) -> int:
    problems = []
    for pol, (argv, env, port) in plan.servers.items():
        print(f"# server {pol} (port {port})")
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + (" " if env else "") + shlex.join(argv))
        try:
            check_server_argv(argv)
        except BaseException as e:  # argparse exits on error
            problems.append(f"server {pol}: {e!r}")
    for pol, kind, c, argv in plan.benches:
        print(f"# bench {pol} {kind} concurrency {c}")
        print(shlex.join(argv))
        try:
            args = check_bench_argv(argv)
            if args.dataset_name != "custom" or args.max_concurrency != c or args.temperature != 0:
                problems.append(f"bench {pol}/{kind}/{c}: parsed arguments differ from the plan")
        except BaseException as e:
            problems.append(f"bench {pol}/{kind}/{c}: {e!r}")
    for kind, ds in plan.datasets.items():
        try:
            print(f"# dataset {kind}: {ds} ({check_dataset(ds, 8)} rows sampled by SGLang's custom loader)")
        except BaseException as e:
            problems.append(f"dataset {kind}: {e!r}")
    if "hybrid" in plan.servers:
        try:
            check_plugin()
            print("# HYBRID_SPARK resolves through SGLang's plugin registry")
        except BaseException as e:
            problems.append(f"plugin: {e!r}")
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    print("dry run: " + ("all commands check out" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


# --------------------------------------------------------------------------------------------- real run

def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_all(*_args) -> None:
    while _RUNNING:
        _kill(_RUNNING.pop())


def _wait_ready(proc: subprocess.Popen, port: int, timeout: float, log: Path) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"server exited with code {proc.returncode} during start-up:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=30) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(5)
    raise RuntimeError(f"server on port {port} not ready after {timeout:.0f}s (log: {log})")


def run(a: argparse.Namespace, plan: Plan, out: Path) -> int:
    atexit.register(_kill_all)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *x: (_kill_all(), sys.exit(130)))
    failures = []
    for pol, (argv, env, port) in plan.servers.items():
        log = out / f"server_{pol}.log"
        print(f"starting {pol}: {shlex.join(argv)}", flush=True)
        with log.open("w") as lf:
            proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=lf, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        _RUNNING.append(proc)
        try:
            _wait_ready(proc, port, a.startup_timeout, log)
            for p2, kind, c, bargv in plan.benches:
                if p2 != pol:
                    continue
                print(f"  bench {kind} concurrency {c}", flush=True)
                r = subprocess.run(bargv, timeout=a.bench_timeout, capture_output=True, text=True)
                (out / f"bench_{pol}_{kind}_{c}.log").write_text(r.stdout + r.stderr)
                if r.returncode != 0:
                    failures.append(f"{pol}/{kind}/{c}: benchmark exited {r.returncode}")
        except Exception as e:  # keep going with the other policies; the server is shut down below
            failures.append(f"{pol}: {e}")
        finally:
            _kill(proc)
            if proc in _RUNNING:
                _RUNNING.remove(proc)
    rows = collect(out / "raw.jsonl")
    report(rows, out)
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


def collect(raw: Path) -> list[dict]:
    """One row per (policy, workload, concurrency) from the benchmark's output file (tagged lines)."""
    rows = []
    if not raw.exists():
        return rows
    for line in raw.read_text().splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        tag = str(d.get("tag", ""))
        if tag.count("|") != 2:
            continue
        pol, kind, c = tag.split("|")
        rows.append({"policy": pol, "kind": kind, "concurrency": int(c),
                     "output_throughput": d.get("output_throughput"), "accept_length": d.get("accept_length")})
    return rows


def report(rows: list[dict], out: Path) -> None:
    by = {(r["policy"], r["kind"], r["concurrency"]): r for r in rows}
    runs = []
    print(f"{'workload':<10}{'conc':>6}" + "".join(f"{p + ' tok/s':>14}{'acc':>6}" for p in POLICIES)
          + f"{'hyb/dspark':>12}{'hyb/ngram':>11}")
    for kind, c in sorted({(k, c) for _, k, c in by}):
        line = f"{kind:<10}{c:>6}"
        tp = {}
        for p in POLICIES:
            r = by.get((p, kind, c))
            tp[p] = r["output_throughput"] if r else None
            acc = r.get("accept_length") if r else None
            line += f"{(f'{tp[p]:.0f}' if tp[p] else '-'):>14}{(f'{acc:.2f}' if acc else '-'):>6}"
        ratios = {f"hybrid_over_{o}": tp["hybrid"] / tp[o] for o in ("dspark", "ngram") if tp["hybrid"] and tp[o]}
        line += "".join(f"{(f'{ratios[k]:.3f}' if k in ratios else '-'):>{w}}"
                        for k, w in (("hybrid_over_dspark", 12), ("hybrid_over_ngram", 11)))
        print(line)
        runs.append({"kind": kind, "batch_size": c, "ratios": ratios})
    (out / "results.json").write_text(json.dumps({"rows": rows, "ratios": runs}, indent=1))
    if any(r["ratios"] for r in runs):
        sys.path.insert(0, str(ROOT))
        from sglang_hybrid.sim.plot import plot_ratios

        plot_ratios(runs, out / "ratios.png", title="Hybrid Spark on SGLang (measured, temperature 0)")
        print(f"plot: {out / 'ratios.png'}")


def main(argv: Optional[list[str]] = None) -> int:
    a = parse_args(argv)
    if a.dry_run:
        with tempfile.TemporaryDirectory(prefix="bench_dry_") as tmp:
            return dry_run(a, make_plan(a, Path(tmp)))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    return run(a, make_plan(a, out), out)


if __name__ == "__main__":
    raise SystemExit(main())
