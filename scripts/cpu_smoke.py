#!/usr/bin/env python
"""CPU smoke run of the real SGLang engine on the tiny test models: plain vs speculative decoding.

    python scripts/cpu_smoke.py --prompts FILE.jsonl [--max-new-tokens N]
                                [--algorithm STANDALONE|EAGLE3|DSPARK|HYBRID_SPARK] [--draft standalone|eagle3|dspark]
                                [--verify-mode static|cap-accept|compact] [--max-draft N]

Each line of FILE.jsonl is a JSON object with a ``"prompt"`` field (text, tokenized with the tiny tokenizer).
Runs greedy plain decoding, then speculative decoding, on every prompt (one batch each), and prints ONE JSON line:
per prompt whether the token ids are identical, the accept length (``meta_info["spec_accept_length"]``) and, for
runs that report ``hybrid_*`` meta_info fields (HYBRID_SPARK), the fraction of verify steps whose chain came from
the n-gram drafter. Exits 1 if any prompt's outputs differ, 2 on bad arguments or input.

With a DSpark draft (``--algorithm DSPARK``, or ``HYBRID_SPARK --draft dspark``; the tiny DSpark draft of
``tests/e2e/tiny_dspark.py``) ``--verify-mode`` picks SGLang's ``SGLANG_RAGGED_VERIFY_MODE`` (cap-accept and compact
budget with the tests' SPS table ``tests/e2e/data/sps_cpu.json``), and the line gains ``max_step_verify_tokens``
(the most tokens one decode step verified, from DSpark's own step dump) and, for HYBRID_SPARK,
``max_request_verify_len`` (the most draft tokens one request verified in one step) and ``ngram_step_share`` (the
share of request-steps that verified an n-gram chain).

Uses the test harness (``tests/e2e/engine_harness.py``: one engine host process per configuration, with the
``sgl_kernel`` stand-in and ``SGLANG_USE_CPU_ENGINE=1``) and the tiny models (``tests/e2e/tiny_models.py``, built
on first use into ``~/.cache/sglang_hybrid_tests``). Needs the project installed (``pip install -e .``) so the
plugin reaches SGLang's scheduler process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
E2E_DIR = os.path.join(REPO_ROOT, "tests", "e2e")

DEFAULT_DRAFT = {"STANDALONE": "standalone", "EAGLE3": "eagle3", "DSPARK": "dspark", "HYBRID_SPARK": "standalone"}
VERIFY_MODES = ("static", "cap-accept", "compact")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", required=True, help="JSONL file; each line an object with a 'prompt' text field")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--algorithm", default="STANDALONE", choices=sorted(DEFAULT_DRAFT))
    p.add_argument("--draft", choices=["standalone", "eagle3", "dspark"], default=None, help="tiny draft model to use")
    p.add_argument("--verify-mode", choices=VERIFY_MODES, default="static",
                   help="DSpark drafts only: SGLang's SGLANG_RAGGED_VERIFY_MODE")
    p.add_argument("--max-draft", type=int, default=0, help="HYBRID_SPARK option max_draft (0 = fill the window)")
    p.add_argument("--corpus", choices=["off", "shared", "tenant"], default="off",
                   help="HYBRID_SPARK option corpus: the cross-request n-gram corpus (with a 64Ki-entry table)")
    p.add_argument("--rounds", type=int, default=1,
                   help="send the prompts this many times, one batch after another, to the same speculative engine "
                        "(later rounds can draft from what the cross-request corpus learnt; every round is compared)")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    args.draft = args.draft or DEFAULT_DRAFT[args.algorithm]
    if args.algorithm == "DSPARK" and args.draft != "dspark":
        p.error("--algorithm DSPARK needs --draft dspark")
    if args.draft == "dspark" and args.algorithm not in ("DSPARK", "HYBRID_SPARK"):
        p.error(f"--draft dspark works with DSPARK or HYBRID_SPARK, not {args.algorithm}")
    if args.verify_mode != "static" and args.draft != "dspark":
        p.error("--verify-mode applies to a DSpark draft only")
    if args.max_draft < 0:
        p.error("--max-draft must be >= 0")
    if args.corpus != "off" and args.algorithm != "HYBRID_SPARK":
        p.error("--corpus applies to HYBRID_SPARK only")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args


def spec_config(args: argparse.Namespace):
    """The engine configuration of the speculative run (registered with the harness)."""
    from engine_harness import DSPARK_SPS_TABLE, EngineConfig, register_config

    env = []
    if args.algorithm == "HYBRID_SPARK":
        env = [("SGLANG_HYBRID_MAX_DRAFT", str(args.max_draft)), ("SGLANG_HYBRID_SYNC_GUARD", "1"),
               ("SGLANG_HYBRID_CORPUS", args.corpus), ("SGLANG_HYBRID_CORPUS_ENTRIES", str(1 << 16))]
    kwargs = []
    if args.draft == "dspark":
        kwargs = [("speculative_num_steps", None), ("speculative_eagle_topk", None),
                  ("speculative_num_draft_tokens", None)]
        if args.verify_mode != "static":
            kwargs.append(("speculative_dspark_sps_table_path", DSPARK_SPS_TABLE))
        env += [("SGLANG_RAGGED_VERIFY_MODE", args.verify_mode), ("SGLANG_DSPARK_DEBUG_DUMP", "core")]
    name = f"smoke_{args.algorithm.lower()}_{args.draft}_{args.verify_mode}_{args.max_draft}_{args.corpus}"
    return register_config(EngineConfig(name, algorithm=args.algorithm, draft=args.draft,
                                        engine_kwargs=tuple(kwargs), env=tuple(env)))


def step_figures(state: Dict[str, Any]) -> Dict[str, Any]:
    """Per-step figures of a DSpark-family run from ``/server_info``'s first internal state."""
    out: Dict[str, Any] = {}
    dump = state.get("dspark_info_record") or {}
    steps = [r.get("num_verify_tokens", -1) for r in dump.get("records", [])]
    if steps:
        out["max_step_verify_tokens"] = max(steps)
    hy = state.get("hybrid_spark")
    if hy:
        out["max_request_verify_len"] = hy.get("max_verified_drafts_in_step")
        out["max_request_accepted"] = hy.get("max_accepted_drafts_in_step")
        out["ngram_step_share"] = hy.get("ngram_win_rate")
        if "corpus_chosen" in hy:  # the cross-request corpus is on (SGLANG_HYBRID_CORPUS)
            out["corpus_chosen"] = hy.get("corpus_chosen")
            out["accepted_corpus"] = hy.get("accepted_corpus")
    return out


