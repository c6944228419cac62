"""The plugin's options: file + environment, validated with errors that name the key and its source."""

import json

import pytest

from sglang_hybrid.config import HybridConfig, HybridConfigError


def test_defaults_are_valid():
    cfg = HybridConfig.from_env({})
    assert (cfg.n_min, cfg.n_max, cfg.max_draft) == (2, 8, 0)  # max_draft 0: fill the verify window
    assert cfg.enable_ngram and cfg.enable_model


def test_narrow_above_auto():
    assert HybridConfig.from_env({"SGLANG_HYBRID_NARROW_ABOVE": "auto"}).narrow_above == -1
    assert HybridConfig.from_mapping({"narrow_above": "AUTO"}, "test").narrow_above == -1
    assert HybridConfig.from_env({"SGLANG_HYBRID_NARROW_ABOVE": "8"}).narrow_above == 8  # an explicit value wins


def test_env_overrides_file(tmp_path):
    f = tmp_path / "h.json"
    f.write_text(json.dumps({"n_min": 3, "n_max": 6, "enable_ngram": False}))
    cfg = HybridConfig.from_env({"SGLANG_HYBRID_CONFIG": str(f), "SGLANG_HYBRID_N_MAX": "5"})
    assert (cfg.n_min, cfg.n_max, cfg.enable_ngram) == (3, 5, False)


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"SGLANG_HYBRID_NMIN": "2"}, "unknown sglang-hybrid option 'nmin'"),
        ({"SGLANG_HYBRID_N_MIN": "two"}, "'n_min'"),
        ({"SGLANG_HYBRID_N_MIN": "5", "SGLANG_HYBRID_N_MAX": "3"}, "'n_max'"),
        ({"SGLANG_HYBRID_MAX_DRAFT": "-1"}, "'max_draft'"),
        ({"SGLANG_HYBRID_MAX_DRAFT": "65"}, "'max_draft'"),
        ({"SGLANG_HYBRID_MODEL_TAIL": "-1"}, "'model_tail'"),
        ({"SGLANG_HYBRID_MODEL_TAIL": "65"}, "'model_tail'"),
        ({"SGLANG_HYBRID_WARMUP": "yes"}, "'warmup'"),
        ({"SGLANG_HYBRID_NARROW_ABOVE": "-2"}, "'narrow_above'"),
        ({"SGLANG_HYBRID_NARROW_ABOVE": "sometimes"}, "'narrow_above'"),
        ({"SGLANG_HYBRID_ONLINE_DEFER": "-1"}, "'online_defer'"),
        ({"SGLANG_HYBRID_PENALTY_ROWS": "-1"}, "'penalty_rows'"),
        ({"SGLANG_HYBRID_ENABLE_NGRAM": "maybe"}, "'enable_ngram'"),
        ({"SGLANG_HYBRID_ENABLE_NGRAM": "0", "SGLANG_HYBRID_ENABLE_MODEL": "false"}, "both be false"),
        ({"SGLANG_HYBRID_DRAFT_KIND": "medusa"}, "'draft_kind'"),
        ({"SGLANG_HYBRID_MODEL_PRIOR": "1.5"}, "'model_prior'"),
        ({"SGLANG_HYBRID_CALIBRATION": "/nonexistent/table.json"}, "/nonexistent/table.json"),
        ({"SGLANG_HYBRID_CONFIG": "/nonexistent/h.json"}, "/nonexistent/h.json"),
    ],
)
def test_bad_options_name_the_key(env, needle):
    with pytest.raises(HybridConfigError, match=None) as e:
        HybridConfig.from_env(env)
    assert needle in str(e.value)


def test_bad_json_file_names_the_file(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    with pytest.raises(HybridConfigError) as e:
        HybridConfig.from_env({"SGLANG_HYBRID_CONFIG": str(f)})
    assert str(f) in str(e.value) and "not valid JSON" in str(e.value)
    f.write_text("[1, 2]")
    with pytest.raises(HybridConfigError, match="JSON object"):
        HybridConfig.from_env({"SGLANG_HYBRID_CONFIG": str(f)})
