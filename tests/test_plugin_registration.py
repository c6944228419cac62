"""HYBRID_SPARK registers through the installed entry point and resolves server arguments, in a fresh process (a
fork of one that imported SGLang but loaded no plugin: ``tests/forked_sglang.py``)."""

import json
import os
import textwrap

import pytest

from tests.forked_sglang import ForkedSGLang

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = os.path.join(ROOT, "tests", "sgl_kernel_stub")

_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 512,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "torch_dtype": "float32",
}

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.arg_groups.overrides import resolving_view
    a = prepare_server_args(sys.argv[1:])
    try:
        a.resolve_once()
    except Exception as e:
        print("ERROR", type(e).__name__, e)
        sys.exit(3)
    v = resolving_view(a)
    print("RESULT", json.dumps({k: getattr(v, k) for k in (
        "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
        "speculative_num_draft_tokens", "max_running_requests", "enable_mixed_chunk")}))
    """
)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfgs")
    dirs = {}
    dspark = dict(block_size=3, dflash_config={"target_layer_ids": [0], "mask_token_id": 2, "block_size": 3})
    for name, archs, extra in (
        ("target", ["LlamaForCausalLM"], {}), ("draft", ["LlamaForCausalLM"], {}),
        ("eagle3", ["LlamaForCausalLMEagle3"], {}), ("dspark", ["DSparkDraftModel"], dspark),
        ("dspark_v600", ["DSparkDraftModel"], dict(dspark, vocab_size=600)),
    ):
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(dict(_LLAMA, architectures=archs, **extra)))
        dirs[name] = str(d)
    bad = root / "bad_sps.json"
    bad.write_text('{"sample_batch_tokens": [4, 2], "sample_steps_per_sec": [1.0, 0.5], "max_batch_tokens": 8}')
    dirs["bad_sps"] = str(bad)
    return dirs


@pytest.fixture(scope="module")
def sglang_proc():
    """One process imports SGLang; each case runs in a forked child, as a fresh process (forked_sglang.py)."""
    proc = ForkedSGLang(SCRIPT, _env())
    yield proc
    proc.close()


def _env(extra_env=None):
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", PYTHONPATH=STUB + os.pathsep + ROOT)
    env.pop("SGLANG_HYBRID_RESOLVED_DRAFT_KIND", None)
    env.update(extra_env or {})
    return env


@pytest.fixture
def resolve(sglang_proc):
    """``resolve(args, extra_env)`` resolves ``args`` in a fresh process: (the resolved fields or None, its output)."""

    def run(args, extra_env=None):
        _, out = sglang_proc.run(args, _env(extra_env))
        for line in out.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:]), out
        return None, out

    return run


def _base(dirs, draft="draft"):
    return ["--model-path", dirs["target"], "--speculative-algorithm", "hybrid_spark",
            "--speculative-draft-model-path", dirs[draft], "--device", "cpu", "--skip-tokenizer-init"]


def test_registers_and_resolves_chain_defaults(resolve, model_dirs):
    res, out = resolve(_base(model_dirs) + ["--speculative-num-steps", "4"])
    assert res is not None, out
    assert res["speculative_algorithm"] == "HYBRID_SPARK"
    assert (res["speculative_num_steps"], res["speculative_eagle_topk"], res["speculative_num_draft_tokens"]) == (4, 1, 5)
    assert res["max_running_requests"] == 48 and res["enable_mixed_chunk"] is False
    assert "standalone draft model" in out


@pytest.mark.parametrize(
    "args, env, needle",
    [
        (["--speculative-eagle-topk", "2", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"], {},
         "--speculative-eagle-topk must be 1"),
        ([], {"SGLANG_HYBRID_N_MIN": "9"}, "'n_max'"),
        ([], {"SGLANG_HYBRID_BOGUS": "1"}, "unknown sglang-hybrid option 'bogus'"),
        ([], {"SGLANG_HYBRID_STEP_GRAPHS": "on"}, "'step_graphs': 'on' replays CUDA graphs and needs --device cuda"),
        (["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"], {},
         "--speculative-num-draft-tokens (the verify window, root included) must be >= --speculative-num-steps + 1"),
        (["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6"], {"SGLANG_HYBRID_MAX_DRAFT": "8"},
         "'max_draft' (8) does not fit the verify window"),
    ],
)
def test_bad_configuration_fails_at_startup_with_a_clear_error(resolve, model_dirs, args, env, needle):
    res, out = resolve(_base(model_dirs) + args, env)
    assert res is None
    assert needle in out, out[-2000:]


@pytest.mark.parametrize(
    "args, env, window",
    [
        (["--speculative-num-steps", "3"], {"SGLANG_HYBRID_MAX_DRAFT": "8"}, 9),  # max_draft widens the window
        (["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "7"], {}, 7),  # SGLang's flag wins
        (["--speculative-num-steps", "5"], {"SGLANG_HYBRID_MAX_DRAFT": "2"}, 6),  # never narrower than steps + 1
    ],
)
def test_verify_window_widens_for_long_ngram_chains(resolve, model_dirs, args, env, window):
    res, out = resolve(_base(model_dirs) + args, env)
    assert res is not None, out[-2000:]
    assert res["speculative_eagle_topk"] == 1 and res["speculative_num_draft_tokens"] == window
    assert f"verify window {window}" in out


def test_draft_kind_is_detected_from_the_draft_config(resolve, model_dirs):
    res, out = resolve(_base(model_dirs, "eagle3"))
    assert res is not None and "eagle3 draft model" in out, out[-2000:]
    res, out = resolve(_base(model_dirs, "dspark"))
    assert res is not None and "DSpark draft model, block 3, verify window 4" in out, out[-2000:]


def test_dspark_draft_resolves_what_sglangs_dspark_sets(resolve, model_dirs):
    """One draft step, topk 1, verify window gamma + 1 (max(gamma, max_draft) + 1 when max_draft widens it)."""
    res, out = resolve(_base(model_dirs, "dspark") + ["--speculative-num-steps", "5"])
    assert res is not None, out[-2000:]
    assert (res["speculative_num_steps"], res["speculative_eagle_topk"], res["speculative_num_draft_tokens"]) == (1, 1, 4)
    assert res["max_running_requests"] == 48 and res["enable_mixed_chunk"] is False
    res, out = resolve(_base(model_dirs, "dspark"), {"SGLANG_HYBRID_MAX_DRAFT": "8"})
    assert res is not None and res["speculative_num_draft_tokens"] == 9, out[-2000:]


@pytest.mark.parametrize(
    "draft, args, env, needle",
    [
        ("dspark_v600", [], {}, "the DSpark draft's vocab_size (600) differs from the target's (512"),
        ("dspark", ["--speculative-dspark-sps-table-path", "BAD_SPS"], {}, "--speculative-dspark-sps-table-path"),
        ("dspark", [], {"SGLANG_HYBRID_MAX_DRAFT": "2"}, "'max_draft' (2) is below the DSpark block size gamma (3)"),
        ("dspark", ["--speculative-num-draft-tokens", "3"], {}, "--speculative-num-draft-tokens (3) is below"),
    ],
)
def test_bad_dspark_configuration_fails_at_startup_naming_the_option(resolve, model_dirs, draft, args, env, needle):
    args = [model_dirs["bad_sps"] if a == "BAD_SPS" else a for a in args]
    res, out = resolve(_base(model_dirs, draft) + args, env)
    assert res is None
    assert needle in out, out[-2000:]
    if "sps" in needle:
        assert "strictly increasing" in out
