"""scripts/bench_serving.py --dry-run: every command is checked against SGLang's own parsers on a CPU box."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench_serving.py"


def _run(*extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), "--dry-run", "--model", "/models/target", "--draft-model", "/models/draft",
           "--hybrid-draft-model", "/models/eagle3", "--hybrid-max-draft", "9", "--sps-table", "/tables/sps.json",
           *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.fixture(scope="module")
def good():
    return _run()


def test_dry_run_checks_out(good):
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    out = good.stdout
    assert "dry run: all commands check out" in out
    for algo in ("DSPARK", "NGRAM", "HYBRID_SPARK"):
        assert f"--speculative-algorithm {algo}" in out
    assert "SGLANG_RAGGED_VERIFY_MODE=compact" in out
    # dspark, ngram, hybrid (DSpark) and hybrid_eagle (--hybrid-draft-model given) x workloads x concurrencies
    assert out.count("-m sglang.benchmark.serving") == 4 * 2 * 3
    for c in ("4", "32", "128"):
        assert f"--max-concurrency {c} " in out
    assert "--max-running-requests 128" in out and "--dataset-name custom" in out and "--temperature 0" in out
    assert "rows sampled by SGLang's custom loader" in out
    assert "HYBRID_SPARK resolves through SGLang's plugin registry" in out
    hybrids = [line for line in out.splitlines() if "--speculative-algorithm HYBRID_SPARK" in line]
    assert len(hybrids) == 2
    dspark, eagle = sorted(hybrids, key=lambda line: "/models/eagle3" in line)
    # On DSpark: the same draft, SPS table and ragged mode as DSPARK, n-gram chains widened to 9.
    assert "--speculative-draft-model-path /models/draft" in dspark and "SGLANG_HYBRID_MAX_DRAFT=9" in dspark
    assert "--speculative-dspark-sps-table-path /tables/sps.json" in dspark and "SGLANG_RAGGED_VERIFY_MODE=compact" in dspark
    assert "SGLANG_HYBRID_MAX_DRAFT=9" in eagle and "--speculative-draft-model-path /models/eagle3" in eagle
    assert "--speculative-dspark-sps-table-path" not in eagle  # a fixed verify window: no budget to set


def test_dry_run_rejects_an_unknown_server_flag(capsys):
    mod = load_script("bench_serving", SCRIPT)
    rc = mod.main(["--dry-run", "--model", "m", "--draft-model", "d", "--policies", "ngram", "--concurrency", "4",
                   "--extra-server-args", "--no-such-flag 1"])
    assert rc == 1
    assert "PROBLEM: server ngram" in capsys.readouterr().err
