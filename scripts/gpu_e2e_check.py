#!/usr/bin/env python
"""End-to-end check: HYBRID_SPARK's greedy output equals plain decoding, on a tiny model, with SGLang.

Builds the tiny deterministic models of ``tests/e2e/tiny_models.py`` (a 2-layer Llama target and a 1-layer
stand-alone draft, random but structured weights, built locally: nothing is downloaded), then starts one
``sglang.Engine`` for plain decoding and two with ``--speculative-algorithm HYBRID_SPARK`` (stand-alone draft
model plus the n-gram drafter; verify windows 4 and 9, the second with n-gram chains past the 3-token model
chain, then 9 narrowed to 4 while more than 2 requests run), then SGLang's DSPARK and HYBRID_SPARK on the tiny
DSpark draft (``tests/e2e/tiny_dspark.py``, block 3) in the static verify mode and, with an SPS table, in the compact
(ragged) mode with a window of 8 (n-gram chains past the DSpark block), each in its own subprocess; decodes the
same prompts greedily (some with repeated spans, so the n-gram chain gets chosen) and compares the output token ids
exactly. On CUDA, the DSpark draft runs in SGLang's draft CUDA graph and the target verify in its (token-bucket)
verify graphs; HYBRID_SPARK's merge runs eagerly between the two (it is not captured into a graph yet).

Where SGLang is not importable (the lent GPU machine has none) it prints ``skipped: sglang not installed`` and
exits 0: nothing is faked. Exit status otherwise: 0 all outputs equal, 1 a mismatch, 2 set-up error (the
plugin's entry point is not installed, the tiny models cannot be built, an engine fails to start).

    python scripts/gpu_e2e_check.py --device cuda          # on a GPU machine with sglang and this package
    python scripts/gpu_e2e_check.py --device cpu           # the same on a CPU (SGLang's CPU engine; slow)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
E2E_DIR = os.path.join(ROOT, "tests", "e2e")
STUB_DIR = os.path.join(ROOT, "tests", "sgl_kernel_stub")

PROMPT_TEXTS = [
    # repeated spans: the n-gram drafter finds long matches
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(",
    "for i in range(10):\n    print(i, add(i, i))\nfor i in range(10):\n    print(i, add(i, i))\nfor i in",
    "It was the best of times, it was the worst of times, it was the best of times, it was",
    # little repetition: the model chain
    "The quick brown fox jumps over the lazy dog while the cat sleeps",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12",
    "import os, sys, json\nwith open(\"data.json\") as f:",
]


SPS_TABLE = os.path.join(E2E_DIR, "data", "sps_cpu.json")  # a step of B tokens costs 1 + 0.15 B: budgets bind


def _engine_kwargs(device: str, models: Any, algorithm: str | None, dtype: str, window: int | None = 4,
                   draft: str = "standalone", mode: str = "static") -> Dict[str, Any]:
    """``sglang.Engine`` keyword arguments for a plain (``algorithm=None``) or speculative run."""
    if device == "cpu":
        sys.path.insert(0, E2E_DIR)
        from engine_harness import BASE_ENGINE_KWARGS  # the CPU-engine recipe of the test suite

        kw: Dict[str, Any] = dict(BASE_ENGINE_KWARGS)
    else:
        kw = dict(
            device=device,
            dtype=dtype,
            attention_backend="triton",  # head_dim 16: the tiny model is too small for FlashInfer's kernels
            sampling_backend="pytorch",
            grammar_backend="none",
            mem_fraction_static=0.3,
            max_total_tokens=32768,
            cuda_graph_max_bs_decode=8,  # CUDA graphs on (the decode step must be capturable), few batch sizes
            random_seed=0,
            log_level="error",
        )
    kw["model_path"] = models.target
    if algorithm is not None and draft == "dspark":
        from tiny_dspark import build_tiny_dspark

        kw.update(speculative_algorithm=algorithm, speculative_draft_model_path=build_tiny_dspark(models, gamma=3))
        if mode != "static":
            kw["speculative_dspark_sps_table_path"] = SPS_TABLE
    elif algorithm is not None:
        kw.update(
            speculative_algorithm=algorithm,
            speculative_draft_model_path=models.standalone,
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=window,  # > steps + 1: n-gram chains past the model chain
        )
    return kw


# (name, algorithm, verify window, plugin env, draft, DSpark verify mode): plain, HYBRID_SPARK with SGLang's window,
# a window widened to 9, and the widened window narrowed to 4 while more than 2 requests run (the 6 prompts start
# narrow, widen later); then DSpark: SGLang's DSPARK and HYBRID_SPARK, static, and HYBRID_SPARK compact with
# n-gram chains of up to 7 tokens (window 8) against the 3-token DSpark block.
RUNS = (
    ("plain", None, 4, {}, "standalone", "static"),
    ("hybrid_spark", "HYBRID_SPARK", 4, {}, "standalone", "static"),
    ("hybrid_spark_wide", "HYBRID_SPARK", 9, {}, "standalone", "static"),
    ("hybrid_spark_switch", "HYBRID_SPARK", 9, {"SGLANG_HYBRID_NARROW_ABOVE": "2"}, "standalone", "static"),
    ("dspark", "DSPARK", None, {"SGLANG_RAGGED_VERIFY_MODE": "static"}, "dspark", "static"),
    ("hybrid_dspark", "HYBRID_SPARK", None, {"SGLANG_RAGGED_VERIFY_MODE": "static"}, "dspark", "static"),
    ("hybrid_dspark_compact", "HYBRID_SPARK", None,
     {"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_HYBRID_MAX_DRAFT": "7"}, "dspark", "compact"),
)


def _child_env(device: str) -> Dict[str, str]:
    env = dict(os.environ)
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(([STUB_DIR] if device == "cpu" else []) + [ROOT, E2E_DIR] + inherited)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device == "cpu":
        sys.path.insert(0, E2E_DIR)
        from engine_harness import ENGINE_ENV

        env.update(ENGINE_ENV)
    else:
        env["TRITON_INTERPRET"] = "0"
    env.setdefault("SGLANG_PLUGINS", "hybrid_spark")
    return env


def run_engine(spec_file: str, out_file: str) -> int:
    """Child process: start one engine from the JSON spec, generate greedily, write the outputs as JSON."""
    with open(spec_file) as f:
        spec = json.load(f)
    import sglang

    if spec["device"] == "cpu":
        from sglang_hybrid.sglang_plugin.cpu_compat import apply_cpu_compat

        apply_cpu_compat()
    t0 = time.perf_counter()
    engine = sglang.Engine(**spec["kwargs"])
    start_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        outs = engine.generate(
            input_ids=spec["prompts"],
            sampling_params=[{"temperature": 0.0, "max_new_tokens": spec["max_new_tokens"], "ignore_eos": True}]
            * len(spec["prompts"]),
        )
        gen_s = time.perf_counter() - t0
        outs = outs if isinstance(outs, list) else [outs]
        metas = [o.get("meta_info") or {} for o in outs]
        verify_ct = sum(int(m.get("spec_verify_ct") or 0) for m in metas)
        tokens = sum(len(o["output_ids"]) for o in outs)
        res = {
            "output_ids": [list(o["output_ids"]) for o in outs],
            "start_s": start_s,
            "gen_s": gen_s,
            # output tokens per verify step (meta_info spec_verify_ct); None for plain decoding
            "tokens_per_step": round(tokens / verify_ct, 3) if verify_ct else None,
        }
    finally:
        engine.shutdown()
    with open(out_file, "w") as f:
        json.dump(res, f)
    return 0


def _launch(name: str, spec: Dict[str, Any], tmp: str, timeout_s: float) -> Dict[str, Any]:
    spec_file = os.path.join(tmp, f"{name}.spec.json")
    out_file = os.path.join(tmp, f"{name}.out.json")
    with open(spec_file, "w") as f:
        json.dump(spec, f)
    cmd = [sys.executable, os.path.abspath(__file__), "--run-engine", spec_file, out_file]
    print(f"[{name}] starting engine: {json.dumps({k: v for k, v in spec['kwargs'].items() if k != 'model_path'})}",
          flush=True)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env={**_child_env(spec["device"]), **spec.get("env", {})}, timeout=timeout_s, cwd=ROOT)
    if p.returncode != 0 or not os.path.isfile(out_file):
        raise RuntimeError(f"[{name}] engine run failed (exit {p.returncode}); see its output above")
    with open(out_file) as f:
        res = json.load(f)
    print(f"[{name}] done in {time.perf_counter() - t0:.1f}s (engine start {res['start_s']:.1f}s, generate "
          f"{res['gen_s']:.2f}s, tokens per verify step {res['tokens_per_step']})", flush=True)
    return res


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="float32", help="model dtype on CUDA (float32 keeps greedy margins exact)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per engine run")
    p.add_argument("--run-engine", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run_engine:
        return run_engine(*args.run_engine)

    if importlib.util.find_spec("sglang") is None:
        print("gpu_e2e_check: skipped: sglang not installed (nothing run; the HYBRID_SPARK end-to-end check needs "
              "SGLang 0.5.23 and this package installed)")
        return 0
    import importlib.metadata as md

    names = [e.name for e in md.entry_points(group="sglang.srt.plugins")]
    if "hybrid_spark" not in names:
        print("gpu_e2e_check: SET-UP ERROR: the 'hybrid_spark' entry point (group sglang.srt.plugins) is not "
              "installed, so SGLang's spawned processes cannot register HYBRID_SPARK; run "
              "`pip install --no-deps --no-build-isolation -e .` in the repository first")
        return 2
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu_e2e_check: SET-UP ERROR: --device cuda but torch.cuda.is_available() is False")
            return 2
    sys.path.insert(0, E2E_DIR)
    try:
        from tiny_models import build_tiny_models, encode
    except Exception as e:  # noqa: BLE001
        print(f"gpu_e2e_check: SET-UP ERROR: cannot import tests/e2e/tiny_models.py: {type(e).__name__}: {e}")
        return 2

    with tempfile.TemporaryDirectory(prefix="gpu_e2e_") as tmp:
        cache = os.environ.get("SGLANG_HYBRID_TEST_CACHE") or os.path.join(tmp, "models")
        t0 = time.perf_counter()
        models = build_tiny_models(cache)
        prompts = encode(models, PROMPT_TEXTS)
        print(f"tiny models in {models.root} ({time.perf_counter() - t0:.1f}s); {len(prompts)} prompts of "
              f"{[len(x) for x in prompts]} tokens, {args.max_new_tokens} new tokens each, greedy", flush=True)
        results = {}
        try:
            for name, algo, window, env, draft, mode in RUNS:
                spec = dict(device=args.device, prompts=prompts, max_new_tokens=args.max_new_tokens,
                            kwargs=_engine_kwargs(args.device, models, algo, args.dtype, window, draft, mode), env=env)
                results[name] = _launch(name, spec, tmp, args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"gpu_e2e_check: SET-UP ERROR: {e}")
            return 2

    plain = results["plain"]["output_ids"]
    bad = 0
    for name in [r[0] for r in RUNS[1:]]:
        hybrid = results[name]["output_ids"]
        for i, (a, b) in enumerate(zip(plain, hybrid)):
            if a != b:
                bad += 1
                j = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
                print(f"MISMATCH {name} prompt {i}: first difference at output token {j}: plain {a[j:j + 8]} vs "
                      f"{b[j:j + 8]} (lengths {len(a)} / {len(b)})")
        if len(plain) != len(hybrid):
            bad += 1
            print(f"MISMATCH {name}: {len(plain)} plain outputs vs {len(hybrid)}")
    if bad:
        print(f"gpu_e2e_check: FAILED: {bad} greedy outputs differ between a speculative run and plain")
        return 1
    steps = {r[0]: results[r[0]]["tokens_per_step"] for r in RUNS[1:]}
    print(f"gpu_e2e_check: ok: HYBRID_SPARK greedy outputs (windows 4, 9, and 9 narrowed to 4 above bs 2; on DSpark "
          "static and compact with window 8) and DSPARK's equal plain decoding on all "
          f"{len(plain)} prompts ({sum(len(x) for x in plain)} tokens; tokens per verify step {steps})")
    return 0

if __name__ == "__main__":
    sys.exit(main())
