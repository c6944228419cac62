#!/usr/bin/env python
"""Benchmark the online calibration's per-step calls, torch ops against their Triton kernels: ``apply`` and
``update`` (``calibration/online_kernel.py``), and the deferred scoring of ``update_from_history``
(``calibration/deferred_kernel.py``); and the step's other per-step records with kernels: the model agreement's
``apply``, ``share`` and ``update`` (``calibration/agreement_kernel.py``), the counters' ``update``
(``stats_kernel.py``), the corpus's fitted table (``corpus_table.price``, ``calibration/corpus_table_kernel.py``)
the choice between two chains (``choose``: the corpus candidate's, ``calibration/choose_kernel.py``) and a
chain's counters (``chain_counters.add``, ``calibration/counters_kernel.py``) and the tail's after-verify flags
(``tail.flags``, ``calibration/tail_kernel.py``).

``apply`` and ``update_from_history`` run as the step runs the n-gram record (``defer`` 8, ``bins`` 8, ``L`` 16
draft columns): every ring entry and position does real work; ``update`` as the corpus candidate's and the
tails' records (no defer, no bins), against a 7-token commit. Columns, per call and batch size, in microseconds (median of ``--repeats`` calls
after ``--warmup``):
  torch / triton   one call launched from Python (CUDA events on a GPU, ``perf_counter`` on a CPU)
  graph            one replay of a CUDA graph of the Triton call (GPU only)
  ops              top-level torch ops per call outside the kernels (the profiler; what an eager step pays)

On a CPU only the torch path runs (under the Triton interpreter a kernel's time is not a speed);
``scripts/count_step_ops.py`` counts the kernel path's ops there.

    python scripts/bench_online.py --device cuda --bs 1,4,32,128
    python scripts/bench_online.py --device cpu --bs 1,4,32
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from sglang_hybrid.calibration.agreement import ModelAgreement  # noqa: E402
from sglang_hybrid.calibration.candidates import Q_ONE  # noqa: E402
from sglang_hybrid.calibration.choose import choose_rows_fn  # noqa: E402
from sglang_hybrid.calibration.counters import ChainCounters  # noqa: E402
from sglang_hybrid.calibration.tail import ModelTail  # noqa: E402
from sglang_hybrid.ngram.config import NgramConfig  # noqa: E402
from sglang_hybrid.calibration.corpus_table import DEFAULT_CORPUS_TABLE, CorpusTable  # noqa: E402
from sglang_hybrid.calibration.online import OnlineCalibration  # noqa: E402
from sglang_hybrid.stats import StepStats  # noqa: E402
from sglang_hybrid.ngram.history import TokenHistory  # noqa: E402


def _setup(bs: int, backend: str, dev: torch.device, L: int, hist: int):
    g = torch.Generator().manual_seed(bs)
    on = OnlineCalibration(bs, bs, L, dev, defer=8, bins=8, backend=backend)
    h = TokenHistory(bs, hist, dev, backend="torch", max_draft=L)
    slots = torch.arange(bs, device=dev)
    prompt = torch.randint(0, 8, (bs, hist // 2), generator=g, dtype=torch.int32).to(dev)
    h.write_prompt(slots, prompt, torch.full((bs,), hist // 2, dtype=torch.int32, device=dev))
    tok = torch.randint(0, 8, (bs, L), generator=g, dtype=torch.int32).to(dev)
    q = torch.rand(bs, L, generator=g).to(dev)
    start = h.lens.to(torch.int64)
    new = torch.randint(0, 8, (bs, 4), generator=g, dtype=torch.int32).to(dev)
    cnt = torch.full((bs,), 2, dtype=torch.int32, device=dev)
    length = torch.full((bs,), L, dtype=torch.int64, device=dev)

    qq, sv = q.clone(), q.clone()

    def apply() -> None:  # this step's drafts priced (in place: the values drift, the work does not)
        on.apply(slots, tok, length, qq, sv, start=start)

    def record() -> None:  # this step's drafts scored against the history, the ring advanced
        on.update_from_history(slots, h.tokens, h.lens)

    # The corpus candidate's and the tails' records: no defer, no bins, scored against each step's commit.
    on2 = OnlineCalibration(bs, bs, L, dev, backend=backend)
    committed = torch.cat([tok[:, :3], new], 1)
    counts = torch.full((bs,), 5, dtype=torch.int32, device=dev)

    def update() -> None:
        on2.update(slots, committed, counts)

    # The model agreement (gamma 7): the draft shares its first 3 tokens with the model chain.
    gamma = 7
    ag = ModelAgreement(bs, L, gamma, dev, backend=backend)
    mt = torch.cat([tok[:, :3], tok[:, 3:gamma] + 1], 1)
    mc = torch.rand(bs, gamma, generator=g).to(dev)
    aq, asv, msv = q.clone(), q.clone(), torch.cumprod(mc, 1)

    def ag_apply() -> None:
        ag.apply(tok, length, aq, asv, mt, mc)

    def ag_share() -> None:
        ag.share(tok, length, asv, mt, mc, msv)

    def ag_update() -> None:
        ag.update(committed, counts)

    st = StepStats(num_slots=bs, max_bs=bs, gamma=gamma, model_prior=0.6, model_ema=0.05, device=dev,
                   backend=backend)
    vlen = torch.full((bs,), gamma, dtype=torch.int32, device=dev)
    choice = (torch.arange(bs, device=dev) % 2).to(torch.int32)

    def stats() -> None:
        st.update(slots, vlen, choice, counts)

    ctab = CorpusTable.load(DEFAULT_CORPUS_TABLE).to_device(bs, L, dev, backend=backend)
    cq = torch.randint(0, Q_ONE, (bs, L), generator=g, dtype=torch.int32).to(dev)
    cscale = torch.tensor(1.0 / Q_ONE, device=dev)
    cml = torch.randint(1, 9, (bs,), generator=g, dtype=torch.int32).to(dev)
    ccnt = torch.randint(1, 300, (bs,), generator=g, dtype=torch.int32).to(dev)
    cout = torch.zeros(bs, L, device=dev)

    def corpus_price() -> None:
        ctab.price(cq, cscale, cml, ccnt, cout)

    chooser = choose_rows_fn(backend)
    ch_a, ch_b = torch.rand(bs, L, generator=g).to(dev), torch.rand(bs, L, generator=g).to(dev)
    ch_e = (torch.zeros(bs, device=dev), torch.zeros(bs, device=dev), torch.zeros(bs, dtype=torch.bool, device=dev))
    ch_t = tuple(torch.randint(0, 8, (bs, L), generator=g, dtype=torch.int32).to(dev) for _ in range(3))
    ch_l = tuple(torch.randint(0, L, (bs,), generator=g, dtype=torch.int32).to(dev) for _ in range(3))

    def choose() -> None:  # the corpus candidate's choice (in place: the winner's survivals overwrite ch_a)
        chooser(ch_a, ch_b, L, *ch_e, *ch_t, *ch_l)

    chain = ChainCounters(bs, dev, ("n", "acc"), offset=1, backend=backend)
    chain.rows(bs)[0].copy_(torch.rand(bs, generator=g).to(dev) < 0.5)
    ch_counts = torch.randint(0, 9, (bs,), generator=g, dtype=torch.int32).to(dev)

    def counters() -> None:  # a chain's counters after verify (its non-blocking host copy included)
        chain.add(ch_counts)

    mtail = ModelTail(bs, bs, 7, NgramConfig(n_min=2, n_max=8, max_draft=8), dev, online=False, backend=backend)
    mtail._views(bs).tok_model.copy_(torch.randint(0, 2, (bs, 7), generator=g, dtype=torch.int32).to(dev))
    t_com = torch.randint(0, 2, (bs, 16), generator=g, dtype=torch.int32).to(dev)
    t_ch, t_ver = ch_counts.clone(), ch_counts.clone()
    t_cused = torch.zeros(bs, dtype=torch.bool, device=dev)

    def tail_flags() -> None:  # ModelTail.update's flags (the corpus tail's mask included)
        mtail._flags(t_com, ch_counts, t_ch, t_ver, True, t_cused)

    for _ in range(3):  # fill the rings
        h.append(slots, new, cnt)
        apply()
        record()
        on2.apply(slots, tok, length, q.clone(), q.clone())
        update()
        ag_apply()
        ag_share()
        ag_update()
    return {"apply": apply, "update_from_history": record, "update": update, "agreement.apply": ag_apply,
            "agreement.share": ag_share, "agreement.update": ag_update, "stats.update": stats,
            "corpus_table.price": corpus_price, "choose": choose, "chain_counters.add": counters,
            "tail.flags": tail_flags}


def _time(fn, dev: torch.device, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        else:
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e6)
    return statistics.median(ts)


def _ops(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.name.startswith("aten::") and e.cpu_parent is None for e in prof.events())  # a launch is none


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda or cpu")
    p.add_argument("--bs", default="1,4,32,128")
    p.add_argument("--width", type=int, default=16, help="L, draft columns")
    p.add_argument("--hist", type=int, default=1024, help="history width per request")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    dev = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                       ("cpu" if a.device == "auto" else a.device))
    triton_ok = dev.type == "cuda"
    print(f"device {dev}, L {a.width}, history {a.hist}; us per call, median of {a.repeats}")
    print("| call | bs | torch | triton | triton, graph | ops torch | ops triton |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in ("apply", "update_from_history", "update", "agreement.apply", "agreement.share", "agreement.update",
                 "stats.update", "corpus_table.price", "choose", "chain_counters.add", "tail.flags"):
        for bs in (int(x) for x in a.bs.split(",")):
            row = {}
            for backend in ("torch", "triton") if triton_ok else ("torch",):
                fn = _setup(bs, backend, dev, a.width, a.hist)[name]
                row[backend] = _time(fn, dev, a.repeats, a.warmup)
                row["ops " + backend] = _ops(fn)
                if backend == "triton" and dev.type == "cuda":
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        fn()
                    row["graph"] = _time(graph.replay, dev, a.repeats, a.warmup)

            def f(k: str) -> str:
                v = row.get(k)
                return "-" if v is None else (str(v) if isinstance(v, int) else f"{v:.1f}")

            print(f"| {name} | {bs} | {f('torch')} | {f('triton')} | {f('graph')} | {f('ops torch')} | "
                  f"{f('ops triton')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
