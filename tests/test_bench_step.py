"""``scripts/bench_step.py`` on a CPU: the eager table runs, and its graph == eager check compares what it must
(a replay that skips part of the step is reported, not passed). The real graph capture needs a GPU
(``scripts/gpu_check.sh`` runs it there)."""

from __future__ import annotations

import types
from pathlib import Path

import torch

from tests.script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent


def _load():
    return load_script("bench_step")


def _args(**kw):
    a = dict(corpus_entries=1 << 12, hist=256, gamma=7, window=16, vocab=16, prompt=128, warmup=2, check_steps=4)
    a.update(kw)
    return types.SimpleNamespace(**a)


def test_cpu_table_runs(capsys) -> None:
    mod = _load()
    import sys

    argv = sys.argv
    sys.argv = ["bench_step.py", "--device", "cpu", "--bs", "2", "--hist", "256", "--prompt", "128",
                "--repeats", "2", "--warmup", "1", "--corpus-entries", "4096"]
    try:
        assert mod.main() == 0
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    assert "| 2 | off |" in out and "| 2 | shared |" in out and "n/a (no GPU)" in out


def test_check_passes_an_exact_replay_and_reports_a_wrong_one(monkeypatch) -> None:
    mod = _load()
    monkeypatch.setattr(mod.torch.cuda, "synchronize", lambda: None)
    cpu = torch.device("cpu")
    # an exact "graph": the eager step itself
    monkeypatch.setattr(mod, "_capture", lambda b: types.SimpleNamespace(replay=b.run))
    for corpus in ("off", "shared"):
        assert mod._check(_args(), 3, corpus, cpu) == "exact"
    assert mod._check(_args(fairness=2.0), 3, "off", cpu) == "exact"  # the weights' records are compared too
    assert mod._check(_args(fairness=2.0, fairness_scope="tenant"), 3, "off", cpu) == "exact"  # two tenants

    # a replay that proposes but never records: the histories drift apart, the check names what differs
    def propose_only(b):
        def replay():
            p = b.step.propose(b.slots, b.mt, model_confidence=b.mc)
            w = p.tokens.shape[1]
            b.out_tokens[:, :w].copy_(p.tokens)
            b.out_vlen.copy_(p.verify_len)
            b.out_choice.copy_(p.choice)
        return types.SimpleNamespace(replay=replay)

    monkeypatch.setattr(mod, "_capture", propose_only)
    assert mod._check(_args(), 3, "shared", cpu).startswith("DIFF ")


def test_count_step_ops_reports_each_component() -> None:
    """``scripts/count_step_ops.py`` (the eager step's op count, by component) runs and sees the corpus."""
    import subprocess
    import sys

    out = {}
    for corpus in ("off", "shared"):
        p = subprocess.run([sys.executable, str(ROOT / "scripts" / "count_step_ops.py"), "--corpus", corpus, "--bs",
                            "2"], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        out[corpus] = p.stdout
    head = [o.splitlines()[0] for o in out.values()]
    n = [int(h.split(": ")[1].split()[0]) for h in head]
    assert 0 < n[0] < n[1], head  # the corpus adds ops
    assert "online.update_from_history" in out["off"] and "corpus_cand.update" in out["shared"]
    assert "corpus_cand" not in out["off"]
