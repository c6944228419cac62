"""Run the real SGLang 0.5.23 engine on CPU from the test suite: one ``sglang.Engine`` per configuration.

Each engine lives in its own *host* process (``multiprocessing`` spawn), and the test process talks to it through
a pipe. The test process never imports SGLang's runtime, so the CPU-engine environment (``SGLANG_USE_CPU_ENGINE``,
the ``sgl_kernel`` stand-in on the path, SGLang's module-level ``_is_cpu`` caches, the plugin's patches) cannot
leak into other tests, and ``Engine.shutdown`` (which kills every child of the calling process) only ever
reaches its own host's children.

Usage (``tests/e2e/conftest.py`` has the fixtures; pytest puts this directory on ``sys.path``, so the module is
``engine_harness``; scripts insert the directory themselves)::

    pool = EnginePool(models)                  # lazily starts engines, keeps at most ``max_alive``
    eng = pool.get("standalone")               # an EngineHandle; started on first use, then reused
    outs = eng.generate([[5, 6, 7]], [{"temperature": 0, "max_new_tokens": 8}])
    pool.close()

A configuration is an :class:`EngineConfig`; register more with :func:`register_config` (for example the
``HYBRID_SPARK`` runs): ``register_config(EngineConfig("hybrid_standalone", algorithm="HYBRID_SPARK",
draft="standalone", env=(("SGLANG_HYBRID_...", "1"),)))``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
STUB_DIR = os.path.join(REPO_ROOT, "tests", "sgl_kernel_stub")

# Environment of every engine host (and so of SGLang's spawned scheduler and detokenizer processes).
ENGINE_ENV: Dict[str, str] = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "TRITON_INTERPRET": "1",
    # torch.compile on the draft path costs ~15 s of gcc per engine; eager gives the same results.
    "TORCH_COMPILE_DISABLE": "1",
    # only this project's plugin (it applies sglang_hybrid.sglang_plugin.cpu_compat in every SGLang process)
    "SGLANG_PLUGINS": "hybrid_spark",
    "TOKENIZERS_PARALLELISM": "false",
}

# Engine arguments every configuration shares (what runs SGLang on a CPU without AMX; see
# /work/shared/design/sglang-on-cpu.md).
BASE_ENGINE_KWARGS: Dict[str, Any] = dict(
    device="cpu",
    dtype="float32",
    attention_backend="triton",
    disable_cuda_graph=True,
    sampling_backend="pytorch",
    grammar_backend="none",
    mem_fraction_static=0.05,
    max_total_tokens=4096,
    random_seed=0,
    triton_attention_num_kv_splits=1,  # one split: the interpreted decode kernel costs ~4x less
    log_level="error",
    # An idle scheduler otherwise spins at 100% of a core; the pool keeps two engines alive and the server tests
    # run two servers, so on a 2-core machine the idle ones took the cores from the busy one. With it, an idle
    # scheduler waits on its sockets (zmq poll, 1 s) and wakes when a request arrives.
    sleep_on_idle=True,
)

SPEC_KWARGS: Dict[str, Any] = dict(
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
)

DEFAULT_CALL_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class EngineConfig:
    """One engine configuration.

    ``draft`` names a tiny model (``"standalone"`` or ``"eagle3"``, resolved against the built
    :class:`~tiny_models.TinyModels`) or is a path. ``engine_kwargs`` / ``env`` are ``(key, value)`` pairs added
    to (and overriding) the shared defaults.
    """

    name: str
    algorithm: Optional[str] = None
    draft: Optional[str] = None
    engine_kwargs: Tuple[Tuple[str, Any], ...] = ()
    env: Tuple[Tuple[str, str], ...] = ()

    @property
    def is_speculative(self) -> bool:
        return self.algorithm is not None

    def resolve_kwargs(self, models: Any) -> Dict[str, Any]:
        """The ``sglang.Engine`` keyword arguments for this configuration on ``models`` (a TinyModels)."""
        kw = dict(BASE_ENGINE_KWARGS)
        kw["model_path"] = models.target
        if self.algorithm is not None:
            kw.update(SPEC_KWARGS)
            kw["speculative_algorithm"] = self.algorithm
            draft = self.draft
            if draft == "dspark":
                from tiny_dspark import build_tiny_dspark

                kw["speculative_draft_model_path"] = build_tiny_dspark(models, gamma=DSPARK_GAMMA)
            elif draft is not None:
                kw["speculative_draft_model_path"] = getattr(models, draft) if hasattr(models, draft) else draft
        kw.update(dict(self.engine_kwargs))
        return kw


_CONFIGS: Dict[str, EngineConfig] = {}


def register_config(cfg: EngineConfig) -> EngineConfig:
    """Add (or replace) a named configuration; returns it."""
    _CONFIGS[cfg.name] = cfg
    return cfg


def get_config(name: str) -> EngineConfig:
    """The configuration registered under ``name``."""
    if name not in _CONFIGS:
        raise KeyError(f"unknown engine configuration {name!r}; known: {sorted(_CONFIGS)}")
    return _CONFIGS[name]


def config_names() -> List[str]:
    """Names of all registered configurations."""
    return sorted(_CONFIGS)


register_config(EngineConfig("plain"))
register_config(EngineConfig("standalone", algorithm="STANDALONE", draft="standalone"))
register_config(EngineConfig("eagle3", algorithm="EAGLE3", draft="eagle3"))

# HYBRID_SPARK over each tiny drafter. SGLANG_HYBRID_SYNC_GUARD=1 makes any host read of tensor data inside
# the HYBRID_SPARK decode step raise (and so fail the test that triggered it).
_GUARD = ("SGLANG_HYBRID_SYNC_GUARD", "1")
# The start-up warm-up runs on a GPU only by default; "on" runs it here too, so the workers' wiring of it (their
# input layouts, the restore) is exercised through real SGLang, and the lossless suites run after it.
_WARMUP = ("SGLANG_HYBRID_WARMUP", "on")
register_config(EngineConfig("hybrid_spark_standalone", algorithm="HYBRID_SPARK", draft="standalone", env=(_GUARD,)))
register_config(EngineConfig("hybrid_spark_eagle3", algorithm="HYBRID_SPARK", draft="eagle3", env=(_GUARD,)))
# Ablation: the model still drafts, but only n-gram chains are verified.
register_config(
    EngineConfig(
        "hybrid_spark_ngram_only", algorithm="HYBRID_SPARK", draft="standalone",
        env=(_GUARD, ("SGLANG_HYBRID_ENABLE_MODEL", "0")),
    )
)

# A verify window wider than the model chain: 2 draft steps, n-gram chains of up to 7 tokens (window 8).
register_config(
    EngineConfig(
        "hybrid_spark_wide", algorithm="HYBRID_SPARK", draft="standalone",
        engine_kwargs=(("speculative_num_steps", 2), ("speculative_num_draft_tokens", None)),
        env=(_GUARD, ("SGLANG_HYBRID_MAX_DRAFT", "7"), _WARMUP),
    )
)

# The same wide window for batches of up to 2 requests, SGLang's steps + 1 above (WindowSwitch).
register_config(
    EngineConfig(
        "hybrid_spark_switch", algorithm="HYBRID_SPARK", draft="standalone",
        engine_kwargs=(("speculative_num_steps", 2), ("speculative_num_draft_tokens", None)),
        env=(_GUARD, ("SGLANG_HYBRID_MAX_DRAFT", "7"), ("SGLANG_HYBRID_NARROW_ABOVE", "2")),
    )
)

# narrow_above auto: the threshold from an SPS table (here the steep CPU table below, where the wide window does
# not pay even at batch 2 at equal acceptance) and from the acceptance measured under each window.
register_config(
    EngineConfig(
        "hybrid_spark_auto_narrow", algorithm="HYBRID_SPARK", draft="standalone",
        engine_kwargs=(("speculative_num_steps", 2), ("speculative_num_draft_tokens", None),
                       ("speculative_dspark_sps_table_path", os.path.join(HERE, "data", "sps_cpu.json"))),
        env=(_GUARD, ("SGLANG_HYBRID_MAX_DRAFT", "7"), ("SGLANG_HYBRID_NARROW_ABOVE", "auto")),
    )
)

# DSpark (tests/e2e/tiny_dspark.py: block 3, confidence head). SGLang's verify modes are chosen by
# SGLANG_RAGGED_VERIFY_MODE; cap-accept and compact budget from an SPS table (DSPARK_SPS_TABLE: a step of B verify
# tokens takes 1 + 0.15 B time units, steep enough that DSpark's budget trims the tiny drafter's blocks), static
# verifies the whole window. The scheduler's overlap stays on (SGLang keeps it on for DSPARK and for plugins on CPU).
DSPARK_GAMMA = 3
DSPARK_SPS_TABLE = os.path.join(HERE, "data", "sps_cpu.json")
_DSPARK_KW = (("speculative_num_steps", None), ("speculative_eagle_topk", None), ("speculative_num_draft_tokens", None))


def _dspark_mode(mode: str) -> Tuple[Tuple[Tuple[str, Any], ...], Tuple[Tuple[str, str], ...]]:
    kw = _DSPARK_KW if mode == "static" else _DSPARK_KW + (("speculative_dspark_sps_table_path", DSPARK_SPS_TABLE),)
    return kw, (("SGLANG_RAGGED_VERIFY_MODE", mode),)


def _register_dspark(name: str, algorithm: str, mode: str, env=(), kwargs=()) -> None:
    kw, mode_env = _dspark_mode(mode)
    register_config(EngineConfig(name, algorithm=algorithm, draft="dspark", engine_kwargs=kw + tuple(kwargs),
                                 env=mode_env + tuple(env)))


# SGLang's own DSPARK (the baseline) and HYBRID_SPARK with the n-gram drafter off, in compact mode; both dump
# DSpark's per-step budget and verified tokens (SGLANG_DSPARK_DEBUG_DUMP=core) so a test can compare them step by
# step. (The "reqs" component, with per-request lengths, stages its copies on a device stream into pinned memory,
# which a CPU-only torch cannot do.)
_DUMP = ("SGLANG_DSPARK_DEBUG_DUMP", "core")
_register_dspark("dspark_compact", "DSPARK", "compact", env=(_DUMP,))
_register_dspark("hybrid_dspark_compact_no_ngram", "HYBRID_SPARK", "compact",
                 env=(_GUARD, _DUMP, ("SGLANG_HYBRID_ENABLE_NGRAM", "0")))
# HYBRID_SPARK on DSpark in the three verify modes. Static also runs chunked prefill (16-token chunks); compact
# widens the window to 8 (n-gram chains of up to 7 tokens against the 3-token model block).
_register_dspark("hybrid_dspark_static", "HYBRID_SPARK", "static", env=(_GUARD,),
                 kwargs=(("chunked_prefill_size", 16),))
# cap-accept also runs the fairness weights (selection/fairness.py), which reach DSpark's planner confidences,
# between tenants named by cache salt and routing key together (the tests send both).
_register_dspark("hybrid_dspark_cap", "HYBRID_SPARK", "cap-accept",
                 env=(_GUARD, ("SGLANG_HYBRID_FAIRNESS", "1"), ("SGLANG_HYBRID_FAIRNESS_SCOPE", "tenant"),
                      ("SGLANG_HYBRID_TENANT_KEY", "cache+routing_key")))
# compact also runs the cross-request corpus (shared, a 64Ki-entry table) and the 2-D SPS price (the roofline
# model, rewritten each step for the batch's context): the lossless suite covers both there.
_register_dspark("hybrid_dspark_compact", "HYBRID_SPARK", "compact",
                 env=(_GUARD, _WARMUP, ("SGLANG_HYBRID_MAX_DRAFT", "7"), ("SGLANG_HYBRID_CORPUS", "shared"),
                      ("SGLANG_HYBRID_CORPUS_ENTRIES", str(1 << 16)), ("SGLANG_HYBRID_SPS2D_TABLE", "roofline")))

# Retraction: SGLang's own test switch (SGLANG_TEST_RETRACT) retracts a decoding request every third forward step,
# as a full KV pool would; it comes back through a prefill of its prompt plus its output so far. On DSpark (compact,
# the corpus on, so a retracted request's output is inserted across its lives) and on the EAGLE-family worker's
# wide window.
_RETRACT = (("SGLANG_TEST_RETRACT", "1"), ("SGLANG_TEST_RETRACT_INTERVAL", "3"))
# window 8, a small shared corpus and the model chain's splices (calibration/splice.py), under the sync guard: the
# retraction and no-overlap DSpark engines
_DSPARK_CORPUS_4K = (_GUARD, ("SGLANG_HYBRID_MAX_DRAFT", "7"), ("SGLANG_HYBRID_CORPUS", "shared"),
                     ("SGLANG_HYBRID_CORPUS_ENTRIES", str(1 << 12)), ("SGLANG_HYBRID_MODEL_SPLICES", "3"))
_register_dspark("hybrid_dspark_retract", "HYBRID_SPARK", "compact", env=_DSPARK_CORPUS_4K + _RETRACT)
register_config(
    EngineConfig(
        "hybrid_spark_retract", algorithm="HYBRID_SPARK", draft="standalone",
        engine_kwargs=(("speculative_num_steps", 2), ("speculative_num_draft_tokens", None)),
        env=(_GUARD, ("SGLANG_HYBRID_MAX_DRAFT", "7")) + _RETRACT,
    )
)

# The scheduler without overlap (--disable-overlap-schedule): the DSpark compact configuration, corpus on; a
# penalty table of two rows (test_dspark_e2e.py: more penalised requests than rows).
_register_dspark("hybrid_dspark_no_overlap", "HYBRID_SPARK", "compact",
                 env=_DSPARK_CORPUS_4K + (("SGLANG_HYBRID_PENALTY_ROWS", "2"),),
                 kwargs=(("disable_overlap_schedule", True),))

LOSSLESS_SPEC_CONFIGS: List[str] = [
    "standalone", "eagle3", "hybrid_spark_standalone", "hybrid_spark_eagle3", "hybrid_spark_wide",
    "hybrid_dspark_compact",
]
"""Speculative configurations ``tests/e2e/test_spec_e2e.py`` checks for losslessness (append to add more)."""


# ------------------------------------------------------------------------------------------------------------
# host-side functions (run inside the engine host process; module level so they pickle by reference)
# ------------------------------------------------------------------------------------------------------------


def host_generate(engine: Any, input_ids: List[List[int]], sampling_params: List[Dict[str, Any]],
                  cache_salt: Optional[List[str]] = None, routing_key: Optional[List[Optional[str]]] = None,
                  top_logprobs_num: Optional[int] = None) -> List[dict]:
    """``engine.generate`` on a batch of token-id prompts (``cache_salt``: per request, SGLang's prefix-cache salt,
    which is also the plugin's tenant); returns the output dicts in request order. ``top_logprobs_num``: also return
    each output token's logprob and the top ones (``return_logprob``).

    ``routing_key`` (per request, SGLang's routing key, as the ``x-smg-routing-key`` header sets it): sent as one
    concurrent ``GenerateReqInput`` per request, since ``Engine.generate`` takes no routing key and SGLang drops it
    when it splits a batched input into its requests."""
    if routing_key is None:
        kw = {} if cache_salt is None else {"cache_salt": cache_salt}
        if top_logprobs_num is not None:
            kw.update(return_logprob=True, top_logprobs_num=top_logprobs_num)
        out = engine.generate(input_ids=input_ids, sampling_params=sampling_params, **kw)
        return out if isinstance(out, list) else [out]
    import asyncio

    from sglang.srt.managers.io_struct import GenerateReqInput

    async def one(i: int) -> dict:
        obj = GenerateReqInput(input_ids=input_ids[i], sampling_params=sampling_params[i], routing_key=routing_key[i],
                               cache_salt=None if cache_salt is None else cache_salt[i])
        return await engine.tokenizer_manager.generate_request(obj, None).__anext__()

    async def run() -> List[dict]:
        return list(await asyncio.gather(*(one(i) for i in range(len(input_ids)))))

    return engine.loop.run_until_complete(run())


def host_generate_with_abort(
    engine: Any,
    input_ids: List[List[int]],
    sampling_params: List[Dict[str, Any]],
    abort_index: int,
    abort_after_tokens: int,
) -> List[dict]:
    """Stream all requests concurrently; once request ``abort_index`` has produced at least
    ``abort_after_tokens`` tokens, abort it (``TokenizerManager.abort_request``). Returns the final output dict
    of each request (``output_ids`` cumulative), in request order."""
    import asyncio
    import uuid

    tag = uuid.uuid4().hex[:8]
    rids = [f"abort-{tag}-{i}" for i in range(len(input_ids))]

    async def one(i: int) -> dict:
        gen = await engine.async_generate(
            input_ids=input_ids[i], sampling_params=sampling_params[i], stream=True, rid=rids[i]
        )
        last: Optional[dict] = None
        ids: List[int] = []
        aborted = False
        async for chunk in gen:
            new = list(chunk.get("output_ids") or [])
            ids = ids + new if getattr(engine.server_args, "incremental_streaming_output", False) else new
            last = chunk
            if i == abort_index and not aborted and len(ids) >= abort_after_tokens:
                engine.tokenizer_manager.abort_request(rid=rids[i])
                aborted = True
        assert last is not None
        res = dict(last)
        res["output_ids"] = ids
        res["abort_sent"] = aborted
        return res

    async def run() -> List[dict]:
        return list(await asyncio.gather(*(one(i) for i in range(len(input_ids)))))

    return engine.loop.run_until_complete(run())


def host_server_info(engine: Any) -> dict:
    """``engine.get_server_info()`` (includes ``internal_states`` with ``avg_spec_accept_length``)."""
    return engine.get_server_info()


PLUGIN_ENTRY_POINT = "hybrid_spark"


def _require_plugin_entry_point() -> None:
    """The CPU fixes reach SGLang's spawned scheduler only through the installed plugin entry point; without it
    speculative decoding on CPU is silently lossy, so refuse to start."""
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="sglang.srt.plugins")}
    if PLUGIN_ENTRY_POINT not in names:
        raise RuntimeError(
            f"entry point {PLUGIN_ENTRY_POINT!r} (group sglang.srt.plugins) is not installed: run "
            f"`pip install -e {REPO_ROOT}` so SGLang's scheduler process applies sglang_hybrid's CPU fixes"
        )


def _host_main(conn: Any, kwargs: Dict[str, Any], env: Dict[str, str]) -> None:
    """Entry point of an engine host: set the CPU-engine environment, start the engine, serve calls."""
    os.environ.update(env)
    if STUB_DIR not in sys.path:
        sys.path.insert(0, STUB_DIR)
    if REPO_ROOT not in sys.path:
        sys.path.insert(1, REPO_ROOT)
    try:
        t0 = time.perf_counter()
        _require_plugin_entry_point()
        import sglang

        from sglang_hybrid.sglang_plugin.cpu_compat import apply_cpu_compat

        apply_cpu_compat()  # this process; the plugin entry point does it in SGLang's own processes
        engine = sglang.Engine(**kwargs)
        conn.send(("ready", {"start_s": time.perf_counter() - t0, "pid": os.getpid()}))
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
        return
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            fn, args, kw = msg
            try:
                conn.send(("ok", fn(engine, *args, **kw)))
            except BaseException:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))
    finally:
        engine.shutdown()


# ------------------------------------------------------------------------------------------------------------
# test-process side
# ------------------------------------------------------------------------------------------------------------


class EngineError(RuntimeError):
    """The engine host failed to start, raised in a call, or timed out."""


@dataclass
class EngineHandle:
    """A running engine (in its host process) for one configuration."""

    config: EngineConfig
    kwargs: Dict[str, Any]
    start_s: float = 0.0
    call_log: List[Tuple[str, float]] = field(default_factory=list)
    _proc: Any = None
    _conn: Any = None

    @classmethod
    def start(cls, config: EngineConfig, models: Any, timeout_s: float = 600.0) -> "EngineHandle":
        """Spawn the host process and wait until its engine is ready (raises :class:`EngineError`)."""
        kwargs = config.resolve_kwargs(models)
        env = dict(ENGINE_ENV)
        env["PYTHONPATH"] = os.pathsep.join(
            [STUB_DIR, REPO_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        env.update(dict(config.env))
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        # the host sets ``env`` before importing anything (and SGLang's processes inherit it from the host)
        proc = ctx.Process(target=_host_main, args=(child, kwargs, env), name=f"engine-{config.name}", daemon=False)
        proc.start()
        child.close()
        handle = cls(config=config, kwargs=kwargs, _proc=proc, _conn=parent)
        status, payload = handle._recv(timeout_s, what="engine start")
        if status != "ready":
            handle._kill()
            raise EngineError(f"engine {config.name!r} failed to start:\n{payload}")
        handle.start_s = payload["start_s"]
        return handle

    def _recv(self, timeout_s: float, what: str) -> Tuple[str, Any]:
        deadline = time.monotonic() + timeout_s
        while not self._conn.poll(0.5):
            if not self._proc.is_alive():
                raise EngineError(f"engine {self.config.name!r} host died during {what} (exit {self._proc.exitcode})")
            if time.monotonic() > deadline:
                self._kill()
                raise EngineError(f"engine {self.config.name!r}: {what} timed out after {timeout_s:.0f} s")
        return self._conn.recv()

    def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float = DEFAULT_CALL_TIMEOUT_S, **kw: Any) -> Any:
        """Run ``fn(engine, *args, **kw)`` in the host (``fn`` must be a module-level function) and return its
        result; a host-side exception is re-raised as :class:`EngineError` with the remote traceback."""
        if self._proc is None or not self._proc.is_alive():
            raise EngineError(f"engine {self.config.name!r} is not running")
        t0 = time.perf_counter()
        self._conn.send((fn, args, kw))
        status, payload = self._recv(timeout_s, what=fn.__name__)
        self.call_log.append((fn.__name__, time.perf_counter() - t0))
        if status != "ok":
            raise EngineError(f"engine {self.config.name!r}: {fn.__name__} failed:\n{payload}")
        return payload

    def generate(
        self, input_ids: List[List[int]], sampling_params: List[Dict[str, Any]] | Dict[str, Any],
        cache_salt: Optional[List[str]] = None, routing_key: Optional[List[Optional[str]]] = None,
        top_logprobs_num: Optional[int] = None,
    ) -> List[dict]:
        """Generate for a batch of token-id prompts (one sampling-params dict per prompt, or one for all;
        ``cache_salt`` / ``routing_key``: one per prompt, what names the plugin's tenant)."""
        if isinstance(sampling_params, dict):
            sampling_params = [dict(sampling_params) for _ in input_ids]
        if len(sampling_params) != len(input_ids):
            raise ValueError(f"{len(input_ids)} prompts but {len(sampling_params)} sampling_params")
        if routing_key is not None and top_logprobs_num is not None:
            raise ValueError("routing_key and top_logprobs_num together are not supported by host_generate")
        return self.call(host_generate, input_ids, sampling_params, cache_salt, routing_key, top_logprobs_num)

    def generate_with_abort(
        self,
        input_ids: List[List[int]],
        sampling_params: List[Dict[str, Any]],
        abort_index: int,
        abort_after_tokens: int,
    ) -> List[dict]:
        """See :func:`host_generate_with_abort`."""
        return self.call(host_generate_with_abort, input_ids, sampling_params, abort_index, abort_after_tokens)

    def server_info(self) -> dict:
        return self.call(host_server_info)

    def close(self, timeout_s: float = 120.0) -> None:
        """Shut the engine down and join the host (killed if it does not exit in time)."""
        if self._proc is None:
            return
        try:
            if self._proc.is_alive():
                self._conn.send(None)
                self._proc.join(timeout_s)
        except (BrokenPipeError, OSError):
            pass
        finally:
            self._kill()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.is_alive():
            proc.kill()  # its SGLang children exit with their parent (they watch it)
            proc.join(30)
        if self._conn is not None:
            self._conn.close()


class EnginePool:
    """Starts engines on demand and reuses them; keeps at most ``max_alive`` running (least recently used is
    shut down first) to bound memory. ``timings`` records each start (seconds) for reporting."""

    def __init__(self, models: Any, max_alive: int = 2) -> None:
        self.models = models
        self.max_alive = max_alive
        self._alive: Dict[str, EngineHandle] = {}
        self.closed: List[EngineHandle] = []
        self.timings: Dict[str, List[float]] = {}

    def get(self, name: str) -> EngineHandle:
        """The running engine of configuration ``name`` (started if needed)."""
        handle = self._alive.pop(name, None)
        if handle is None or handle._proc is None or not handle._proc.is_alive():
            while len(self._alive) >= self.max_alive:
                self._retire(next(iter(self._alive)))
            t0 = time.perf_counter()
            handle = EngineHandle.start(get_config(name), self.models)
            self.timings.setdefault(name, []).append(time.perf_counter() - t0)
        self._alive[name] = handle  # most recently used last
        return handle

    def _retire(self, name: str) -> None:
        handle = self._alive.pop(name)
        handle.close()
        self.closed.append(handle)

    def handles(self) -> List[EngineHandle]:
        """Every engine started so far (running or closed), in start order of their configurations."""
        return self.closed + list(self._alive.values())

    def close(self) -> None:
        """Shut every running engine down."""
        while self._alive:
            self._retire(next(iter(self._alive)))


def replace_config(name: str, **changes: Any) -> EngineConfig:
    """Register a copy of configuration ``name`` with ``changes`` applied (``dataclasses.replace``)."""
    return register_config(dataclasses.replace(get_config(name), **changes))
