"""``scripts/cpu_smoke.py`` argument handling (the engine runs themselves are exercised by hand; see the README)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))


def _mod():
    return load_script("cpu_smoke")


def test_dspark_runs_resolve_their_draft_mode_and_table():
    m = _mod()
    a = m.parse_args(["--prompts", "p.jsonl", "--algorithm", "DSPARK"])
    assert a.draft == "dspark" and a.verify_mode == "static"
    cfg = m.spec_config(a)
    assert cfg.algorithm == "DSPARK" and cfg.draft == "dspark"
    assert ("SGLANG_RAGGED_VERIFY_MODE", "static") in cfg.env
    assert not any(k == "speculative_dspark_sps_table_path" for k, _ in cfg.engine_kwargs)
    a = m.parse_args(["--prompts", "p.jsonl", "--algorithm", "HYBRID_SPARK", "--draft", "dspark",
                      "--verify-mode", "compact", "--max-draft", "7"])
    cfg = m.spec_config(a)
    env = dict(cfg.env)
    assert env["SGLANG_RAGGED_VERIFY_MODE"] == "compact" and env["SGLANG_HYBRID_MAX_DRAFT"] == "7"
    table = dict(cfg.engine_kwargs)["speculative_dspark_sps_table_path"]
    assert Path(table).is_file()


@pytest.mark.parametrize("argv", [
    ["--algorithm", "DSPARK", "--draft", "standalone"],
    ["--algorithm", "EAGLE3", "--draft", "dspark"],
    ["--algorithm", "HYBRID_SPARK", "--verify-mode", "compact"],  # a stand-alone draft has no verify modes
    ["--algorithm", "HYBRID_SPARK", "--max-draft", "-1"],
    ["--algorithm", "EAGLE3", "--corpus", "shared"],  # the corpus is a HYBRID_SPARK option
    ["--algorithm", "HYBRID_SPARK", "--rounds", "0"],
])
def test_bad_combinations_are_refused(argv):
    with pytest.raises(SystemExit) as e:
        _mod().parse_args(["--prompts", "p.jsonl", *argv])
    assert e.value.code == 2


def test_step_figures_read_dsparks_dump_and_the_hybrid_metrics():
    m = _mod()
    state = {"dspark_info_record": {"records": [{"num_verify_tokens": 9}, {"num_verify_tokens": 14}]},
             "hybrid_spark": {"max_verified_drafts_in_step": 7, "max_accepted_drafts_in_step": 6,
                              "ngram_win_rate": 0.25}}
    assert m.step_figures(state) == {"max_step_verify_tokens": 14, "max_request_verify_len": 7,
                                     "max_request_accepted": 6, "ngram_step_share": 0.25}
    assert m.step_figures({}) == {}
    hy = dict(state["hybrid_spark"], corpus_chosen=3, accepted_corpus=5)
    assert m.step_figures({"hybrid_spark": hy})["corpus_chosen"] == 3


def test_corpus_runs_get_their_own_engine_and_the_sync_guard():
    m = _mod()
    a = m.parse_args(["--prompts", "p.jsonl", "--algorithm", "HYBRID_SPARK", "--corpus", "shared", "--rounds", "2"])
    assert a.rounds == 2
    cfg = m.spec_config(a)
    env = dict(cfg.env)
    assert env["SGLANG_HYBRID_CORPUS"] == "shared" and env["SGLANG_HYBRID_SYNC_GUARD"] == "1"
    off = m.spec_config(m.parse_args(["--prompts", "p.jsonl", "--algorithm", "HYBRID_SPARK"]))
    assert off.name != cfg.name and dict(off.env)["SGLANG_HYBRID_CORPUS"] == "off"
