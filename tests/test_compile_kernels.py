"""Every Triton kernel compiles for sm_90 (H100 / H200) on this CPU machine: ``scripts/compile_kernels.py`` runs
Triton's real compiler (IR, PTX, ptxas) through the launchers under a stand-in driver. The interpreter tests
cannot catch a kernel that only fails to compile; this can. It runs nothing on a GPU (``gpu_check.sh`` does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compile_kernels.py"
LAUNCHES = ("history write_prompt", "history append", "history reset", "n-gram lookup", "history stash",
            "history restore", "n-gram probe", "corpus lookup",
            "corpus insert claim", "corpus insert resolve", "corpus insert count", "calibration apply",
            "deferred scoring (bins)", "deferred scoring", "online apply (bins)", "online apply",
            "online update (bins)", "online update", "agreement apply", "agreement share", "agreement update",
            "step counters", "step counters (batch)", "corpus table price",
            "choose rows (lengths)", "choose rows (estimates)", "chain counters",
            "tail flags", "selection (budget)", "selection (SPS price)")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton_cache")
    return env


def test_every_kernel_compiles_for_sm90(tmp_path: Path) -> None:
    """bs 1 and 4: Triton specialises integer arguments equal to 1, so a batch of one compiles other variants."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--arch", "90", "--bs", "1,4"], cwd=ROOT, env=_env(tmp_path),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all kernels compiled" in r.stdout
    for bs in (1, 4):
        rows = [line for line in r.stdout.splitlines() if line.startswith(f"| 90 | {bs} |")]
        assert [row.split(" | ")[2] for row in rows] == list(LAUNCHES), r.stdout
        assert not any("cubin" in row for row in rows)


def test_a_kernel_that_only_fails_to_compile_is_caught(tmp_path: Path) -> None:
    """A loop-carried value that changes type runs under the interpreter but does not compile: the harness
    reports the compiler's error (the check would pass silently if it only interpreted)."""
    probe = f"""
import sys
sys.path.insert(0, {str(ROOT / 'scripts')!r})
import compile_kernels as ck
import torch, triton, triton.language as tl
from triton.runtime import driver
from triton.runtime.jit import JITFunction

@triton.jit
def bad(x_ptr):
    v = tl.zeros([], tl.int32)
    for i in range(4):
        v = v.to(tl.int64) + 1
    tl.store(x_ptr, v)

JITFunction.run = ck._compile_only(JITFunction.run)
driver.set_active(ck._TargetOnlyDriver(90))
try:
    bad[(1,)](torch.zeros(1, dtype=torch.int64))
except Exception as exc:
    print("COMPILE ERROR", type(exc).__name__)
else:
    print("COMPILED")
"""
    path = tmp_path / "probe.py"  # a file: Triton reads a kernel's source with inspect
    path.write_text(probe)
    r = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                       timeout=300)
    assert "COMPILE ERROR" in r.stdout, r.stdout + r.stderr


def test_refuses_to_run_under_the_interpreter(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env["TRITON_INTERPRET"] = "1"
    r = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "TRITON_INTERPRET" in r.stderr
