#!/usr/bin/env python
"""Benchmark one whole Hybrid Spark decode step (``HybridStep.propose`` + ``record``) and check that a captured
CUDA graph of it replays exactly what the eager step computes.

The step is the DSpark shape by default: a ``--gamma`` 7-token model chain with its confidences, a verify
window of ``--window`` 16 draft tokens (so the n-gram tail fills up to 9 columns after the model chain), online
calibration on, and the cross-request corpus off and shared (one row each). Histories are ``--prompt`` tokens
from a small vocabulary (``--vocab``), so lookups match and every candidate, the tail and the corpus do real
work. Each step's inputs (model chain, confidences, accepted length, bonus token) are drawn ahead, the same for
every run.

Columns, per batch size, in microseconds (median of ``--repeats`` timed steps after ``--warmup``):
  eager   the step launched from Python (CUDA events around each step on a GPU; ``perf_counter`` on CPU)
  graph   one replay of a CUDA graph captured from the same step (GPU only)
  check   "exact" when, over ``--check-steps`` steps from the same state, the graph's proposals (tokens, verify
          lengths, choices) and the final device state (history, lengths, counters) equal the eager run's
          bit for bit; "DIFF ..." names the first tensor that differs (and the script exits 1)

With ``SGLANG_HYBRID_SYNC_GUARD=1`` (set here) any host read of a device tensor inside the step raises, so a
graph that captures at all also proves the step never synchronises.

Example::

    python scripts/bench_step.py --device cuda --bs 1,4,32,128          # the GPU table and check
    python scripts/bench_step.py --device cpu --bs 1,4 --repeats 3      # eager only, torch kernels
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ["SGLANG_HYBRID_SYNC_GUARD"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sglang_hybrid.config import HybridConfig  # noqa: E402
from sglang_hybrid.graphs import cuda_capture  # noqa: E402
from sglang_hybrid.selection import dense_sps, roofline_sps_table  # noqa: E402
from sglang_hybrid.step import HybridStep  # noqa: E402


class Bench:
    """One ``HybridStep`` with static input buffers, so a step is the same Python for eager and capture."""

    def __init__(self, args, bs: int, corpus: str, device: torch.device, backend: str = "") -> None:
        fairness = getattr(args, "fairness", 0.0)
        scope = getattr(args, "fairness_scope", "request")
        cfg = HybridConfig(corpus=corpus, corpus_entries=args.corpus_entries, fairness=fairness,
                           fairness_scope=scope, model_splices=getattr(args, "model_splices", 0),
                           echo_probes=getattr(args, "echo_probes", HybridConfig.echo_probes))
        backend = backend or ("torch" if device.type == "cpu" else "auto")
        # The slot count is fixed, as in a server (the largest batch benchmarked): kernels that take it then
        # compile once, not once per row.
        slots = max(bs, getattr(args, "num_slots", 0))
        # fairness needs DSpark's SPS budget: the shipped roofline table (the selection then runs in SPS mode).
        sps = dense_sps(roofline_sps_table(), slots * (2 + args.gamma + args.window)) if fairness > 0 else None
        self.step = HybridStep(cfg, num_slots=slots, width=args.hist, gamma=args.gamma, max_bs=slots,
                               device=device, verify_window=args.window, kernel_backend=backend, sps_dense=sps)
        g = torch.Generator().manual_seed(1234 + bs)
        self.slots = torch.arange(bs, dtype=torch.int32, device=device)
        prompt = torch.randint(0, args.vocab, (bs, args.prompt), generator=g, dtype=torch.int32)
        plen = torch.full((bs,), args.prompt, dtype=torch.int32)
        tenant = (torch.arange(bs, dtype=torch.int32, device=device) % 2) if self.step.tracks_tenant else None
        self.step.on_prefill(self.slots, prompt.to(device), plen.to(device), prompt[:, -1].to(device), tenant)
        if self.step.corpus is not None:  # the corpus starts with the prompts (as earlier requests' text)
            self.step.corpus.insert_prompt(self.step.history, self.slots, plen.to(device),
                                           max_prompt_len=args.prompt)
        self.mt = torch.zeros(bs, args.gamma, dtype=torch.int32, device=device)
        self.mc = torch.zeros(bs, args.gamma, dtype=torch.float32, device=device)
        self.acc = torch.zeros(bs, dtype=torch.int32, device=device)
        self.bonus = torch.zeros(bs, dtype=torch.int32, device=device)
        w = self.step.width
        self.committed = torch.zeros(bs, w + 1, dtype=torch.int32, device=device)
        self.accept_lens = torch.zeros(bs, dtype=torch.int32, device=device)
        self.out_tokens = torch.zeros(bs, w, dtype=torch.int32, device=device)
        self.out_vlen = torch.zeros(bs, dtype=torch.int32, device=device)
        self.out_choice = torch.zeros(bs, dtype=torch.int32, device=device)

    def set_inputs(self, inp: tuple) -> None:
        for buf, x in zip((self.mt, self.mc, self.acc, self.bonus), inp):
            buf.copy_(x, non_blocking=True)

    def run(self) -> None:
        """Propose, fake a verify (accept min(acc, verify_len) drafts + the bonus), record. No host reads."""
        p = self.step.propose(self.slots, self.mt, model_confidence=self.mc)
        w = p.tokens.shape[1]
        self.committed[:, :w].copy_(p.tokens)
        torch.minimum(p.verify_len, self.acc, out=self.accept_lens)
        # the bonus token lands right after the accepted drafts
        self.committed.scatter_(1, self.accept_lens.to(torch.int64).view(-1, 1), self.bonus.view(-1, 1))
        self.accept_lens.add_(1)
        self.step.record(self.slots, p, self.committed, self.accept_lens)
        self.out_tokens[:, :w].copy_(p.tokens)
        self.out_vlen.copy_(p.verify_len)
        self.out_choice.copy_(p.choice)

    def state(self) -> dict:
        s = self.step
        d = {"history.tokens": s.history.tokens, "history.lens": s.history.lens,
             "stats.counters": s.stats.counters, "stats.model_cond": s.stats.model_cond}
        if s.fair is not None:
            for name in ("hyb_tokens", "hyb_seconds", "ds_tokens", "ds_seconds", "steps", "w"):
                d[f"fair.{name}"] = getattr(s.fair, name)
        if s.corpus is not None:
            for name, t in vars(s.corpus).items():
                if isinstance(t, torch.Tensor):
                    d[f"corpus.{name}"] = t
        return d


def _inputs(args, bs: int, n: int, device: torch.device) -> list:
    g = torch.Generator().manual_seed(99 + bs)
    out = []
    for _ in range(n):
        out.append((torch.randint(0, args.vocab, (bs, args.gamma), generator=g, dtype=torch.int32).to(device),
                    (0.5 + 0.5 * torch.rand(bs, args.gamma, generator=g)).to(device),
                    torch.randint(0, args.window + 1, (bs,), generator=g, dtype=torch.int32).to(device),
                    torch.randint(0, args.vocab, (bs,), generator=g, dtype=torch.int32).to(device)))
    return out


def _time(fn, inputs: list, b: Bench, device: torch.device) -> list:
    samples = []
    for inp in inputs:
        b.set_inputs(inp)
        if device.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            samples.append(e0.elapsed_time(e1) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
    return samples


def _capture(b: Bench) -> torch.cuda.CUDAGraph:
    """The step as ``GraphedStep`` captures it in serving (``sglang_hybrid/graphs.py``)."""
    graph = cuda_capture(b.run)
    torch.cuda.synchronize()
    return graph


def _check(args, bs: int, corpus: str, device: torch.device) -> str:
    """Eager and graph runs from the same state over the same inputs: equal outputs and state, bit for bit."""
    inputs = _inputs(args, bs, args.warmup + args.check_steps, device)
    a, b = Bench(args, bs, corpus, device), Bench(args, bs, corpus, device)
    for inp in inputs[: args.warmup]:  # both warm up eagerly (Triton compiles, budgets are built)
        for x in (a, b):
            x.set_inputs(inp)
            x.run()
    graph = _capture(b)
    for k, inp in enumerate(inputs[args.warmup:]):
        a.set_inputs(inp)
        a.run()
        b.set_inputs(inp)
        graph.replay()
        for name in ("out_tokens", "out_vlen", "out_choice"):
            if not torch.equal(getattr(a, name), getattr(b, name)):
                return f"DIFF {name} at step {k}"
    torch.cuda.synchronize()
    sa, sb = a.state(), b.state()
    for name in sa:
        if not torch.equal(sa[name], sb[name]):
            return f"DIFF {name}"
    return "exact"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda or cpu")
    p.add_argument("--bs", default="1,4,32,128", help="batch sizes, comma-separated")
    p.add_argument("--corpus", default="off,shared", help="corpus modes, comma-separated (off, shared)")
    p.add_argument("--hist", type=int, default=8192, help="history width per request (tokens)")
    p.add_argument("--prompt", type=int, default=2048, help="prompt tokens per request")
    p.add_argument("--vocab", type=int, default=64, help="token ids drawn from [0, vocab)")
    p.add_argument("--gamma", type=int, default=7, help="model chain tokens (DSpark block)")
    p.add_argument("--window", type=int, default=16, help="verify window, draft tokens")
    p.add_argument("--corpus-entries", type=int, default=1 << 21)
    p.add_argument("--fairness", type=float, default=0.0,
                   help="the option fairness (0 = off); > 0 runs the step with the shipped roofline SPS table")
    p.add_argument("--fairness-scope", choices=("request", "tenant"), default="request",
                   help="the option fairness_scope; 'tenant': the requests alternate between two tenants")
    p.add_argument("--model-splices", type=int, default=0,
                   help="the option model_splices (calibration/splice.py): splice points before the model chain's end")
    p.add_argument("--echo-probes", type=int, default=HybridConfig.echo_probes,
                   help="the option echo_probes (calibration/echo.py): lookups that extend the echo's reach")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--check-steps", type=int, default=20)
    args = p.parse_args()
    args.num_slots = max(int(x) for x in args.bs.split(","))
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    gpu = device.type == "cuda"
    print(f"HybridStep propose + record, gamma {args.gamma}, window {args.window}, history {args.hist}, "
          f"prompt {args.prompt}, vocab {args.vocab}, fairness {args.fairness:g} ({args.fairness_scope}), "
          f"model_splices {args.model_splices}, echo_probes {args.echo_probes}, "
          f"device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if gpu else "") + "; median us per step\n")
    print("| bs | corpus | eager us | graph us | graph == eager |")
    print("|---:|---|---:|---:|---|")
    failed = False
    for corpus in args.corpus.split(","):  # corpus outer: the plain step's rows first if time runs out
        for bs in [int(x) for x in args.bs.split(",")]:
            b = Bench(args, bs, corpus, device)
            inputs = _inputs(args, bs, args.warmup + args.repeats, device)
            _time(b.run, inputs[: args.warmup], b, device)
            eager = statistics.median(_time(b.run, inputs[args.warmup:], b, device))
            graph_us, check = "n/a (no GPU)", "n/a (no GPU)"
            if gpu:
                graph = _capture(b)
                graph_us = f"{statistics.median(_time(graph.replay, inputs[args.warmup:], b, device)):.1f}"
                check = _check(args, bs, corpus, device)
                failed |= check != "exact"
            print(f"| {bs} | {corpus} | {eager:.1f} | {graph_us} | {check} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
