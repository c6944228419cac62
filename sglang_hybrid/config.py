"""The plugin's own options: one documented source, validated at start-up.

Options come from a JSON file named by ``SGLANG_HYBRID_CONFIG`` and/or from ``SGLANG_HYBRID_<KEY>``
environment variables (upper-case key); an environment variable wins over the file. SGLang's own flags are
reused where they mean the same thing (draft model path, number of steps / draft tokens, the DSpark SPS table);
only what SGLang has no flag for lives here.

Every error names the key and where it came from, and is raised before any model loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

ENV_PREFIX = "SGLANG_HYBRID_"
ENV_CONFIG_FILE = "SGLANG_HYBRID_CONFIG"
# Environment variables with the prefix that are not options.
_NOT_OPTIONS = {ENV_CONFIG_FILE, "SGLANG_HYBRID_RESOLVED_DRAFT_KIND", "SGLANG_HYBRID_SYNC_GUARD"}

MAX_DRAFT_LIMIT = 64  # longest n-gram chain (the lookup kernels' limit)
DRAFT_KINDS = ("auto", "eagle", "eagle3", "standalone", "dspark")
CORPUS_MODES = ("off", "shared", "tenant")  # isolation of the cross-request corpus
WARMUP_MODES = ("auto", "on", "off")  # start-up warm-up of the decode step (warmup.py): auto = on a GPU only
STEP_GRAPHS_MODES = ("off", "on")  # CUDA-graph replay of the decode step (graphs.py)
FAIRNESS_MAX = 4.0  # largest exponent of the fairness weights (selection/fairness.py)
FAIRNESS_SCOPES = ("request", "tenant")  # what the fairness weights even out (selection/fairness.py)
# Which fields of an SGLang request name its tenant (the corpus's "tenant" isolation, fairness_scope "tenant"):
# "cache" = extra_key + cache_salt (what isolates the prefix cache), "routing_key" = SGLang's routing key (the
# x-smg-routing-key header; it leaves the prefix cache shared), "cache+routing_key" = a tenant per pair.
TENANT_KEYS = ("cache", "routing_key", "cache+routing_key")


class HybridConfigError(ValueError):
    """A bad plugin option; the message names the key and its source."""


@dataclass(frozen=True)
class HybridConfig:
    """Options of the HYBRID_SPARK worker (see the README's Configuration table)."""

    n_min: int = 2  # shortest suffix an n-gram match may use
    n_max: int = 8  # longest suffix compared
    max_draft: int = 0  # L_max: longest n-gram chain; > speculative_num_steps widens the verify window; 0 = fill it
    window: int = 0  # scan window in tokens; 0 = the whole history row
    narrow_above: int = 0  # batches of more requests verify only steps + 1 tokens (a wide window is cheap only
    # while the verify is memory-bound); 0 = the window never narrows; -1 or "auto" = from the SPS table and the
    # acceptance measured under each window (sglang_plugin/auto_narrow.py)
    history_width: int = 0  # tokens kept per request; 0 = the model's context length
    calibration: str = "default"  # path of a calibration JSON, or "default" for the shipped table
    enable_ngram: bool = True  # ablation: False = model chain only
    enable_model: bool = True  # ablation: False = n-gram chain only (the model still drafts; its chain is ignored)
    draft_kind: str = "auto"  # auto-detect from the draft model's config.json, or force one of DRAFT_KINDS
    num_iters: int = 2  # price iterations of the selection
    model_prior: float = 0.7  # initial per-position conditional acceptance of the model chain
    model_ema: float = 0.05  # online refit rate of the model chain's per-position acceptance
    model_agreement: bool = True  # price n-gram tokens beside the model chain (calibration/agreement.py): max(q, c)
    # where they agree, the two-expert rule where they part, one learnt price on the tokens both chains share
    online_calibration: bool = True  # per-request recalibration of the n-gram estimates (calibration/online.py)
    online_strength: float = 2.0  # its prior strength, in units of its records (larger: trust the table longer)
    online_defer: int = 8  # drafts scored against the history as it arrives, open up to this many steps; 0 =
    # against their own step's commit only (calibration/deferred.py)
    online_bins: int = 8  # second recalibration stage, traffic level, by the estimate's value (K bins of q'
    # in [0, 1]; corrects an over- or under-confident table's spread); 0 = off
    sps2d_table: str = ""  # DSpark worker: price with a 2-D SPS table (batch tokens x the step's KV context,
    # selection/sps2d.py): "" = DSpark's 1-D table only, "roofline" = the shipped roofline model, or a JSON path
    metrics_interval: int = 50  # decode steps between periodic log lines; 0 = never
    corpus: str = "off"  # cross-request n-gram corpus (ngram/corpus.py): "off", "shared" or "tenant" (README)
    corpus_entries: int = 1 << 21  # its table entries (a power of two); device memory 16 bytes per entry
    corpus_calibration: str = "default"  # the corpus drafts' fitted odds-ratio table (calibration/corpus_table.py):
    # "default" = the shipped one, "none" = the corpus's own q, or a JSON path (hybrid-spark calibrate --candidate
    # corpus); the online recalibration runs after it either way
    model_tail: int = MAX_DRAFT_LIMIT  # n-gram tail drafted after the model chain (calibration/tail.py), at most
    # this many tokens, capped by the chain width minus gamma (so 0 wherever the window is only gamma); 0 = off
    corpus_tail: bool = True  # with the corpus on and the tail on: the corpus's continuation after the model chain
    # competes with the n-gram tail (calibration/tail.py: CorpusTail; the better of the two per request)
    model_splices: int = 0  # splice points just before the model chain's end (calibration/splice.py): the chain
    # cut after token k = gamma - model_splices .. gamma - 1 and continued by the request's own n-gram; 0 = off
    splice_margin: float = 0.2  # expected tokens a splice must add over the model chain (at the last step's price)
    model_echo: bool = True  # where a lookup after the model chain's first k tokens matches (the tail's: k = gamma;
    # the splices'; the probes'), those tokens are priced by the traffic's record of such echoes (calibration/echo.py)
    echo_probes: int = 4  # with model_echo: lookups after the model chain's first k tokens, k = gamma - echo_probes
    # .. gamma - 1 (the splices' points excepted), that only extend the echo's reach (ModelEcho.probe); 0 = off
    fairness: float = 0.0  # each request's survivals times (the batch's lowest speed relative to DSpark's plan for
    # it / its own) ** fairness before the selection (selection/fairness.py): 0 = the batch's tokens per second
    # alone; 2 keeps chat beside code edits near DSpark's speed; needs DSpark's ragged verify (an SPS budget)
    fairness_scope: str = "request"  # what the weights even out: "request" (every request in the batch) or
    # "tenant" (each tenant's requests together; the tenant is the corpus's, see tenant_key; README)
    tenant_key: str = "cache"  # what names a request's tenant (TENANT_KEYS): "cache" = extra_key / cache_salt,
    # "routing_key" = SGLang's routing key (traffic classes without salting the prefix cache), or both
    warmup: str = "auto"  # start-up warm-up (warmup.py): "auto" = on a GPU only, "on" = always, "off" = never
    step_graphs: str = "off"  # "on": replay propose / record as CUDA graphs, one per call shape (graphs.py; GPU)
    penalty_rows: int = 64  # requests with frequency / presence / repetition penalties or min_new_tokens served
    # at once with them applied exactly at every verify position (penalties.py; (rows + 1) x vocab x 5 bytes of
    # device memory); 0 = off (SGLang's own: none after the first token on DSpark, "relaxed" on EAGLE drafts)

    def validate(self) -> None:
        def bad(key: str, why: str) -> HybridConfigError:
            return HybridConfigError(f"sglang-hybrid option '{key}': {why}")

        if self.n_min < 1:
            raise bad("n_min", f"must be >= 1, got {self.n_min}")
        if self.n_max < self.n_min:
            raise bad("n_max", f"must be >= n_min ({self.n_min}), got {self.n_max}")
        if not (0 <= self.max_draft <= MAX_DRAFT_LIMIT):
            raise bad("max_draft", f"must be in [0, {MAX_DRAFT_LIMIT}] (0 = fill the verify window), got {self.max_draft}")
        if self.window < 0:
            raise bad("window", f"must be >= 0, got {self.window}")
        if self.narrow_above < -1:
            raise bad("narrow_above", f"must be >= 0 (0 = never narrow) or -1 / 'auto', got {self.narrow_above}")
        if self.history_width < 0:
            raise bad("history_width", f"must be >= 0, got {self.history_width}")
        if self.draft_kind not in DRAFT_KINDS:
            raise bad("draft_kind", f"must be one of {DRAFT_KINDS}, got {self.draft_kind!r}")
        if not (self.enable_ngram or self.enable_model):
            raise bad("enable_ngram", "enable_ngram and enable_model cannot both be false")
        if self.num_iters < 0:
            raise bad("num_iters", f"must be >= 0, got {self.num_iters}")
        if not (0.0 < self.model_prior <= 1.0):
            raise bad("model_prior", f"must be in (0, 1], got {self.model_prior}")
        if not (0.0 <= self.model_ema <= 1.0):
            raise bad("model_ema", f"must be in [0, 1], got {self.model_ema}")
        if not (self.online_strength > 0):
            raise bad("online_strength", f"must be > 0, got {self.online_strength}")
        if not 0 <= self.online_bins <= 64:
            raise bad("online_bins", f"must be in [0, 64] (0 = off), got {self.online_bins}")
        if self.online_defer < 0:
            raise bad("online_defer", f"must be >= 0 (0 = score against the step's commit), got {self.online_defer}")
        if self.metrics_interval < 0:
            raise bad("metrics_interval", f"must be >= 0, got {self.metrics_interval}")
        if not (0 <= self.model_tail <= MAX_DRAFT_LIMIT):
            raise bad("model_tail", f"must be in [0, {MAX_DRAFT_LIMIT}] (0 = off), got {self.model_tail}")
        if not (0 <= self.model_splices <= MAX_DRAFT_LIMIT):
            raise bad("model_splices", f"must be in [0, {MAX_DRAFT_LIMIT}] (0 = off), got {self.model_splices}")
        if not (0 <= self.echo_probes <= MAX_DRAFT_LIMIT):
            raise bad("echo_probes", f"must be in [0, {MAX_DRAFT_LIMIT}] (0 = off), got {self.echo_probes}")
        if not (0.0 <= self.splice_margin <= MAX_DRAFT_LIMIT):
            raise bad("splice_margin", f"must be in [0, {MAX_DRAFT_LIMIT}] (expected tokens), got {self.splice_margin}")
        if not (0.0 <= self.fairness <= FAIRNESS_MAX):
            raise bad("fairness", f"must be in [0, {FAIRNESS_MAX:g}] (0 = off; the exponent of the weights), "
                                  f"got {self.fairness}")
        if self.fairness_scope not in FAIRNESS_SCOPES:
            raise bad("fairness_scope", f"must be one of {FAIRNESS_SCOPES}, got {self.fairness_scope!r}")
        if self.tenant_key not in TENANT_KEYS:
            raise bad("tenant_key", f"must be one of {TENANT_KEYS}, got {self.tenant_key!r}")
        if self.penalty_rows < 0:
            raise bad("penalty_rows", f"must be >= 0 (0 = off), got {self.penalty_rows}")
        if self.step_graphs not in STEP_GRAPHS_MODES:
            raise bad("step_graphs", f"must be one of {STEP_GRAPHS_MODES}, got {self.step_graphs!r}")
        if self.warmup not in WARMUP_MODES:
            raise bad("warmup", f"must be one of {WARMUP_MODES}, got {self.warmup!r}")
        if self.corpus not in CORPUS_MODES:
            raise bad("corpus", f"must be one of {CORPUS_MODES}, got {self.corpus!r}")
        if self.corpus_entries < 8 or self.corpus_entries & (self.corpus_entries - 1):
            raise bad("corpus_entries", f"must be a power of two >= 8, got {self.corpus_entries}")
        if self.sps2d_table not in ("", "roofline") and not os.path.isfile(self.sps2d_table):
            raise bad("sps2d_table", f"file not found: {self.sps2d_table} ('' = off, 'roofline', or a JSON path)")
        if self.calibration != "default" and not os.path.isfile(self.calibration):
            raise bad("calibration", f"file not found: {self.calibration}")
        if self.corpus_calibration not in ("default", "none") and not os.path.isfile(self.corpus_calibration):
            raise bad("corpus_calibration", f"file not found: {self.corpus_calibration} ('default', 'none', or a "
                                            "JSON path)")
        if self.corpus != "off":  # read it now: a malformed or mismatched table fails at start-up, named
            from .calibration.candidates import corpus_config
            from .calibration.corpus_table import load_corpus_table

            try:
                table = load_corpus_table(self.corpus_calibration)
                if table is not None:
                    table.check_corpus(corpus_config(self.corpus, self.corpus_entries, 1))
            except ValueError as e:
                raise bad("corpus_calibration", str(e)) from None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str) -> "HybridConfig":
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in known:
                raise HybridConfigError(
                    f"unknown sglang-hybrid option '{key}' in {source}; known: {sorted(known)}"
                )
            if key == "narrow_above" and str(raw).strip().lower() == "auto":
                raw = -1
            kwargs[key] = _coerce(key, raw, known[key].type, source)
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "HybridConfig":
        """Read ``SGLANG_HYBRID_CONFIG`` (a JSON object) and then ``SGLANG_HYBRID_<KEY>`` overrides."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        sources: list[str] = []
        path = env.get(ENV_CONFIG_FILE)
        if path:
            values.update(_read_json_file(path))
            sources.append(path)
        for name, raw in env.items():
            if name.startswith(ENV_PREFIX) and name not in _NOT_OPTIONS:
                values[name[len(ENV_PREFIX):].lower()] = raw
        return cls.from_mapping(values, source=" and ".join(sources + ["SGLANG_HYBRID_* environment"]))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _read_json_file(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise HybridConfigError(f"{ENV_CONFIG_FILE}: file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise HybridConfigError(f"{ENV_CONFIG_FILE}: {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise HybridConfigError(f"{ENV_CONFIG_FILE}: {path} must hold a JSON object")
    return data


def _coerce(key: str, raw: Any, typ: Any, source: str) -> Any:
    name = typ if isinstance(typ, str) else typ.__name__
    try:
        if name == "bool":
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if name == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            return int(str(raw).strip())
        if name == "float":
            if isinstance(raw, bool):
                raise ValueError(raw)
            return float(raw)
        if name == "str":
            if not isinstance(raw, str):
                raise ValueError(raw)
            return raw
    except (TypeError, ValueError):
        raise HybridConfigError(
            f"sglang-hybrid option '{key}' in {source}: expected {name}, got {raw!r}"
        ) from None
    raise AssertionError(f"unhandled option type {name}")
