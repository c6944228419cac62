"""The server as users meet it: ``python -m sglang.launch_server`` on CPU with HYBRID_SPARK (stand-alone draft),
SGLang's HTTP and OpenAI APIs, SGLang's own ``bench_serving`` client, and shutdown.

Two servers per module (``server_harness``): a plain one (the reference) and a HYBRID_SPARK one, started in
parallel once and shared by the tests; both are killed (process group) whatever happens. Generation is short
(the Triton interpreter makes every decode step cost ~0.4 s). Tests run in file order: the first checks that
``avg_spec_accept_length`` is there after one short request (SGLang alone fills it only after
``--decode-log-interval`` = 40 decode batches), the last one shuts both servers down with SIGINT.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List

import pytest
from server_harness import HOST, Server, ServerConfig

pytestmark = pytest.mark.e2e

GUARD = ("SGLANG_HYBRID_SYNC_GUARD", "1")  # any host read inside the HYBRID_SPARK decode step raises
PLAIN = ServerConfig("plain")
LOG_INTERVAL = 10  # --decode-log-interval: SGLang refreshes its spec gauges every this many decode batches
# The HYBRID_SPARK server also runs the cross-request corpus per tenant (a 4Ki-entry table), its tenants named by
# cache salt and routing key together (option tenant_key): every test below serves through it.
TENANT_ENV = (("SGLANG_HYBRID_CORPUS", "tenant"), ("SGLANG_HYBRID_CORPUS_ENTRIES", "4096"),
              ("SGLANG_HYBRID_TENANT_KEY", "cache+routing_key"))
HYBRID = ServerConfig(
    "hybrid_spark", algorithm="HYBRID_SPARK", draft="standalone",
    kwargs=(("enable_metrics", True), ("decode_log_interval", LOG_INTERVAL)), env=(GUARD,) + TENANT_ENV,
)

# Text prompts; the tiny target is close to a bigram model, so its greedy outputs fall into cycles that the
# n-gram drafter copies (accept lengths well above 1).
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add",
    "The quick brown fox jumps over the lazy dog while the cat",
    "for i in range(10):\n    print(i, add(i, i))",
    "It was the best of times, it was the worst of times, it was",
]
MAX_NEW = 8


def _greedy(max_new: int = MAX_NEW, **extra) -> dict:
    return dict(temperature=0, max_new_tokens=max_new, ignore_eos=True, **extra)


@pytest.fixture(scope="module")
def servers(tiny_models):
    started: Dict[str, Server] = {}
    try:
        for cfg in (PLAIN, HYBRID):  # both start at once; launched from this thread (they die with it)
            started[cfg.name] = Server.launch(cfg, tiny_models)
        for srv in started.values():
            srv.wait_healthy()
        yield started
    finally:
        for srv in started.values():
            srv.kill()


@pytest.fixture(scope="module")
def plain(servers) -> Server:
    return servers["plain"]


@pytest.fixture(scope="module")
def hybrid(servers) -> Server:
    return servers["hybrid_spark"]


def _generate(srv: Server, text: str, sp: dict) -> dict:
    return srv.post("/generate", {"text": text, "sampling_params": sp})


def _loads(srv: Server) -> dict:
    """``/v1/loads`` of the single rank: running requests and KV tokens in use."""
    return srv.get("/v1/loads")["loads"][0]


def _idle_usage(srv: Server, timeout_s: float = 30.0) -> dict:
    """Wait until no request runs, flush the prefix cache, and return the token usage."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        load = _loads(srv)
        if load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"requests still running after {timeout_s} s: {load}")
    srv.post("/flush_cache", {})
    return _loads(srv)


# ----------------------------------------------------------------------------------------------------------


def test_accept_length_is_reported_after_one_short_request(hybrid):
    out = _generate(hybrid, PROMPTS[0], _greedy(8))
    state = hybrid.internal_state()
    # fewer decode batches than SGLang's log interval so far: SGLang alone would not report the field yet
    assert 0 < state["hybrid_spark"]["decode_steps"] < LOG_INTERVAL, state["hybrid_spark"]
    assert state.get("avg_spec_accept_length") is not None, "SGLang's standard field is missing"
    assert 1.0 <= state["avg_spec_accept_length"] <= 4.0  # the verify window is 4
    assert state["hybrid_spark"]["decode_steps"] > 0
    assert out["meta_info"]["spec_verify_ct"] > 0


