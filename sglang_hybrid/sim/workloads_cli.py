"""``hybrid-spark workloads``: build the code-editing and chat workloads, or print statistics of one.

    hybrid-spark workloads build [--out DIR] [--cache DIR] [--offline] [--max-code N] [--max-chat N] ...
    hybrid-spark workloads stats FILE.jsonl [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Sequence

from .chat import ChatFilter
from .code_edit import EditFilter
from .jsonl import read_workload
from .releases import local_release
from .workloads import DEFAULT_CODE_PAIRS, SHIPPED_MAX_CHAT, SHIPPED_MAX_CODE, BuildParams, build_workloads, default_releases


def _token_counter(tokenizer: str | None, enabled: bool):
    if not enabled:
        return None, None
    from ..tokenizer import load_tokenizer  # the shipped tokenizer unless a directory is given

    tok = load_tokenizer(tokenizer)
    return (lambda s: len(tok.encode(s, add_special_tokens=False).ids)), (tokenizer or "default (shipped)")


def _parse_pair(s: str) -> tuple[str, str, str]:
    parts = s.split(":")
    if len(parts) != 3 or not all(parts):
        raise argparse.ArgumentTypeError(f"--pair: expected NAME:OLD:NEW, got {s!r}")
    return parts[0], parts[1], parts[2]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hybrid-spark workloads", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build code_edit.jsonl, chat.jsonl and manifest.json")
    b.add_argument("--out", default="workloads", help="output directory (default: ./workloads)")
    b.add_argument("--cache", default=str(Path.home() / ".cache" / "sglang-hybrid" / "sdists"),
                   help="where downloaded sdists are kept and reused")
    b.add_argument("--pair", action="append", type=_parse_pair, metavar="NAME:OLD:NEW",
                   help="a release pair to download with pip (repeatable; default: the built-in list)")
    b.add_argument("--local-pair", action="append", nargs=5,
                   metavar=("NAME", "OLD_VERSION", "OLD_PATH", "NEW_VERSION", "NEW_PATH"),
                   help="a release pair from local archives or directories (repeatable; no network)")
    b.add_argument("--max-code", type=int, default=SHIPPED_MAX_CODE, help="cap on code-edit records (0 = all)")
    b.add_argument("--max-chat", type=int, default=SHIPPED_MAX_CHAT, help="cap on chat records (0 = all)")
    b.add_argument("--min-bytes", type=int, default=EditFilter.min_bytes)
    b.add_argument("--max-bytes", type=int, default=EditFilter.max_bytes)
    b.add_argument("--min-similarity", type=float, default=EditFilter.min_similarity)
    b.add_argument("--chat-min-chars", type=int, default=ChatFilter.min_chars)
    b.add_argument("--chat-max-chars", type=int, default=ChatFilter.max_chars)
    b.add_argument("--tokenizer", default=None, help="HF tokenizer directory for the manifest's token counts")
    b.add_argument("--no-token-counts", action="store_true", help="record character/line lengths only")
    s = sub.add_parser("stats", help="print record count and lengths of a workload file")
    s.add_argument("file")
    s.add_argument("--tokenizer", default=None, help="HF tokenizer directory (default: the shipped one)")
    return p


def _build(args: argparse.Namespace) -> int:
    params = BuildParams(
        edit=EditFilter(min_bytes=args.min_bytes, max_bytes=args.max_bytes, min_similarity=args.min_similarity),
        chat=ChatFilter(min_chars=args.chat_min_chars, max_chars=args.chat_max_chars),
        max_code=args.max_code, max_chat=args.max_chat,
    )
    params.validate()
    if args.local_pair:
        code_pairs = [(local_release(n, ov, op), local_release(n, nv, np_)) for n, ov, op, nv, np_ in args.local_pair]
        newest = {a.name: b for a, b in code_pairs}
        docs = [newest[k] for k in sorted(newest)]
    else:
        code_pairs, docs = default_releases(args.cache, args.pair or DEFAULT_CODE_PAIRS,
                                            log=lambda m: print(m, file=sys.stderr))
    count, tok_name = _token_counter(args.tokenizer, not args.no_token_counts)
    m = build_workloads(code_pairs, docs, args.out, params, count_tokens=count, tokenizer_name=tok_name)
    for name, f in m["files"].items():
        print(f"{Path(args.out) / name}: {f['records']} records, {f['bytes'] / 1e6:.2f} MB, {f['by_kind']}")
    print(f"{Path(args.out) / 'manifest.json'}: sources and per-record lengths")
    return 0


def _stats(args: argparse.Namespace) -> int:
    recs = read_workload(args.file)
    count, _ = _token_counter(args.tokenizer, True)
    kinds = sorted({r.kind for r in recs})
    print(f"{args.file}: {len(recs)} records, kinds {kinds}")
    for field in ("prompt", "output"):
        toks = [count(getattr(r, field)) for r in recs]
        if toks:
            print(f"  {field} tokens: mean {statistics.mean(toks):.0f}, median {statistics.median(toks):.0f}, "
                  f"min {min(toks)}, max {max(toks)}, total {sum(toks)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hybrid-spark workloads``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return _build(args) if args.cmd == "build" else _stats(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"hybrid-spark workloads: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