def read_prompts(path: str) -> List[str]:
    """The ``prompt`` texts of a JSONL file (raises ValueError naming the line on bad input)."""
    from sglang_hybrid.jsonl_io import json_lines

    texts = []
    for where, obj in json_lines(path):
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise ValueError(f"{where}: expected an object with a non-empty 'prompt' string")
        texts.append(obj["prompt"])
    if not texts:
        raise ValueError(f"{path}: no prompts")
    return texts


def hybrid_fields(meta: Dict[str, Any]) -> Dict[str, Any]:
    """The ``hybrid_*`` meta_info fields of one output."""
    return {k: v for k, v in meta.items() if k.startswith("hybrid_")}


def ngram_fraction(fields: Dict[str, Any]) -> Optional[float]:
    """Fraction of verify steps whose chain was the n-gram one, from HYBRID_SPARK's per-request counters
    (``verify_steps`` / ``ngram_chosen_steps``, or a ``ngram_win_rate``), wherever they sit in the fields."""
    dicts: List[dict] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            dicts.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(list(fields.values()))
    steps = sum(int(d.get("verify_steps", 0) or 0) for d in dicts)
    if steps:
        return sum(int(d.get("ngram_chosen_steps", 0) or 0) for d in dicts) / steps
    rates = [float(d["ngram_win_rate"]) for d in dicts if "ngram_win_rate" in d]
    return rates[-1] if rates else None


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        texts = read_prompts(args.prompts)
    except (OSError, ValueError) as e:
        print(f"cpu_smoke: {e}", file=sys.stderr)
        return 2
    sys.path.insert(0, E2E_DIR)
    from engine_harness import EnginePool
    from tiny_models import build_tiny_models, encode

    models = build_tiny_models()
    input_ids = encode(models, texts)
    spec_name = spec_config(args).name
    sp = dict(temperature=0.0, max_new_tokens=args.max_new_tokens, ignore_eos=True)
    pool = EnginePool(models, max_alive=1)
    try:
        plain = pool.get("plain").generate(input_ids, sp)
        engine = pool.get(spec_name)
        spec = []
        for _ in range(args.rounds):
            spec += engine.generate(input_ids, sp)
        state = engine.server_info()["internal_states"][0]
    finally:
        pool.close()
    rows = []
    n = len(input_ids)
    for i, b in enumerate(spec):
        ids, a = input_ids[i % n], plain[i % n]
        meta = b["meta_info"]
        fields = hybrid_fields(meta)
        row = {
            "index": i % n,
            "round": i // n,
            "prompt_tokens": len(ids),
            "identical": a["output_ids"] == b["output_ids"],
            "accept_length": meta.get("spec_accept_length"),
            "verify_steps": meta.get("spec_verify_ct"),
        }
        if fields:
            row["ngram_fraction"] = ngram_fraction(fields)
            row["hybrid"] = fields
        if not row["identical"]:
            row["plain_ids"], row["spec_ids"] = a["output_ids"], b["output_ids"]
        rows.append(row)
    all_identical = all(r["identical"] for r in rows)
    report = {
        "algorithm": args.algorithm,
        "draft": args.draft,
        "verify_mode": args.verify_mode if args.draft == "dspark" else None,
        "max_new_tokens": args.max_new_tokens,
        **step_figures(state),
        "all_identical": all_identical,
        "engine_start_s": {k: [round(s, 1) for s in v] for k, v in pool.timings.items()},
        "prompts": rows,
    }
    print(json.dumps(report))
    return 0 if all_identical else 1


if __name__ == "__main__":
    sys.exit(main())
