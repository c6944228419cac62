#!/usr/bin/env python3
"""Soak HYBRID_SPARK's launch_server on CPU: SGLang's bench_serving above capacity, plus random client aborts.

    python scripts/soak_server.py [--num-prompts 96] [--request-rate 4] [--abort-every 3.0] [--out soak.json]

Starts a HYBRID_SPARK server (stand-alone draft; the tiny models of the e2e tests) and a plain one
(``tests/e2e/server_harness.py``). Against the HYBRID_SPARK server it runs ``python -m sglang.benchmark.serving
--backend sglang --dataset-name random-ids`` at ``--request-rate`` requests/s (above what the CPU serves, so the
queue grows) while another thread, every ~``--abort-every`` seconds, opens a streaming request and disconnects
after 1-3 chunks. It then checks, and prints as one JSON line:

* no error: every bench request succeeded, the server stayed healthy;
* no stuck request: the server is idle within 60 s of the end;
* every completed output equals the plain server's (the same bench command, same seed, against the plain
  server) and every aborted request's partial output is a prefix of the plain server's;
* token usage back to idle: ``/v1/loads`` ``num_used_tokens`` after ``/flush_cache`` equals its value before.

Exit status 0 when all hold. Traffic goes to 127.0.0.1 only; both servers are killed (process group) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

from server_harness import HOST, Server, ServerConfig  # noqa: E402
from tiny_models import build_tiny_models  # noqa: E402

ABORT_PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add",
    "The quick brown fox jumps over the lazy dog",
    "It was the best of times, it was the worst of times",
    "for i in range(10):\n    print(i)",
]


def bench(srv: Server, models, args, out_file: str) -> dict:
    argv = [
        sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--host", HOST,
        "--port", str(srv.port), "--dataset-name", "random-ids", "--num-prompts", str(args.num_prompts),
        "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
        "--random-range-ratio", "0.5", "--tokenizer", models.tokenizer, "--model", models.target,
        "--output-file", out_file, "--output-details", "--request-rate", str(args.request_rate), "--seed", "7",
        "--disable-tqdm", "--warmup-requests", "0",
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"bench_serving failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    with open(out_file) as f:
        return json.loads(f.read().strip().splitlines()[-1])


def loads(srv: Server) -> dict:
    return srv.get("/v1/loads")["loads"][0]


def wait_idle(srv: Server, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ld = loads(srv)
        if ld["num_running_reqs"] == 0 and ld["num_waiting_reqs"] == 0:
            return True
        time.sleep(0.5)
    return False


class Aborter(threading.Thread):
    """Every ~``every`` s: a streaming request that the client drops after 1-3 chunks."""

    def __init__(self, srv: Server, every: float, seed: int = 0) -> None:
        super().__init__(daemon=True)
        self.srv, self.every, self.rng = srv, every, random.Random(seed)
        self.stop = threading.Event()
        self.records: list = []  # (prompt index, max_new_tokens, partial output ids)
        self.errors: list = []

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(0.5, 1.5) * self.every):
            i = self.rng.randrange(len(ABORT_PROMPTS))
            n_chunks = self.rng.randint(1, 3)
            sp = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
            try:
                stream = self.srv.stream("/generate", {"text": ABORT_PROMPTS[i], "sampling_params": sp}, timeout_s=600)
                last = None
                for k, ev in enumerate(stream):
                    last = ev
                    if k + 1 >= n_chunks:
                        break
                stream.close()
                self.records.append((i, list(last["output_ids"]) if last else []))
            except Exception as e:  # noqa: BLE001
                self.errors.append(repr(e))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=96)
    ap.add_argument("--request-rate", type=float, default=4.0)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--abort-every", type=float, default=3.0)
    ap.add_argument("--timeout", type=float, default=1500.0, help="bound on each bench_serving run (s)")
    ap.add_argument("--out", default=None, help="also write the JSON summary here")
    args = ap.parse_args(argv)

    models = build_tiny_models()
    hybrid_cfg = ServerConfig("hybrid_spark", algorithm="HYBRID_SPARK", draft="standalone")
    servers = []
    summary: dict = {"num_prompts": args.num_prompts, "request_rate": args.request_rate}
    ok = True
    try:
        hybrid = Server.start(hybrid_cfg, models)
        servers.append(hybrid)
        summary["start_s"] = round(hybrid.start_s, 1)
        idle = wait_idle(hybrid, 60) and hybrid.post("/flush_cache", {}) is not None and loads(hybrid)
        aborter = Aborter(hybrid, args.abort_every)
        t0 = time.monotonic()
        aborter.start()
        try:
            res = bench(hybrid, models, args, os.path.join(hybrid.workdir, "bench.jsonl"))
        finally:
            aborter.stop.set()
            aborter.join(120)
        summary["duration_s"] = round(time.monotonic() - t0, 1)
        summary["completed"] = res["completed"]
        summary["failures"] = sum(1 for e in res["errors"] if e)
        summary["aborts"] = len(aborter.records)
        summary["abort_client_errors"] = aborter.errors
        summary["accept_length"] = res.get("accept_length")
        summary["output_throughput_tok_s"] = round(res["output_throughput"], 2)
        summary["request_throughput_req_s"] = round(res["request_throughput"], 3)
        summary["mean_e2e_latency_s"] = round(res["mean_e2e_latency_ms"] / 1000, 1)
        summary["max_concurrent_requests"] = res.get("max_concurrent_requests")
        summary["idle_within_60s"] = wait_idle(hybrid, 60)
        hybrid.post("/flush_cache", {})
        after = loads(hybrid)
        summary["used_tokens_idle_before_after"] = [idle["num_used_tokens"], after["num_used_tokens"]]
        summary["healthy"] = hybrid.request("GET", "/health")[0] == 200
        summary["hybrid_spark"] = hybrid.internal_state().get("hybrid_spark")
        hybrid.stop()
        servers.remove(hybrid)

        plain = Server.start(ServerConfig("plain"), models)
        servers.append(plain)
        ref = bench(plain, models, args, os.path.join(plain.workdir, "bench.jsonl"))
        same = [a == b for a, b in zip(res["generated_texts"], ref["generated_texts"])]
        summary["outputs_equal_plain"] = f"{sum(same)}/{len(same)}"
        prefix_ok = 0
        for i, partial in aborter.records:
            full = plain.post("/generate", {"text": ABORT_PROMPTS[i], "sampling_params": {
                "temperature": 0, "max_new_tokens": 48, "ignore_eos": True}})["output_ids"]
            prefix_ok += full[: len(partial)] == partial
        summary["aborted_partials_prefix_of_plain"] = f"{prefix_ok}/{len(aborter.records)}"
        ok = (
            summary["completed"] == args.num_prompts and summary["failures"] == 0 and not aborter.errors
            and summary["aborts"] > 0 and summary["idle_within_60s"] and summary["healthy"]
            and all(same) and len(same) == args.num_prompts and prefix_ok == len(aborter.records)
            and after["num_used_tokens"] == idle["num_used_tokens"]
        )
    finally:
        for srv in servers:
            srv.kill()
    summary["ok"] = ok
    line = json.dumps(summary)
    print(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