def test_generate_and_completions_equal_the_plain_server(plain, hybrid):
    for text in PROMPTS[:3]:
        ref = _generate(plain, text, _greedy())
        out = _generate(hybrid, text, _greedy())
        assert out["output_ids"] == ref["output_ids"] and len(ref["output_ids"]) == MAX_NEW, text
        assert out["text"] == ref["text"]
    body = dict(prompt=PROMPTS[3], max_tokens=MAX_NEW, temperature=0, ignore_eos=True, return_token_ids=True)
    ref = plain.post("/v1/completions", body)["choices"][0]
    out = hybrid.post("/v1/completions", body)
    choice = out["choices"][0]
    assert choice["token_ids"] == ref["token_ids"] and len(ref["token_ids"]) == MAX_NEW
    assert choice["text"] == ref["text"] and choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == MAX_NEW
    # The native API gives the same tokens for the same prompt.
    assert _generate(hybrid, PROMPTS[3], _greedy())["output_ids"] == ref["token_ids"]


def test_streamed_chunks_concatenate_to_the_non_streamed_output(hybrid):
    body = dict(prompt=PROMPTS[0], max_tokens=16, temperature=0, ignore_eos=True, return_token_ids=True)
    full = hybrid.post("/v1/completions", body)["choices"][0]
    chunks = list(hybrid.stream("/v1/completions", body))
    ids = [t for c in chunks for ch in c["choices"] for t in (ch.get("token_ids") or [])]
    text = "".join(ch["text"] for c in chunks for ch in c["choices"])
    assert ids == full["token_ids"] and text == full["text"]
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["text"]) >= 2  # really streamed
    # Native /generate: cumulative chunks (incremental_streaming_output is off); the last one is the output.
    ref = _generate(hybrid, PROMPTS[0], _greedy(16))
    events = list(hybrid.stream("/generate", {"text": PROMPTS[0], "sampling_params": _greedy(16)}))
    assert events[-1]["text"] == ref["text"]
    assert all(ref["text"].startswith(e["text"]) for e in events)


def test_chat_completions_with_the_template(plain, hybrid):
    body = dict(
        messages=[{"role": "system", "content": "Edit the file."}, {"role": "user", "content": "def add(a, b):"}],
        max_tokens=8, temperature=0, ignore_eos=True,
    )
    out = hybrid.post("/v1/chat/completions", body)
    ref = plain.post("/v1/chat/completions", body)
    msg = out["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str) and msg["content"]
    assert msg["content"] == ref["choices"][0]["message"]["content"]
    assert out["usage"]["completion_tokens"] == 8
    # the template was applied: the prompt holds the roles and the generation prompt
    assert out["usage"]["prompt_tokens"] > len("def add(a, b):") // 8


def test_routing_key_header_and_field_name_the_tenant(plain, hybrid):
    """SGLang's routing key reaches the plugin's tenant through the OpenAI API (the x-smg-routing-key header) and
    /generate (its routing_key field), with and without a cache salt: outputs equal the plain server's, and the
    worker counts one new tenant per distinct (salt, routing key) pair at prefill."""
    before = hybrid.internal_state()["hybrid_spark"]
    assert before["tenant_key"] == "cache+routing_key"
    body = dict(prompt=PROMPTS[1], max_tokens=MAX_NEW, temperature=0, ignore_eos=True, return_token_ids=True)
    ref = plain.post("/v1/completions", body)["choices"][0]["token_ids"]
    for key in ("srv-chat", "srv-code", "srv-chat"):
        out = hybrid.post("/v1/completions", body, headers={"x-smg-routing-key": key})["choices"][0]
        assert out["token_ids"] == ref
    ref = _generate(plain, PROMPTS[2], _greedy())["output_ids"]
    for extra in ({"routing_key": "srv-code"}, {"routing_key": "srv-code", "cache_salt": "srv-salt"}):
        out = hybrid.post("/generate", dict({"text": PROMPTS[2], "sampling_params": _greedy()}, **extra))
        assert out["output_ids"] == ref
    after = hybrid.internal_state()["hybrid_spark"]
    # srv-chat, srv-code, and (srv-salt, srv-code); the repeats are tenants already seen
    assert after["tenants_seen"] - before["tenants_seen"] == 3, (before["tenants_seen"], after["tenants_seen"])


def test_sixteen_concurrent_requests_equal_the_same_sent_one_by_one(hybrid):
    texts = [f"{PROMPTS[i % 4]} {i}" for i in range(16)]
    sps = [_greedy(2 + i % 4) for i in range(16)]  # mixed lengths: requests finish at different steps
    one_by_one = [_generate(hybrid, t, sp)["output_ids"] for t, sp in zip(texts, sps)]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda a: _generate(hybrid, *a)["output_ids"], zip(texts, sps)))
    assert together == one_by_one
    assert [len(x) for x in together] == [sp["max_new_tokens"] for sp in sps]


