#!/usr/bin/env python
"""Count the torch ops one Hybrid Spark decode step (``propose`` + ``record``) issues outside its Triton kernels,
by component: what an eager launch of the step pays per op on a GPU (see README "On an H200").

Runs on a CPU: the Triton kernels under the interpreter (their insides are not counted; each is one launch on
a GPU), the rest as the worker runs it, in the DSpark shape of ``scripts/bench_step.py`` at batch ``--bs``.
Prints one line per component: top-level ``aten::`` ops (views included) and Triton kernel calls.

    python scripts/count_step_ops.py --corpus off
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["SGLANG_HYBRID_SYNC_GUARD"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import bench_step  # noqa: E402
from sglang_hybrid import step as step_mod  # noqa: E402

COMPONENTS = {"history": ["lookup", "append", "lookup_after", "run_after"], "calib_dev": ["apply"],
              "online": ["apply", "update", "update_from_history"], "corpus": ["lookup", "insert"],
              "corpus_cand": ["price", "choose", "update"], "tail": ["extend", "update", "draft_buffers"],
              "ctail": ["lookup", "price", "update"], "stats": ["update"],
              "agreement": ["apply", "share", "update"],
              "echo": ["start", "probe", "lift_model", "finish", "score"]}
KERNELS = {"history": ["_lookup", "_append", "_stash", "_restore", "_probe"], "calib_dev": ["_fn"],
           "corpus": ["_lookup", "_insert"], "corpus_cand": ["_choose"], "tail": ["_choose", "_flags"]}


def _tag(obj, name: str, label: str) -> None:
    fn = getattr(obj, name)

    def run(*a, **k):
        with record_function(label):
            return fn(*a, **k)

    setattr(obj, name, run)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default="off", choices=["off", "shared", "tenant"])
    p.add_argument("--bs", type=int, default=4)
    p.add_argument("--detail", action="store_true", help="also list each component's ops by name")
    p.add_argument("--echo-probes", type=int, default=None, help="the option echo_probes (default: the config's)")
    a = p.parse_args()
    args = argparse.Namespace(corpus_entries=1 << 16, hist=1024, gamma=7, window=16, vocab=64, prompt=128)
    if a.echo_probes is not None:
        args.echo_probes = a.echo_probes
    b = bench_step.Bench(args, a.bs, a.corpus, torch.device("cpu"), backend="triton")
    st = b.step
    for comp, names in KERNELS.items():
        for n in names:
            if getattr(st, comp, None) is not None:
                _tag(getattr(st, comp), n, "K")
    # The online records' kernels (Triton backend): apply in each record, and the step's deferred scoring.
    for rec in (st.online, *(getattr(getattr(st, c, None), "online", None) for c in ("tail", "corpus_cand", "ctail"))):
        if rec is not None and rec._apply_kernel is not None:
            _tag(rec, "_apply_kernel", "K")
            _tag(rec, "_update_elems", "K")
    if st.online is not None and st.online.deferred is not None:
        _tag(st.online.deferred, "_elems", "K")
    if st.agreement is not None and st.agreement.backend == "triton":  # the model-agreement kernels
        for n in ("_apply_elems", "_share_elems", "_update_elems"):
            _tag(st.agreement, n, "K")
    if st.stats.backend == "triton":  # the counters' kernels
        _tag(st.stats, "_elems", "K")
        _tag(st.stats, "_reduce", "K")
    for c in ("corpus_cand", "ctail"):  # the corpus's fitted table
        tab = getattr(getattr(st, c, None), "table", None)
        if tab is not None and tab.backend == "triton":
            _tag(tab, "_price", "K")
    for c in ("corpus_cand", "tail", "ctail"):  # the chains' counters
        cc = getattr(getattr(st, c, None), "counters", None)
        if cc is not None and cc.backend == "triton":
            _tag(cc, "_add", "K")
    for comp, names in COMPONENTS.items():
        for n in names:
            if getattr(st, comp, None) is not None and hasattr(getattr(st, comp), n):
                _tag(getattr(st, comp), n, f"C:{comp}.{n}")
    real = step_mod.select_chains

    def sel(*x, **k):  # one kernel on a GPU; its interpreter ops are not counted
        with record_function("K"):
            return real(*x, **k)

    step_mod.select_chains = sel
    inputs = bench_step._inputs(args, a.bs, 3, torch.device("cpu"))
    for x in inputs[:2]:
        b.set_inputs(x)
        b.run()
    b.set_inputs(inputs[2])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        b.run()
    ops, kernels = collections.Counter(), collections.Counter()
    names: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in prof.events():
        scope, inside_kernel, par = "glue", False, e.cpu_parent
        while par is not None:
            if par.name == "K" and e.name != "K":
                inside_kernel = True
            if par.name.startswith("C:") and scope == "glue":
                scope = par.name[2:]
            par = par.cpu_parent
        if e.name == "K":
            kernels[scope] += 1
        elif e.name.startswith("aten::") and not inside_kernel and (
                e.cpu_parent is None or e.cpu_parent.name.startswith("C:")):
            ops[scope] += 1
            names[scope][e.name] += 1
    print(f"corpus={a.corpus} bs={a.bs}: {sum(ops.values())} top-level torch ops, "
          f"{sum(kernels.values())} Triton kernel calls")
    for scope in sorted(set(ops) | set(kernels), key=lambda s: -ops[s]):
        print(f"  {scope:28s} {ops[scope]:4d} ops  {kernels[scope]:2d} kernels")
        if a.detail and names[scope]:
            print("      " + ", ".join(f"{n[6:]} {c}" for n, c in names[scope].most_common()))


if __name__ == "__main__":
    main()
