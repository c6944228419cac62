"""``hybrid-spark calibrate``: fit an n-gram calibration table, print its held-out ECE and AUC, write JSON + PNG.

Examples::

    # the shipped default (source "text itself" on Python's stdlib, default tokenizer, NgramConfig(2, 8, 16)):
    hybrid-spark calibrate --source text --corpus stdlib --out sglang_hybrid/data/calibration/default.json

    # served requests (a request log, or hybrid-spark workloads files) mixed with the stdlib:
    hybrid-spark calibrate --source text --corpus stdlib requests.jsonl --out my_table.json

    # a deployment's own target model (its greedy continuations of prompts taken from a corpus):
    hybrid-spark calibrate --source model --model /models/target --corpus my_prompts/ --device cuda \\
        --out my_table.json --plot my_table.png

    # the cross-request corpus's table (option corpus_calibration), from a request log:
    hybrid-spark calibrate --candidate corpus --corpus requests.jsonl --out corpus_table.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .table import CalibrationTable

__all__ = ["build_parser", "main", "collect_samples"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hybrid-spark calibrate", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--candidate", choices=("ngram", "corpus"), default="ngram",
                    help="'ngram': the per-request n-gram table (option calibration); 'corpus': the cross-request "
                         "corpus's odds-ratio table (option corpus_calibration; corpus_table.py)")
    ap.add_argument("--corpus-entries", type=int, default=1 << 21,
                    help="--candidate corpus: entries of the replayed corpus (a power of two)")
    ap.add_argument("--source", choices=("text", "model"), default="text",
                    help="'text': the corpus text itself plays the target; 'model': a causal LM's greedy continuations")
    ap.add_argument("--corpus", nargs="+", default=["stdlib"], metavar="stdlib|PATH",
                    help="'stdlib' (this interpreter's standard library: code and prose), files/directories of text, "
                         "or .jsonl files of served requests ({\"prompt\", \"output\"} a line); mix freely")
    ap.add_argument("--model", help="source 'model': a local Hugging Face causal LM directory (the target)")
    ap.add_argument("--draft-model",
                    help="optional local causal LM playing the model drafter: adds the 'agree' feature")
    ap.add_argument("--tokenizer", help="tokenizer.json or a directory holding one (default: the model's if it "
                                        "has one, else the package's default tokenizer)")
    ap.add_argument("--out", default="calibration.json", help="output table (JSON)")
    ap.add_argument("--plot", help="reliability diagram of the held-out split (PNG)")
    ap.add_argument("--max-docs", type=int, help="use a seeded random subset of this many corpus documents")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-min", type=int, default=2)
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("--max-draft", type=int, default=16)
    ap.add_argument("--window", type=int, default=0,
                    help="lookup window (0 = whole history; >0 needs --replay history)")
    ap.add_argument("--replay", choices=("fast", "history"), default="fast",
                    help="'fast': vectorised numpy replay (window 0); 'history': through TokenHistory (slow on CPU)")
    ap.add_argument("--max-doc-tokens", type=int, default=8192,
                    help="documents are cut into chunks of this many tokens")
    ap.add_argument("--heldout-frac", type=float, default=0.2, help="share of documents held out for the metrics")
    ap.add_argument("--prior-strength", type=float, default=20.0, help="pseudo-trials of the shrinkage prior")
    ap.add_argument("--count-direction", choices=("decreasing", "increasing", "none"), default="decreasing",
                    help="monotone constraint of q along match_count (match_len is always non-decreasing)")
    ap.add_argument("--prompt-tokens", type=int, default=512,
                    help="source 'model': prompt length taken from each document")
    ap.add_argument("--max-new-tokens", type=int, default=256,
                    help="source 'model': greedy tokens generated per prompt")
    ap.add_argument("--batch-size", type=int, default=8, help="source 'model' / --draft-model: sequences per forward")
    ap.add_argument("--device", default="cpu", help="torch device for --model / --draft-model")
    ap.add_argument("--ablate", action="store_true", help="also print held-out metrics of feature ablations")
    return ap


def _fail(msg: str) -> int:
    print(f"hybrid-spark calibrate: error: {msg}", file=sys.stderr)
    return 2


def collect_sequences(args: argparse.Namespace) -> tuple[list, Any, Any, dict[str, Any]]:
    """Corpus -> token sequences. Returns ``(sequences, prompt_lens, model_first or None, fit_meta)``."""
    from sglang_hybrid.tokenizer import DEFAULT_TOKENIZER_PATH, load_tokenizer, tokenizer_digest

    import numpy as np

    from .corpus import corpus_digest, path_documents, stdlib_documents
    from .sources import (draft_first_tokens, load_causal_lm, model_token_docs, request_token_docs,
                          select_documents, text_token_docs, tokenize_documents)

    tok_path = args.tokenizer
    if tok_path is None and args.source == "model" and (Path(args.model) / "tokenizer.json").is_file():
        tok_path = args.model
    tokenizer = load_tokenizer(tok_path)
    is_default_tok = tok_path is None or Path(tok_path).resolve() in (DEFAULT_TOKENIZER_PATH,
                                                                      DEFAULT_TOKENIZER_PATH.parent)
    docs = []
    for entry in args.corpus:
        docs.extend(stdlib_documents() if entry == "stdlib" else path_documents([entry]))
    if args.corpus == ["stdlib"]:
        corpus_name = f"stdlib (CPython {platform.python_version()}: code + docstrings + reference topics)"
    else:
        corpus_name = " ".join(f"stdlib (CPython {platform.python_version()})" if c == "stdlib" else c
                               for c in args.corpus)
    if not docs:
        raise ValueError(f"corpus {args.corpus} holds no documents")
    digest = corpus_digest(docs)
    docs = select_documents(docs, args.max_docs, args.seed)
    requests = [d for d in docs if d.prompt is not None]
    docs = [d for d in docs if d.prompt is None]
    if requests and args.source != "text":
        raise ValueError("served requests (.jsonl) already hold their outputs: use them with --source text")
    token_docs = tokenize_documents(docs, tokenizer) if docs else []
    meta: dict[str, Any] = {
        "source": args.source,
        "target": "text itself" if args.source == "text" else f"greedy continuations of {Path(args.model).name}",
        "corpus": corpus_name,
        "corpus_digest": digest,
        "corpus_documents": len(docs),
        "corpus_requests": len(requests),
        "tokenizer": "sglang_hybrid default (data/tokenizer/tokenizer.json)" if is_default_tok else str(tok_path),
        "tokenizer_digest": tokenizer_digest(tok_path),
        "ngram": {"n_min": args.n_min, "n_max": args.n_max, "max_draft": args.max_draft, "window": args.window},
        "replay": args.replay,
    }
    if args.source == "text":
        seqs, plens = text_token_docs(token_docs, seed=args.seed, max_doc_tokens=args.max_doc_tokens)
        meta["split"] = {"max_doc_tokens": args.max_doc_tokens, "prompt_frac": [0.2, 0.8]}
        if requests:  # served requests keep their real prompt / output split, whole
            rseqs, rplens = request_token_docs(requests, tokenizer)
            seqs, plens = seqs + rseqs, np.concatenate([plens, rplens]).astype(np.int64)
            meta["split"]["requests"] = "prompt / output as served, not chunked"
    else:
        model = load_causal_lm(args.model, args.device)
        seqs, plens = model_token_docs(model, token_docs, prompt_tokens=args.prompt_tokens,
                                       max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
        meta["generation"] = {"prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens,
                              "decoding": "greedy"}
        del model
    model_first = None
    if args.draft_model:
        dm = load_causal_lm(args.draft_model, args.device)
        model_first = draft_first_tokens(dm, seqs, batch_size=args.batch_size)
        meta["draft_model"] = Path(args.draft_model).name
    meta["sequences"] = len(seqs)
    meta["tokens"] = int(sum(len(s) for s in seqs))
    return seqs, plens, model_first, meta


def collect_samples(args: argparse.Namespace) -> tuple[Any, int, dict[str, Any]]:
    """Corpus -> token sequences -> replayed samples. Returns ``(samples, num_sequences, fit_meta)``."""
    from .samples import samples_from_docs, samples_via_history

    seqs, plens, model_first, meta = collect_sequences(args)
    if args.replay == "fast":
        if args.window != 0:
            raise ValueError("--window > 0 needs --replay history (the fast replay scans the whole history)")
        samples = samples_from_docs(seqs, plens, args.n_min, args.n_max, args.max_draft, model_first=model_first)
    else:
        from sglang_hybrid.ngram import NgramConfig

        cfg = NgramConfig(args.n_min, args.n_max, args.max_draft, args.window)
        cfg.validate()
        samples = samples_via_history(seqs, plens, cfg, model_first=model_first)
    return samples, len(seqs), meta


def _line(tag: str, m: dict[str, Any]) -> str:
    if not m.get("events"):
        return f"  {tag:<9} no held-out events"
    auc = "n/a (one class)" if m["auc"] is None else f"{m['auc']:.4f}"
    return (f"  {tag:<9} ECE {m['ece']:.4f}  AUC {auc}  Brier {m['brier']:.5f}  log-loss {m['log_loss']:.4f}  "
            f"mean predicted {m['mean_pred']:.4f} vs observed {m['mean_observed']:.4f}  ({m['events']} events)")


def _fit_corpus(args: argparse.Namespace) -> int:
    """``--candidate corpus``: replay the sequences through a corpus, fit its odds-ratio table, write it."""
    from .candidates import corpus_config
    from .corpus_samples import corpus_samples
    from .corpus_table import CorpusTable, heldout_metrics
    from .fit import split_by_doc

    if args.draft_model:
        return _fail("--draft-model: the corpus table has no 'agree' feature (it applies to --candidate ngram)")
    try:  # the step's corpus (its walk cut included), so the table fits what the worker drafts
        cfg = corpus_config("shared", args.corpus_entries, 1)
        cfg.validate()
    except ValueError as e:
        return _fail(f"--corpus-entries: {e}")
    t0 = time.perf_counter()
    try:
        seqs, plens, _, meta = collect_sequences(args)
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    meta.pop("ngram", None)
    meta["replay"] = "corpus_samples.py: 32 sequences side by side, one token a step, outputs inserted"
    meta["corpus_entries"] = cfg.entries
    samples = corpus_samples(seqs, plens, cfg, args.max_draft)
    t1 = time.perf_counter()
    train, held = split_by_doc(samples, len(seqs), args.heldout_frac, args.seed)
    meta["holdout"] = {"by": "sequence", "frac": args.heldout_frac, "seed": args.seed,
                       "train_drafts": len(train), "heldout_drafts": len(held)}
    table = CorpusTable.fit(train, cfg, prior_strength=args.prior_strength, fit_meta=meta)
    table.heldout = heldout_metrics(table, held)
    out = table.save(args.out)
    print(f"{meta['sequences']} sequences, {meta['tokens']} tokens, {len(samples)} corpus drafts "
          f"({len(train)} train / {len(held)} held out); replay {t1 - t0:.1f}s")
    print("held-out metrics of the drafted tokens' q (tried tokens):")
    print(_line("corpus q", table.heldout["raw"]))
    print(_line("fitted", table.heldout["fitted"]))
    print(f"wrote {out}")
    CorpusTable.load(out)  # sanity: what was written loads back
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``hybrid-spark calibrate``; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.source == "model" and not args.model:
        return _fail("--source model needs --model DIR")
    if not 1 <= args.n_min <= args.n_max or args.max_draft < 1:
        return _fail("need 1 <= --n-min <= --n-max and --max-draft >= 1")
    if args.candidate == "corpus":
        return _fit_corpus(args)
    from .fit import fit_table, split_by_doc
    from .metrics import ECE_BINS, evaluate
    from .table import default_edges

    t0 = time.perf_counter()
    try:
        samples, nseq, meta = collect_samples(args)
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    t1 = time.perf_counter()
    train, held = split_by_doc(samples, nseq, args.heldout_frac, args.seed)
    meta["holdout"] = {"by": "sequence", "frac": args.heldout_frac, "seed": args.seed,
                       "train_drafts": len(train), "heldout_drafts": len(held)}
    feats = default_edges(args.n_min, args.n_max, args.max_draft, agree=samples.agree is not None)
    directions = {"match_len": 1, "match_count": {"decreasing": -1, "increasing": 1, "none": 0}[args.count_direction]}
    table = fit_table(train, feats, prior_strength=args.prior_strength, monotone=directions, fit_meta=meta)
    metrics = evaluate(table, held)
    metrics["ece_bins"] = ECE_BINS
    table.heldout = metrics
    table.source = args.out
    out = table.save(args.out)
    t2 = time.perf_counter()
    print(f"{meta['sequences']} sequences, {meta['tokens']} tokens, {len(samples)} drafts "
          f"({len(train)} train / {len(held)} held out); replay {t1 - t0:.1f}s, fit {t2 - t1:.1f}s")
    print("held-out metrics:")
    print(_line("survival", metrics["survival"]))
    print(_line("q", metrics["q"]))
    print(f"wrote {out}")
    if args.plot:
        from .plot import reliability_plot

        p = reliability_plot(table, held, args.plot, title=f"n-gram calibration, held out: {meta['target']}")
        print(f"wrote {p}")
    if args.ablate:
        from .ablation import format_ablations, run_ablations

        print(format_ablations(run_ablations(train, held, feats, args.prior_strength)))
    # Sanity: what was written loads back.
    CalibrationTable.load(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