def test_client_disconnect_aborts_the_request_and_frees_its_tokens(hybrid):
    idle = _idle_usage(hybrid)
    before = _generate(hybrid, PROMPTS[2], _greedy())
    stream = hybrid.stream("/generate", {"text": PROMPTS[1], "sampling_params": _greedy(400)})
    got = [next(stream), next(stream)]
    assert len(got[-1]["output_ids"]) < 400
    assert _loads(hybrid)["num_running_reqs"] == 1
    stream.close()  # the client goes away mid-stream
    t0 = time.monotonic()
    while _loads(hybrid)["num_running_reqs"] != 0:
        # 400 tokens would take well over a minute here; the abort must come much sooner
        assert time.monotonic() - t0 < 20, "the disconnected request kept running"
        time.sleep(0.25)
    after = _generate(hybrid, PROMPTS[2], _greedy())
    assert after["output_ids"] == before["output_ids"]
    assert _idle_usage(hybrid)["num_used_tokens"] == idle["num_used_tokens"]


def test_stop_strings_and_max_tokens_are_exact(tiny_models, plain, hybrid):
    """The prompt carries the start of the output's own cycle, so the n-gram drafter copies it from the first
    decode step and full 4-token steps are accepted; the stop string ends in the middle of such a step."""
    from tiny_models import load_tokenizer

    tok = load_tokenizer(tiny_models)
    head = _generate(hybrid, PROMPTS[0], _greedy(10))
    prompt = tok.encode(PROMPTS[0], add_special_tokens=False) + head["output_ids"]
    full = hybrid.post("/generate", {"input_ids": prompt, "sampling_params": _greedy(24)})
    ids, text = full["output_ids"], full["text"]
    per_req = full["meta_info"]["hybrid_spark"][-1]
    assert per_req["ngram_chosen_steps"] > 0 and per_req["accepted_ngram"] >= 3, per_req
    # a 3-token stop string at its first occurrence j >= 3, ending at token j + 2 and not at a step boundary
    # (with full steps the first token comes from prefill, then steps of 4 tokens)
    stop = None
    for j in range(3, len(ids) - 3):
        cand = tok.decode(ids[j : j + 3])
        earlier = any(ids[i : i + 3] == ids[j : j + 3] for i in range(j))
        if (j + 3) % 4 != 1 and not earlier and cand.strip() and "\ufffd" not in cand and cand in text:
            stop = cand
            break
    assert stop is not None, ids
    sp = _greedy(24, stop=[stop])
    out = hybrid.post("/generate", {"input_ids": prompt, "sampling_params": sp})
    ref = plain.post("/generate", {"input_ids": prompt, "sampling_params": sp})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[: text.find(stop)]
    assert out["text"] == ref["text"] and out["output_ids"] == ref["output_ids"]
    assert out["meta_info"]["spec_accept_length"] > 1.0, out["meta_info"]
    # OpenAI API: the same stop, and max_tokens cutting inside multi-token accepts
    body = dict(prompt=prompt, temperature=0, ignore_eos=True, return_token_ids=True)
    c = hybrid.post("/v1/completions", dict(body, max_tokens=24, stop=[stop]))["choices"][0]
    assert c["text"] == out["text"] and c["finish_reason"] == "stop"
    for n in (1, 2, 3, 6, 7):
        c = hybrid.post("/v1/completions", dict(body, max_tokens=n))
        assert c["usage"]["completion_tokens"] == n and c["choices"][0]["token_ids"] == ids[:n]
        assert c["choices"][0]["finish_reason"] == "length"


BAD_REQUESTS = [
    ("/generate", {"text": "x", "sampling_params": {"temperature": -1}}, "temperature"),
    ("/generate", {"text": "x", "sampling_params": {"top_p": 2.0}}, "top_p"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -3}}, "max_new_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -5}, "max_tokens"),
    ("/v1/completions", {"max_tokens": 4}, "prompt"),
    ("/v1/chat/completions", {"messages": "not a list", "max_tokens": 4}, "messages"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 4, "n": 0}, "n"),
]


def test_bad_requests_get_a_4xx_with_a_message_and_the_server_keeps_serving(hybrid):
    before = _generate(hybrid, PROMPTS[1], _greedy(6))
    for path, body, needle in BAD_REQUESTS:
        status, out = hybrid.request("POST", path, body)
        text = json.dumps(out) if not isinstance(out, str) else out
        assert 400 <= status < 500, (path, body, status, out)
        assert needle in text, (path, body, out)
    status, out = hybrid.request("POST", "/generate", None)  # no body at all
    assert 400 <= status < 500, (status, out)
    assert _generate(hybrid, PROMPTS[1], _greedy(6))["output_ids"] == before["output_ids"]
    assert hybrid.get("/health") is not None


RANDOM_IDS = ("--dataset-name", "random-ids", "--random-input-len", "16", "--random-output-len", "6",
              "--random-range-ratio", "1.0")


