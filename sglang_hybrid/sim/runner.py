"""Set up and run simulations: tokenize a workload, draw the model drafter's behaviour, run the policies."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np

from ..config import FAIRNESS_MAX, FAIRNESS_SCOPES, HybridConfig
from ..selection.sps import SpsTable, load_default_sps_table, load_sps_table, roofline_sps_table
from ..selection.sps2d import load_sps2d_table, roofline_sps2d_table
from .cost import make_cost
from .acceptance import DEFAULT_CONCENTRATION, DEFAULT_DECAY, AcceptanceModel
from .jsonl import Record
from .policies import DSparkPolicy, HybridPolicy, NgramPolicy
from .simulator import WRONG_TOKENS, PolicyResult, Request, run_policy
from .trace import ModelDraws, load_trace

POLICIES = ("dspark", "ngram", "hybrid")
ORACLE = "oracle"  # a clairvoyant yardstick (oracle.py), run only when SimOptions.oracle names a mode
DEFAULT_DRAFT_COST_FRAC = 0.15
RAGGED_MAX_DRAFT = 16  # the simulator's default hybrid n-gram chain under the ragged verify (SimOptions)
DEFAULT_NGRAM_WIDTH = 12  # SGLang NGRAM's default --speculative-num-draft-tokens


@dataclass(frozen=True)
class SimOptions:
    """Everything a simulation depends on besides the workload (all recorded in the JSON output)."""

    batch_size: int
    policies: tuple[str, ...] = POLICIES
    gamma: int = 7
    seed: int = 0
    max_requests: int = 0  # 0 = all; else the first M records (the shipped files are in hashed order)
    draft_cost_frac: float = DEFAULT_DRAFT_COST_FRAC
    dspark_lag: int = 2  # SGLang's SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS default
    ngram_width: int = DEFAULT_NGRAM_WIDTH
    accept_length: Optional[float] = None  # override the declared full-gamma accepted length of every kind
    concentration: float = DEFAULT_CONCENTRATION
    decay: float = DEFAULT_DECAY
    trace: Optional[str] = None
    n_min: int = HybridConfig.n_min
    n_max: int = HybridConfig.n_max
    max_draft: Optional[int] = None  # hybrid n-gram chain length; None = RAGGED_MAX_DRAFT (ragged) / gamma (fixed)
    window: int = HybridConfig.window
    num_iters: int = HybridConfig.num_iters
    enable_ngram: bool = True
    online_calibration: bool = HybridConfig.online_calibration  # per-request recalibration (calibration/online.py)
    online_strength: float = HybridConfig.online_strength
    online_defer: int = HybridConfig.online_defer  # drafts scored against the history as it arrives (deferred.py)
    online_bins: int = HybridConfig.online_bins  # the recalibration's second stage, by the estimate's value
    corpus: str = HybridConfig.corpus  # hybrid: the cross-request corpus, "off" or "shared" (one tenant here)
    corpus_entries: int = HybridConfig.corpus_entries
    corpus_calibration: str = HybridConfig.corpus_calibration  # hybrid: the corpus's fitted table (corpus_table.py)
    model_agreement: bool = HybridConfig.model_agreement  # hybrid: n-gram tokens re-priced beside the model chain
    two_branch: bool = False  # hybrid (ragged): verify both chains as a two-branch tree where that pays
    corpus_tail: bool = HybridConfig.corpus_tail  # hybrid, corpus and tail on: the corpus's tail (calibration/tail.py)
    fairness: float = HybridConfig.fairness  # hybrid: fairness weights before the selection (selection/fairness.py)
    fairness_scope: str = HybridConfig.fairness_scope  # "request", or "tenant" (each request kind its own tenant)
    model_tail: int = HybridConfig.model_tail  # hybrid: n-gram tail after the model chain (calibration/tail.py),
    # at most this many tokens, capped by the chain width minus gamma; 0 = off
    model_splices: int = HybridConfig.model_splices  # hybrid: splice points before the model chain's end (splice.py)
    splice_margin: float = HybridConfig.splice_margin  # hybrid: expected tokens a splice must add over the model chain
    model_echo: bool = HybridConfig.model_echo  # hybrid: the model tokens the history echoes are lifted (echo.py)
    echo_probes: int = HybridConfig.echo_probes  # hybrid, with model_echo: lookups that extend the echo's reach
    hybrid_verify: str = "ragged"  # "ragged": DSpark-style verify; "fixed": the EAGLE-family worker's fixed window
    calibration: Optional[str] = None  # None = the shipped table
    sps_table: Optional[str] = None  # None = the shipped roofline table
    tokenizer: Optional[str] = None  # None = the shipped tokenizer
    cost: str = "sps"  # "sps": 1/SPS(B) from the table; "roofline-2d": KV charged per actual request (cost.py)
    sps2d: str = "auto"  # hybrid's price: "auto" = a 2-D table (selection/sps2d.py) matching the cost model under
    # roofline-2d, the 1-D table under sps; "off" = always 1-D; "roofline" or a 2-D table JSON path
    measure: str = "steady"  # "steady": full batches only (stop when the queue runs dry); "all": to the end
    wrong_tokens: str = "shift"  # the model chain's wrong tokens: "shift" (ref + 1) or "history" (an adversary
    # for the echo: it copies what the history says follows its right prefix; simulator.py)
    oracle: str = ""  # "" = none; else also run the clairvoyant bound of that mode (oracle.ORACLE_MODES)
    progress: bool = False

    def validate(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        bad = [p for p in self.policies if p not in POLICIES and not (p == ORACLE and self.oracle)]
        if bad or not self.policies:
            raise ValueError(f"policies: choose from {POLICIES}, got {list(self.policies)}")
        if self.oracle:
            from .oracle import ORACLE_MODES

            if self.oracle not in ORACLE_MODES:
                raise ValueError(f"oracle: choose from {ORACLE_MODES}, got {self.oracle!r}")
        if self.gamma < 1:
            raise ValueError(f"gamma: must be >= 1, got {self.gamma}")
        if not 0.0 <= self.fairness <= FAIRNESS_MAX:
            raise ValueError(f"fairness: must be in [0, {FAIRNESS_MAX:g}] (0 = off), got {self.fairness}")
        if self.fairness_scope not in FAIRNESS_SCOPES:
            raise ValueError(f"fairness_scope: choose from {FAIRNESS_SCOPES}, got {self.fairness_scope!r}")
        if self.max_requests < 0:
            raise ValueError(f"max_requests: must be >= 0, got {self.max_requests}")
        if self.cost not in ("sps", "roofline-2d"):
            raise ValueError(f"cost: choose from ('sps', 'roofline-2d'), got {self.cost!r}")
        if self.measure not in ("steady", "all"):
            raise ValueError(f"measure: choose from ('steady', 'all'), got {self.measure!r}")
        if self.wrong_tokens not in WRONG_TOKENS:
            raise ValueError(f"wrong_tokens: choose from {WRONG_TOKENS}, got {self.wrong_tokens!r}")
        if self.hybrid_verify not in ("ragged", "fixed"):
            raise ValueError(f"hybrid_verify: choose from ('ragged', 'fixed'), got {self.hybrid_verify!r}")
        if self.two_branch and self.hybrid_verify != "ragged":
            raise ValueError("two_branch: needs hybrid_verify 'ragged'")
        if not self.online_strength > 0:
            raise ValueError(f"online_strength: must be > 0, got {self.online_strength}")
        if not self.sps2d:
            raise ValueError("sps2d: 'auto', 'off', 'roofline' or a 2-D table JSON path")
        if self.online_defer < 0:
            raise ValueError(f"online_defer: must be >= 0, got {self.online_defer}")
        if self.model_tail < 0:
            raise ValueError(f"model_tail: must be >= 0 (0 = off), got {self.model_tail}")
        if self.echo_probes < 0:
            raise ValueError(f"echo_probes: must be >= 0 (0 = off), got {self.echo_probes}")
        if self.model_splices < 0 or self.splice_margin < 0:
            raise ValueError(f"model_splices and splice_margin: must be >= 0, got {self.model_splices} and "
                             f"{self.splice_margin}")
        if self.corpus not in ("off", "shared"):
            raise ValueError(f"corpus: choose from ('off', 'shared'), got {self.corpus!r}")
        if self.max_draft is not None and not (1 <= self.max_draft <= 16):
            raise ValueError(f"max_draft: must be in [1, 16], got {self.max_draft}")

    @property
    def hybrid_max_draft(self) -> int:
        """The hybrid's n-gram chain length. Default: with the ragged (DSpark-style) verify, ``RAGGED_MAX_DRAFT``
        (the worker's ``max_draft=16``): a step verifies only the chosen lengths, so the price cuts long chains
        where verify is dear and takes them where it is cheap; with the fixed window (the EAGLE-family worker)
        every request pays the whole window, so the default is that worker's, ``gamma``."""
        if self.max_draft is not None:
            return self.max_draft
        if self.hybrid_verify == "ragged":
            return max(RAGGED_MAX_DRAFT, self.gamma)
        return min(HybridConfig.max_draft, self.gamma) if HybridConfig.max_draft else self.gamma


def load_sps(path: Optional[str]) -> SpsTable:
    """The SPS table of ``path`` (SGLang's SpsCostTable JSON) or the shipped roofline default."""
    if path:
        return load_sps_table(path)
    try:
        return load_default_sps_table()
    except Exception:  # the shipped file is missing: the same model, computed
        return roofline_sps_table()


def load_calibration(path: Optional[str]):
    from ..calibration.table import CalibrationTable

    return CalibrationTable.load(path) if path else CalibrationTable.load_default()


_TOKENIZERS: dict = {}
_ENCODED: dict = {}  # (tokenizer id, text) -> token ids: a report tokenizes each record once, not once per run


def _load_tokenizer(path: Optional[str]):
    if path not in _TOKENIZERS:
        from ..tokenizer import load_tokenizer

        _TOKENIZERS[path] = load_tokenizer(path)
    return _TOKENIZERS[path]


def _encode(tokenizer, texts: list[str]) -> list[np.ndarray]:
    key = id(tokenizer)
    _TOKENIZERS.setdefault(("id", key), tokenizer)  # keeps it alive, so its id is never reused
    missing = [t for t in dict.fromkeys(texts) if (key, t) not in _ENCODED]
    if missing:
        for t, enc in zip(missing, tokenizer.encode_batch(missing, add_special_tokens=False)):
            _ENCODED[(key, t)] = np.asarray(enc.ids, dtype=np.int32)
    return [_ENCODED[(key, t)] for t in texts]


def prepare_requests(records: Sequence[Record], opts: SimOptions, tokenizer=None) -> tuple[list[Request], int, dict]:
    """Tokenize and draw the model drafter's behaviour; returns (requests, vocab size, trace coverage)."""
    if tokenizer is None:
        tokenizer = _load_tokenizer(opts.tokenizer)
    if opts.max_requests:
        records = records[: opts.max_requests]
    if not records:
        raise ValueError("workload: no records to simulate")
    prompts = _encode(tokenizer, [r.prompt for r in records])
    outputs = _encode(tokenizer, [r.output for r in records])
    trace = load_trace(opts.trace, opts.gamma) if opts.trace else None
    models: dict[str, AcceptanceModel] = {}
    draws: dict[str, ModelDraws] = {}
    reqs = []
    for i, (rec, p, o) in enumerate(zip(records, prompts, outputs)):
        if rec.kind not in models:
            models[rec.kind] = AcceptanceModel.for_kind(rec.kind, opts.gamma, length=opts.accept_length,
                                                        decay=opts.decay, concentration=opts.concentration)
            draws[rec.kind] = ModelDraws(models[rec.kind], opts.seed, trace)
        out = o
        conf, acc = draws[rec.kind].for_request(i, rec.id, len(out))
        reqs.append(Request(i, rec.id, p, out, conf, acc, kind=rec.kind))
    coverage: dict = {}
    if trace is not None:
        for d in draws.values():
            for k, v in d.coverage.items():
                coverage[k] = coverage.get(k, 0) + v
    meta = {"models": {k: {"cond": [round(x, 4) for x in m.cond], "expected_length": round(m.expected_length(), 4),
                           "concentration": m.concentration} for k, m in models.items()},
            "trace_coverage": coverage or None}
    return reqs, tokenizer.get_vocab_size(), meta


def make_policy(name: str, opts: SimOptions, sps: SpsTable, calibration=None, hybrid_cls=None):
    """The policy ``name`` built from ``opts``; ``hybrid_cls``: a ``HybridPolicy`` subclass to build for "hybrid"
    (``steplog.StepLogPolicy``)."""
    if name == "dspark":
        return DSparkPolicy(opts.gamma, sps, lag=opts.dspark_lag)
    if name == "ngram":
        return NgramPolicy(opts.ngram_width, opts.n_min, opts.n_max, opts.window)
    if name == "hybrid" or (name == ORACLE and opts.oracle == "estimate"):
        L = opts.hybrid_max_draft
        if opts.sps2d == "off" or (opts.sps2d == "auto" and opts.cost != "roofline-2d"):
            sps2d = None
        elif opts.sps2d in ("auto", "roofline"):
            sps2d = roofline_sps2d_table()
        else:
            sps2d = load_sps2d_table(opts.sps2d)
        cls = hybrid_cls or HybridPolicy
        if name == ORACLE:
            from .oracle import EstimateOracle as cls
        return cls(opts.gamma, opts.batch_size, sps, calibration if calibration is not None else
                   load_calibration(opts.calibration), n_min=opts.n_min, n_max=opts.n_max, max_draft=L,
                   window=opts.window, num_iters=opts.num_iters, enable_ngram=opts.enable_ngram,
                   max_verify_len=opts.gamma if L <= opts.gamma else 0,
                   fixed_window=max(opts.gamma, L) if opts.hybrid_verify == "fixed" else None,
                   online_calibration=opts.online_calibration, online_strength=opts.online_strength,
                   online_defer=opts.online_defer, online_bins=opts.online_bins, sps2d=sps2d,
                   two_branch=opts.two_branch, corpus=opts.corpus, corpus_entries=opts.corpus_entries,
                   corpus_calibration=opts.corpus_calibration, model_tail=opts.model_tail,
                   model_agreement=opts.model_agreement, corpus_tail=opts.corpus_tail, fairness=opts.fairness,
                   fairness_scope=opts.fairness_scope, model_splices=opts.model_splices,
                   splice_margin=opts.splice_margin, model_echo=opts.model_echo,
                   echo_probes=opts.echo_probes)
    if name == ORACLE and opts.oracle:
        from .oracle import OraclePolicy

        return OraclePolicy(opts.gamma, sps, opts.oracle, lag=opts.dspark_lag, n_min=opts.n_min, n_max=opts.n_max,
                            max_draft=opts.hybrid_max_draft, window=opts.window, corpus=opts.corpus,
                            corpus_entries=opts.corpus_entries, max_bs=opts.batch_size)
    raise ValueError(f"policy: unknown {name!r}; choose from {POLICIES}")


def run_built(policy, reqs: Sequence[Request], vocab: int, opts: SimOptions, sps: SpsTable,
              label: str = "") -> PolicyResult:
    """Replay ``reqs`` (from ``prepare_requests``) through a built ``policy`` with ``opts``' batch size, cost model,
    drafter cost and measure."""
    return run_policy(policy, reqs, opts.batch_size, sps, gamma=opts.gamma, vocab_size=vocab,
                      cost=make_cost(opts.cost, sps), draft_cost_frac=opts.draft_cost_frac, progress=opts.progress,
                      measure=opts.measure, label=label, wrong_tokens=opts.wrong_tokens)


def simulate(records: Sequence[Record], opts: SimOptions, *, tokenizer=None, calibration=None,
             label: str = "") -> dict:
    """Run the chosen policies on ``records``; returns the JSON-ready result (see ``simulate_cli``)."""
    opts.validate()
    t0 = time.time()
    sps = load_sps(opts.sps_table)
    reqs, vocab, meta = prepare_requests(records, opts, tokenizer)
    results: dict[str, PolicyResult] = {}
    for name in opts.policies:
        pol = make_policy(name, opts, sps, calibration)
        results[name] = run_built(pol, reqs, vocab, opts, sps, label=f"{label}{name} bs={opts.batch_size}")
    kinds = sorted({r.kind for r in (records[: opts.max_requests] if opts.max_requests else records)})
    out = {
        "kind": kinds[0] if len(kinds) == 1 else kinds,
        "batch_size": opts.batch_size,
        "requests": len(reqs),
        "subsampled": bool(opts.max_requests and opts.max_requests < len(records)),
        "policies": {k: v.summary() for k, v in results.items()},
        "ratios": {},
        "settings": {**asdict(opts), "hybrid_max_draft": opts.hybrid_max_draft, "sps_table": sps.source,
                     **meta},
        "seconds": round(time.time() - t0, 1),
    }
    for other in ("dspark", "ngram"):
        if "hybrid" in results and other in results and results[other].throughput:
            out["ratios"][f"hybrid_over_{other}"] = round(results["hybrid"].throughput / results[other].throughput, 4)
    if "hybrid" in results and "dspark" in results and len(results["hybrid"].kinds) > 1:
        # Each kind's per-request speed, hybrid over DSpark: does one kind pay for another's gain in shared batches?
        h, d = results["hybrid"].kind_summary(), results["dspark"].kind_summary()
        out["ratios_by_kind"] = {
            k: {"hybrid_over_dspark": round(h[k]["tokens_per_second_per_request"]
                                            / d[k]["tokens_per_second_per_request"], 4)}
            for k in h if d.get(k, {}).get("tokens_per_second_per_request")}
    if ORACLE in results and "dspark" in results and results["dspark"].throughput:
        out["ratios"]["oracle_over_dspark"] = round(results[ORACLE].throughput / results["dspark"].throughput, 4)
    return out
