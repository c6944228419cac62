#!/usr/bin/env python
"""What HYBRID_SPARK's state holds on the device, by part, for a serving configuration (``sglang_hybrid/memory.py``).

The workers log the same figures at start-up and report ``device_bytes``; this builds the state (on the CPU by
default: same shapes, same bytes) for configurations before a server is started, to plan
``--mem-fraction-static``, ``history_width``, ``corpus_entries`` and ``penalty_rows``. SGLang sizes its KV cache
before the speculative worker builds this state, so it comes out of the headroom ``--mem-fraction-static`` leaves.

``--configs``: ``slots x history tokens`` pairs, e.g. ``512x40960`` (the request pool's slots, SGLang's
``req_to_token`` rows; the history width is the model's context length unless ``history_width`` caps it). The DSpark
shape by default: a 7-token model block, a 16-token verify window. Columns: MiB per part; on a CUDA device also
``allocated``, what ``torch.cuda.memory_allocated`` grew by while the state was built (the allocator's block rounding
included): close to ``total`` when the count misses nothing.

Example::

    python scripts/device_memory.py --configs 256x40960,1024x40960,1024x131072 --corpus shared
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sglang_hybrid.config import HybridConfig  # noqa: E402
from sglang_hybrid.memory import device_bytes, mib  # noqa: E402
from sglang_hybrid.penalties import PenaltyTable  # noqa: E402
from sglang_hybrid.selection.sps import dense_sps, load_default_sps_table  # noqa: E402
from sglang_hybrid.step import HybridStep  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="256x40960,1024x40960,1024x131072")
    ap.add_argument("--gamma", type=int, default=7, help="model chain (DSpark block)")
    ap.add_argument("--window", type=int, default=15, help="verify window, root excluded")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--corpus", choices=("off", "shared", "tenant"), default="shared")
    ap.add_argument("--corpus-entries", type=int, default=HybridConfig().corpus_entries)
    ap.add_argument("--penalty-rows", type=int, default=HybridConfig().penalty_rows)
    ap.add_argument("--fairness-scope", choices=("off", "request", "tenant"), default="off",
                    help="option fairness (2) with this scope (DSpark's ragged verify, the shipped SPS table)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    header = None
    cuda = args.device.startswith("cuda")
    for spec in args.configs.split(","):
        slots, width = (int(x) for x in spec.lower().split("x"))
        if cuda:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
        fair = {} if args.fairness_scope == "off" else {"fairness": 2.0, "fairness_scope": args.fairness_scope}
        cfg = HybridConfig(corpus=args.corpus, corpus_entries=args.corpus_entries, penalty_rows=args.penalty_rows,
                           **fair)
        sps = dense_sps(load_default_sps_table(), slots * (1 + args.window), args.device) if fair else None
        step = HybridStep(cfg, num_slots=slots, width=width, gamma=args.gamma, max_bs=slots, device=args.device,
                          verify_window=args.window, kernel_backend="torch", sps_dense=sps)
        pen = PenaltyTable(slots, args.vocab, args.penalty_rows, args.device) if args.penalty_rows else None
        got = device_bytes(step.device_parts(penalties=pen), args.device)
        if cuda:  # what the allocator handed out meanwhile (block rounding included): the walk should miss nothing
            got["allocated"] = torch.cuda.memory_allocated() - before
        if header is None:
            header = list(got)
            print("| slots x history | " + " | ".join(f"{h} (MiB)" for h in header) + " |")
            print("|---|" + "---:|" * len(header))
        print(f"| {slots} x {width} | " + " | ".join(f"{mib(got[h]):.1f}" for h in header) + " |")
        del step, pen
    return 0


if __name__ == "__main__":
    sys.exit(main())