def _bench(srv: Server, tiny_models, backend: str, out_file: str, num: int = 4, dataset=RANDOM_IDS) -> dict:
    argv = [
        sys.executable, "-m", "sglang.benchmark.serving", "--backend", backend, "--host", HOST,
        "--port", str(srv.port), *dataset, "--num-prompts", str(num), "--tokenizer", tiny_models.tokenizer, "--model", tiny_models.target, "--output-file", out_file,
        "--request-rate", "inf", "--seed", "1", "--disable-tqdm", "--ready-check-timeout-sec", "30",
        "--warmup-requests", "0",
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=dict(os.environ, NO_PROXY="127.0.0.1"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    with open(out_file) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    assert len(lines) == 1, lines
    return dict(lines[0], _stdout=p.stdout)


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai"])
def test_sglang_bench_serving_completes_and_reports_the_servers_accept_length(
    tiny_models, hybrid, backend, tmp_path
):
    res = _bench(hybrid, tiny_models, backend, str(tmp_path / "bench.jsonl"))
    assert res["completed"] == 4, {k: v for k, v in res.items() if k != "_stdout"}
    # bench_serving asks /server_info right after its last response. Under the overlap scheduler the batch
    # launched before that response was processed (one overshoot tick, finished rows included) may still be
    # counted afterwards, so the lifetime average can move by a step or two after the client read it (seen in
    # CI: 159/49 read by the client, 164/51 once idle). Compare with the settled value, to within that.
    state, prev = hybrid.internal_state(), None
    for _ in range(20):
        if prev is not None and state["avg_spec_accept_length"] == prev:
            break
        prev = state["avg_spec_accept_length"]
        time.sleep(0.25)
        state = hybrid.internal_state()
    assert res["accept_length"] is not None and 1.0 < res["accept_length"] <= 4.0, res["accept_length"]
    assert res["accept_length"] == pytest.approx(state["avg_spec_accept_length"], rel=0.05)
    printed = re.search(r"Accept length:\s+([0-9.]+)", res["_stdout"])
    assert printed, res["_stdout"][-2000:]
    assert float(printed.group(1)) == pytest.approx(res["accept_length"], abs=0.006)  # printed with 2 decimals


def test_bench_serving_routing_keys_become_tenants(tiny_models, hybrid, tmp_path):
    """SGLang's bench_serving on its shared-prefix dataset with --gsp-send-routing-key (one routing key per
    system-prompt group, sent as the x-smg-routing-key header by the OpenAI backend): every request completes and
    each group is one new tenant of the worker (tenant_key cache+routing_key)."""
    gsp = ("--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2", "--gsp-prompts-per-group", "2",
           "--gsp-system-prompt-len", "12", "--gsp-question-len", "6", "--gsp-output-len", "4",
           "--gsp-send-routing-key")
    before = hybrid.internal_state()["hybrid_spark"]["tenants_seen"]
    res = _bench(hybrid, tiny_models, "sglang-oai", str(tmp_path / "gsp.jsonl"), dataset=gsp)
    assert res["completed"] == 4, {k: v for k, v in res.items() if k != "_stdout"}
    assert hybrid.internal_state()["hybrid_spark"]["tenants_seen"] - before == 2


def test_server_info_and_prometheus_carry_the_speculative_metrics(hybrid):
    state = hybrid.internal_state()
    hs = state["hybrid_spark"]
    assert hs["decode_steps"] >= LOG_INTERVAL, hs  # SGLang has refreshed its gauges at least once
    assert hs["model_chain_tokens"] == 3 and hs["verify_window_tokens"] == 4
    assert hs["accepted_model"] + hs["accepted_ngram"] > 0 and hs["ngram_chosen"] > 0
    assert 1.0 < state["avg_spec_accept_length"] <= 4.0
    status, text = hybrid.request("GET", "/metrics")
    assert status == 200

    def gauge(name: str) -> float:
        m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.eE+-]+)$", text, re.M)
        assert m, f"{name} missing from /metrics"
        return float(m.group(1))

    assert 1.0 <= gauge("sglang:spec_accept_length") <= 4.0
    assert gauge("sglang:spec_num_steps") == 3 and gauge("sglang:spec_num_draft_tokens") == 4
    assert 0.0 <= gauge("sglang:spec_accept_rate") <= 1.0


def test_sigint_shuts_the_servers_down_in_bounded_time(servers):
    import psutil

    for srv in servers.values():
        procs = [psutil.Process(srv.proc.pid)] + psutil.Process(srv.proc.pid).children(recursive=True)
        assert len(procs) >= 3, procs  # launcher, scheduler, detokenizer at least
        took = srv.interrupt(timeout_s=60)
        assert took < 60
        _, alive = psutil.wait_procs(procs, timeout=5)
        assert not alive, f"{srv.config.name}: left behind {alive}"
