#!/usr/bin/env python
"""Compile every Triton kernel of the project for a CUDA target on a machine without a GPU, and print a table.

The Triton interpreter (``TRITON_INTERPRET=1``, what the CPU tests use) runs a kernel's Python, not its
compiled form: a kernel can pass every interpreter test and still fail to compile (a loop-carried value that
changes type, an unsupported construct). This script calls the real launchers with CPU tensors under a stand-in
CUDA driver that only answers "which device and target", and compiles each launch (Triton IR, LLVM, PTX and
``ptxas`` to a cubin) instead of running it. It proves the kernels compile for the target and reports their
size; it runs nothing, so it says nothing about results or speed (``scripts/gpu_check.sh`` does, on a GPU).

    python scripts/compile_kernels.py                  # sm_90 (H100 / H200)
    python scripts/compile_kernels.py --arch 80,90     # several targets

Compile seconds are real: the script uses a fresh Triton cache unless ``TRITON_CACHE_DIR`` is set (launches
that share a kernel and its specialisation, like the corpus insert phases, compile once each anyway). Exit
status 0 if every kernel compiled for every target. ``tests/test_compile_kernels.py`` runs it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    # Triton decides interpreted vs compiled when a kernel is decorated: it must be off before any import.
    sys.exit("compile_kernels.py: run with TRITON_INTERPRET unset or 0 (it compiles; the interpreter cannot)")
os.environ["TRITON_INTERPRET"] = "0"
if "TRITON_CACHE_DIR" not in os.environ:  # a fresh cache: every kernel really compiles, and its time is real
    import tempfile

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_kernels_triton_")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class _TargetOnlyDriver:
    """Answers the questions Triton asks before it compiles; any attempt to launch never gets here."""

    def __init__(self, arch: int) -> None:
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


COMPILED: list[tuple[str, object, float]] = []


def _compile_only(run):
    def run_warmup(self, *args, grid, warmup, **kwargs):
        t0 = time.perf_counter()
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)  # compile (or the cache), never launch
        COMPILED.append((self.fn.__name__, kernel, time.perf_counter() - t0))
        return kernel

    return run_warmup


def _i32(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int32)


def launch_all(bs: int) -> list[str]:
    """Call every launcher once at batch size ``bs`` (DSpark-shaped defaults); returns the launches' labels."""
    from sglang_hybrid.calibration.apply import DeviceCalibration, apply_calibration_triton
    from sglang_hybrid.calibration.table import CalibrationTable
    from sglang_hybrid.ngram import corpus_kernels, kernels
    from sglang_hybrid.ngram.corpus import make_coef
    from sglang_hybrid.selection.buffers import SelectionOutput
    from sglang_hybrid.selection.triton_kernel import select_chains_triton

    labels = []
    width, D, slots = 1024, 16, torch.arange(bs, dtype=torch.int64)
    toks, lens, plens = _i32(bs, width), _i32(bs), _i32(bs)
    kernels.history_write_prompt_triton(toks, lens, plens, slots, _i32(bs, 64), _i32(bs))
    kernels.history_append_triton(toks, lens, slots, _i32(bs, 8), _i32(bs))
    kernels.history_reset_triton(lens, plens, slots)
    outs = (_i32(bs, D), _i32(bs), _i32(bs), _i32(bs), _i32(bs))
    kernels.ngram_lookup_triton(toks, lens, plens, slots, *outs, 2, 8, 0)
    stash = (torch.zeros(bs, 7, dtype=torch.int64), _i32(bs, 7), torch.zeros(bs, dtype=torch.int64), _i32(bs))
    kernels.history_stash_triton(toks, lens, slots, *stash)
    kernels.history_restore_triton(toks, lens, *stash)
    kernels.ngram_probe_triton(toks, lens, slots, _i32(bs, 7), _i32(4), _i32(bs, 4), 2, 0)
    labels += ["history write_prompt", "history append", "history reset", "n-gram lookup", "history stash",
               "history restore", "n-gram probe"]

    nb, ways, n_max = 1 << 18, 8, 8
    table, coef, tenant = (_i32(nb, ways), _i32(nb, ways), _i32(nb, ways)), make_coef(n_max, "cpu"), _i32(bs)
    corpus_kernels.corpus_lookup_triton(*table, coef, toks, lens, slots, tenant, _i32(bs, D), _i32(bs), _i32(bs),
                                        _i32(bs), _i32(bs), _i32(bs, D), n_max, 1, 1 << 14)
    scratch = torch.zeros(corpus_kernels.scratch_size(bs, 32, n_max), dtype=torch.int64)
    corpus_kernels.corpus_insert_triton(*table, _i32(nb * ways), coef, toks, lens, slots, tenant, _i32(bs), _i32(bs),
                                        32, n_max, True, scratch)
    labels += ["corpus lookup", "corpus insert claim", "corpus insert resolve", "corpus insert count"]

    cal = DeviceCalibration(CalibrationTable.load_default(), "cpu", backend="torch")
    q, surv = torch.zeros((bs, D), dtype=torch.float32), torch.zeros((bs, D), dtype=torch.float32)
    apply_calibration_triton(cal.table, cal.lut_n, cal.lut_j, cal.lut_c, cal.lut_p, cal.lut_a, _i32(bs, D),
                             _i32(bs), _i32(bs), _i32(bs), _i32(bs), _i32(bs, D) if cal.lut_a.numel() > 1 else None,
                             q, surv)
    labels += ["calibration apply"]

    from sglang_hybrid.calibration.deferred import DEFAULT_DEPTH
    from sglang_hybrid.calibration.deferred_kernel import deferred_score_triton

    depth, L = DEFAULT_DEPTH, D
    f32, i64 = (lambda *sh: torch.zeros(sh, dtype=torch.float32)), (lambda *sh: torch.zeros(sh, dtype=torch.int64))
    for bins in (8, 0):  # the step's default (bins 8) and the first stage alone
        rings = (_i32(bs, depth, L), f32(bs, depth, L), i64(bs, depth), i64(bs, depth), i64(bs, depth),
                 f32(bs, depth, L), i64(bs))
        c = (f32(bs, depth + 1, L), f32(bs, depth + 1, L), f32(bs, depth + 1, L), f32(bs, depth + 1, L),
             i64(bs, depth + 1, L))
        deferred_score_triton(rings, slots, _i32(bs, L), i64(bs), f32(bs, L), i64(bs), f32(bs, L), toks, lens, *c,
                              bins)
    labels += ["deferred scoring (bins)", "deferred scoring"]

    from sglang_hybrid.calibration.online_kernel import online_apply_triton

    for bins in (8, 0):  # the step's n-gram record (bins 8) and the corpus candidates' (none)
        K = max(bins, 1)
        online_apply_triton(f32(bs, L), f32(bs, L), f32(L), f32(L), f32(K * L), f32(K * L), 2.0, slots, _i32(bs, L),
                            i64(bs), f32(bs, L), f32(bs, L), i64(bs), _i32(bs, L), i64(bs), f32(bs, L), f32(bs, L),
                            i64(bs, L), bins)
    labels += ["online apply (bins)", "online apply"]

    from sglang_hybrid.calibration.online_kernel import online_update_triton

    for bins in (8, 0):
        online_update_triton(slots, _i32(bs, L), i64(bs), f32(bs, L), f32(bs, L), _i32(bs, 9), _i32(bs), i64(bs),
                             f32(bs, L), f32(bs, L), f32(bs, L), f32(bs, L), bins)
    labels += ["online update (bins)", "online update"]

    from sglang_hybrid.calibration.agreement_kernel import (agreement_apply_triton, agreement_share_triton,
                                                            agreement_update_triton)

    gamma, g = 7, 7
    agreement_apply_triton(_i32(bs, L), i64(bs), f32(bs, L), _i32(bs, gamma), f32(bs, gamma), g)
    agreement_share_triton(_i32(bs, L), i64(bs), f32(bs, L), _i32(bs, gamma), f32(bs, gamma), f32(2), torch.ones(()),
                           f32(bs, g), f32(bs, g), f32(bs, g), torch.zeros((bs, g), dtype=torch.bool), _i32(bs, g))
    agreement_update_triton(_i32(bs, g), f32(bs, g), torch.zeros((bs, g), dtype=torch.bool), _i32(bs, 9), _i32(bs),
                            f32(2, bs, g))
    labels += ["agreement apply", "agreement share", "agreement update"]

    from sglang_hybrid.stats import StepStats
    from sglang_hybrid.stats_kernel import stats_elems_triton, stats_reduce_triton

    stats_elems_triton(_i32(bs), _i32(bs), _i32(bs), i64(bs), i64(bs), i64(bs, 7), f32(bs, gamma), f32(bs, gamma),
                       True)
    st = StepStats(num_slots=bs, max_bs=bs, gamma=gamma, model_prior=0.5, model_ema=0.1, device=torch.device("cpu"),
                   backend="torch")
    stats_reduce_triton(st, torch.arange(bs), i64(bs), i64(bs), i64(bs, 7))
    labels += ["step counters", "step counters (batch)"]

    from sglang_hybrid.calibration.corpus_table import DEFAULT_CORPUS_TABLE, CorpusTable
    from sglang_hybrid.calibration.corpus_table_kernel import corpus_price_triton

    ctab = CorpusTable.load(DEFAULT_CORPUS_TABLE).to_device(bs, L, "cpu", backend="torch")
    corpus_price_triton(ctab, _i32(bs, L), torch.ones(()), _i32(bs), _i32(bs), f32(bs, L))
    labels += ["corpus table price"]

    from sglang_hybrid.calibration.choose_kernel import choose_rows_triton

    ch = (f32(bs, L), f32(bs, L), L, f32(bs), f32(bs), torch.zeros(bs, dtype=torch.bool), _i32(bs, L), _i32(bs, L),
          _i32(bs, L))
    choose_rows_triton(*ch, _i32(bs), _i32(bs), _i32(bs))  # the corpus candidate's: tokens and lengths
    choose_rows_triton(*ch, q_a=f32(bs, L), q_b=f32(bs, L), q_out=f32(bs, L))  # the tails': tokens and estimates
    labels += ["choose rows (lengths)", "choose rows (estimates)"]

    from sglang_hybrid.calibration.counters import ChainCounters
    from sglang_hybrid.calibration.counters_kernel import chain_counters_add_triton

    cc = ChainCounters(bs, "cpu", ("n", "acc"), offset=1, backend="torch")
    chain_counters_add_triton(cc, torch.zeros(bs, dtype=torch.bool), *cc.rows(bs)[1:], _i32(bs))
    labels += ["chain counters"]

    from sglang_hybrid.calibration.tail import ModelTail
    from sglang_hybrid.calibration.tail_kernel import tail_flags_triton
    from sglang_hybrid.ngram.config import NgramConfig

    mt = ModelTail(bs, bs, 7, NgramConfig(n_min=2, n_max=8, max_draft=8), "cpu", online=False, backend="torch")
    tail_flags_triton(mt, _i32(bs, 16), _i32(bs), _i32(bs), _i32(bs), True, torch.zeros(bs, dtype=torch.bool))
    labels += ["tail flags"]

    out = SelectionOutput.empty(bs, D)
    sel = (_i32(bs, gamma), torch.ones((bs, gamma)), _i32(bs, D), torch.ones((bs, D)), _i32(bs))
    select_chains_triton(*sel, torch.tensor([4 * bs], dtype=torch.int32), None, out)
    select_chains_triton(*sel, None, torch.ones(bs * (1 + D) + 1), out)
    labels += ["selection (budget)", "selection (SPS price)"]
    return labels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="90", help="compute capabilities, comma-separated (90 = H100 / H200)")
    p.add_argument("--bs", default="4", help="batch sizes, comma-separated (the selection compiles per power of 2)")
    args = p.parse_args(argv)
    JITFunction.run = _compile_only(JITFunction.run)
    print("| arch | bs | launch | kernel | PTX lines | shared bytes | compile s |")
    print("|---|---:|---|---|---:|---:|---:|")
    failed = 0
    for arch in (int(a) for a in args.arch.split(",")):
        driver.set_active(_TargetOnlyDriver(arch))
        for bs in (int(b) for b in args.bs.split(",")):
            COMPILED.clear()
            try:
                labels = launch_all(bs)
            except Exception as exc:  # noqa: BLE001 - report which launch failed, then the error
                failed += 1
                done = len(COMPILED)
                print(f"| {arch} | {bs} | FAILED after {done} launches | {type(exc).__name__}: {exc} | | | |")
                continue
            if len(labels) != len(COMPILED):
                failed += 1
                print(f"| {arch} | {bs} | FAILED | {len(labels)} launches expected, {len(COMPILED)} compiled | | | |")
                continue
            for label, (name, kernel, dt) in zip(labels, COMPILED):
                ptx = len(kernel.asm["ptx"].splitlines())
                if "cubin" not in kernel.asm:  # ptxas did not produce a binary
                    failed += 1
                    name += " (no cubin)"
                print(f"| {arch} | {bs} | {label} | {name} | {ptx} | {getattr(kernel.metadata, 'shared', '-')} | "
                      f"{dt:.1f} |")
    print("all kernels compiled" if not failed else f"{failed} FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
