"""``NgramCorpus``: a fixed-size device table of n-gram continuations shared across requests.

The per-request drafter (``TokenHistory``) only sees a request's own prompt and output. The corpus also
remembers what earlier (and concurrent) requests produced: a hash table from (tenant, last ``n`` tokens)
to next tokens with counts, for every order ``1 <= n <= n_max``, with bounded, deterministic eviction
(``corpus_reference.py`` defines the exact semantics). Drafts are frequency-scored walks whose length is set
by confidence (the estimated survival must stay above ``tau``), not by a fixed K.

Memory: ``entries * 16`` bytes on the device (tag, token, count, claim scratch: int32 each); the default
``2**21`` entries is 32 MiB. With the Triton backend the insert's update keys add
``8 * max_batch_size * insert_chunk * (n_max + 1)`` bytes (288 KiB at batch 128 with the defaults). The table never grows; when full, a contested entry's count
halves on every contesting insert and the entry is replaced when it reaches zero.

API for the decode step (all device work on preallocated buffers, no host synchronisation, fixed shapes,
CUDA-graph capturable; ``slots`` index the ``TokenHistory`` the corpus reads its contexts from)::

    corpus = NgramCorpus(CorpusConfig(entries=1 << 21), device, max_batch_size=bs, max_draft=16)
    draft = corpus.lookup(history, slots, tenant)        # -> CorpusDraft (views of preallocated buffers)
    #   draft.tokens [bs, D], draft.length [bs], draft.match_len [bs] (order used), draft.match_count [bs]
    #   (context count), draft.score [bs] (expected accepted length * 2**16), draft.q [bs, D] (per-token q, 2**16)
    ...verify; history.append(slots, new_tokens, counts)...
    corpus.insert(history, slots, counts, tenant)        # the newest counts[b] tokens of each slot's history
    corpus.insert_prompt(history, slots, prompt_len, tenant)  # optional, at prefill (host loop over chunks)

``tenant [bs]`` int32 (or ``None`` = tenant 0): requests only see continuations inserted under the same
tenant id (``CorpusConfig.isolation == "tenant"``); with ``"shared"`` every id is read as 0. ``"off"`` means
no corpus is built at all (the caller skips it; :func:`make_corpus` returns ``None``).

Privacy: a shared corpus carries text across requests. Outputs stay lossless (every drafted token is
verified by the target model), but the speed of a request reveals whether its continuation was seen before,
so multi-tenant deployments should use ``isolation="tenant"`` or ``"off"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from ..hostsync import host_reads_allowed
from ..backend import resolve_backend
from . import corpus_reference as ref

__all__ = ["CorpusConfig", "CorpusDraft", "NgramCorpus", "make_corpus", "ISOLATION_MODES", "make_coef"]

ISOLATION_MODES = ("shared", "tenant", "off")
_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class CorpusConfig:
    """Corpus options.

    ``entries``: table entries (a power of two, ``>= ways``); memory ``16 * entries`` bytes.
    ``ways``: entries per bucket (continuations a context can keep; a power of two).
    ``n_max``: longest context order stored and probed (orders ``1 .. n_max`` are all stored).
    ``alpha``: pseudo-count in ``q = best / (total + alpha)`` (thin evidence is trusted less).
    ``tau``: the survival a drafted token must keep (a float in (0, 1]); sets the draft length.
    ``isolation``: ``"shared"``, ``"tenant"`` or ``"off"``. ``insert_prompts``: also learn prompts.
    ``insert_chunk``: positions per insert launch (the insert buffers' width).
    """

    entries: int = 1 << 21
    ways: int = 8
    n_max: int = 8
    alpha: int = 1
    tau: float = 0.25
    isolation: str = "shared"
    insert_prompts: bool = False
    insert_chunk: int = 32

    def validate(self) -> None:
        for name in ("entries", "ways", "n_max", "alpha", "insert_chunk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"CorpusConfig.{name} must be an int, got {type(v).__name__}")
        if self.ways < 1 or self.ways & (self.ways - 1):
            raise ValueError(f"CorpusConfig.ways must be a power of two >= 1, got {self.ways}")
        if self.entries < self.ways or self.entries & (self.entries - 1):
            raise ValueError(f"CorpusConfig.entries must be a power of two >= ways ({self.ways}), got {self.entries}")
        if not 1 <= self.n_max <= 32:
            raise ValueError(f"CorpusConfig.n_max must be in [1, 32], got {self.n_max}")
        if self.alpha < 1:
            raise ValueError(f"CorpusConfig.alpha must be >= 1, got {self.alpha}")
        if not (isinstance(self.tau, (int, float)) and 0.0 < float(self.tau) <= 1.0):
            raise ValueError(f"CorpusConfig.tau must be a number in (0, 1], got {self.tau!r}")
        if self.isolation not in ISOLATION_MODES:
            raise ValueError(f"CorpusConfig.isolation must be one of {ISOLATION_MODES}, got {self.isolation!r}")
        if self.insert_chunk < 1:
            raise ValueError(f"CorpusConfig.insert_chunk must be >= 1, got {self.insert_chunk}")

    @property
    def memory_bytes(self) -> int:
        return 16 * self.entries

    @property
    def tau_fixed(self) -> int:
        return max(1, int(round(float(self.tau) * ref.ONE)))


@dataclass
class CorpusDraft:
    """One corpus lookup for ``bs`` requests (views of preallocated buffers, overwritten by the next lookup).

    ``tokens [bs, D]``, ``length``, ``match_len`` (context order at the first token), ``match_count`` (that
    context's count), ``score`` (expected accepted length, fixed point ``2**16``), ``q [bs, D]`` (per-token
    conditional estimate, ``2**16``); all int32.
    """

    tokens: torch.Tensor
    length: torch.Tensor
    match_len: torch.Tensor
    match_count: torch.Tensor
    score: torch.Tensor
    q: torch.Tensor

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        return (self.tokens, self.length, self.match_len, self.match_count, self.score, self.q)

    @classmethod
    def zeros(cls, rows: int, width: int, device: torch.device | str) -> "CorpusDraft":
        """Zeroed int32 buffers for ``rows`` lookups of up to ``width`` tokens (``NgramCorpus.lookup(..., out=)``)."""
        i32 = dict(dtype=torch.int32, device=device)
        return cls(torch.zeros(rows, width, **i32), *(torch.zeros(rows, **i32) for _ in range(4)),
                   torch.zeros(rows, width, **i32))

    def rows(self, bs: int, width: int | None = None) -> "CorpusDraft":
        """Views of the first ``bs`` rows (and ``width`` token columns; default all)."""
        w = self.tokens.shape[1] if width is None else width
        return CorpusDraft(self.tokens[:bs, :w], self.length[:bs], self.match_len[:bs], self.match_count[:bs],
                           self.score[:bs], self.q[:bs, :w])


def make_coef(n_max: int, device: torch.device | str, seed: int = 0x5EED) -> torch.Tensor:
    """The hash coefficients ``[5, max(n_max + 1, 8)] int64`` (fixed seed: a table's layout is reproducible)."""
    L = max(n_max + 1, 8)
    rng = np.random.RandomState(seed)
    coef = rng.randint(1, ref.P - 1, size=(5, L), dtype=np.int64)
    return torch.from_numpy(coef).to(device)


def _ops(backend: str) -> tuple[Callable[..., None], Callable[..., None]]:
    if backend == "triton":
        from . import corpus_kernels as k

        return k.corpus_insert_triton, k.corpus_lookup_triton
    return ref.corpus_insert_ref, ref.corpus_lookup_ref


class NgramCorpus:
    """The shared n-gram corpus on one device (see the module docstring for the API and its costs)."""

    def __init__(self, cfg: CorpusConfig, device: torch.device | str, *, backend: str = "auto",
                 max_batch_size: int = 1, max_draft: int = 16) -> None:
        if not isinstance(cfg, CorpusConfig):
            raise TypeError(f"cfg must be a CorpusConfig, got {type(cfg).__name__}")
        cfg.validate()
        if cfg.isolation == "off":
            raise ValueError("CorpusConfig.isolation='off' builds no corpus (use make_corpus, which returns None)")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        device = torch.device(device)
        backend = resolve_backend(backend, device)
        self.cfg = cfg
        self.backend = backend
        self.device = device
        nb = cfg.entries // cfg.ways
        self.tag = torch.zeros((nb, cfg.ways), dtype=torch.int32, device=device)
        self.tok = torch.zeros((nb, cfg.ways), dtype=torch.int32, device=device)
        self.cnt = torch.zeros((nb, cfg.ways), dtype=torch.int32, device=device)
        self.claim = torch.full((cfg.entries,), ref.INT32_MAX, dtype=torch.int32, device=device)
        self.coef = make_coef(cfg.n_max, device)
        self.device = self.tag.device  # normalised ("cuda" -> "cuda:0"): compared against the inputs' devices
        self.max_batch_size = max_batch_size
        self.max_draft = max_draft
        self._zero_tenant = torch.zeros(max_batch_size, dtype=torch.int32, device=device)
        self._start = torch.zeros(max_batch_size, dtype=torch.int32, device=device)
        self._draft = CorpusDraft.zeros(max_batch_size, max_draft, device)
        self._insert, self._lookup = _ops(backend)
        # The insert's update keys between its Triton launches (the torch reference needs none); sized for the
        # largest call (decode and prompt chunks both pass max_pos = insert_chunk).
        self._scratch = torch.zeros(max_batch_size * cfg.insert_chunk * (cfg.n_max + 1), dtype=torch.int64,
                                    device=device) if backend == "triton" else None

    # ------------------------------------------------------------------ checks (host only)

    def _tensor(self, name: str, t: object, ndim: int, dtypes=_INDEX_DTYPES) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            raise TypeError(f"{name} must have dtype {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
        if t.device != self.device:
            raise ValueError(f"{name} must be on {self.device} (the corpus's device), got {t.device}")
        if t.dim() != ndim:
            raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
        return t

    def _tenant(self, tenant: Optional[torch.Tensor], bs: int) -> torch.Tensor:
        if bs > self.max_batch_size:
            raise ValueError(f"batch of {bs} exceeds max_batch_size={self.max_batch_size}")
        if tenant is None or self.cfg.isolation == "shared":
            return self._zero_tenant[:bs]
        self._tensor("tenant", tenant, 1)
        if tenant.shape[0] != bs:
            raise ValueError(f"tenant has {tenant.shape[0]} entries, slots has {bs}")
        return tenant

    def _history(self, history: object) -> None:
        from .history import TokenHistory

        if not isinstance(history, TokenHistory):
            raise TypeError(f"history must be a TokenHistory, got {type(history).__name__}")
        if history.device != self.device:
            raise ValueError(f"history is on {history.device}, the corpus on {self.device}")

    # ------------------------------------------------------------------ operations

    def lookup(self, history, slots: torch.Tensor, tenant: Optional[torch.Tensor] = None,
               max_draft: Optional[int] = None, out: Optional[CorpusDraft] = None) -> CorpusDraft:
        """Draft walk for ``slots`` from the corpus; views of preallocated buffers (``[:bs, :max_draft]``), or
        ``out`` (int32 ``[bs, D]`` / ``[bs]`` tensors on the corpus's device, ``D`` at most ``max_draft`` of the
        construction: a second lookup in the same step that must not overwrite the first)."""
        self._history(history)
        bs = self._tensor("slots", slots, 1).shape[0]
        ten = self._tenant(tenant, bs)
        if out is not None:
            D = out.tokens.shape[1]
            for name, t, shape in zip(("tokens", "length", "match_len", "match_count", "score", "q"),
                                      out.as_tuple(), ((bs, D), (bs,), (bs,), (bs,), (bs,), (bs, D))):
                if t.dtype != torch.int32 or t.device != self.device or tuple(t.shape) != shape:
                    raise ValueError(f"out.{name} must be int32 {shape} on {self.device}, got {t.dtype} "
                                     f"{tuple(t.shape)} on {t.device}")
            if not 1 <= D <= self.max_draft:
                raise ValueError(f"out.tokens has {D} columns; must be in [1, {self.max_draft}] (max_draft)")
        else:
            D = self._draft.tokens.shape[1] if max_draft is None else int(max_draft)
            if not 1 <= D <= self._draft.tokens.shape[1]:
                raise ValueError(f"max_draft must be in [1, {self._draft.tokens.shape[1]}], got {max_draft}")
            out = self._draft.rows(bs, D)
        self._lookup(self.tag, self.tok, self.cnt, self.coef, history.tokens, history.lens, slots, ten,
                     *out.as_tuple(), self.cfg.n_max, self.cfg.alpha, self.cfg.tau_fixed)
        return out

    def insert(self, history, slots: torch.Tensor, counts: torch.Tensor,
               tenant: Optional[torch.Tensor] = None) -> None:
        """Learn the newest ``counts[b]`` tokens of each slot's history (after ``history.append``); at most
        ``cfg.insert_chunk`` per slot and call (the accepted tokens plus the bonus token fit)."""
        self._history(history)
        bs = self._tensor("slots", slots, 1).shape[0]
        self._tensor("counts", counts, 1)
        if counts.shape[0] != bs:
            raise ValueError(f"counts has {counts.shape[0]} entries, slots has {bs}")
        ten = self._tenant(tenant, bs)
        self._insert(self.tag, self.tok, self.cnt, self.claim, self.coef, history.tokens, history.lens, slots,
                     ten, self._start[:bs], counts, self.cfg.insert_chunk, self.cfg.n_max, True, self._scratch)

    def insert_prompt(self, history, slots: torch.Tensor, prompt_len: torch.Tensor,
                      tenant: Optional[torch.Tensor] = None, max_prompt_len: Optional[int] = None) -> None:
        """Learn each slot's first ``prompt_len[b]`` history positions, in chunks of ``cfg.insert_chunk``.

        The number of launches is ``ceil(max_prompt_len / insert_chunk)``: pass ``max_prompt_len`` from host
        data (on a CPU corpus it is read from ``prompt_len``). Called at prefill, not in the decode step.
        """
        self._history(history)
        bs = self._tensor("slots", slots, 1).shape[0]
        self._tensor("prompt_len", prompt_len, 1)
        if max_prompt_len is None:
            if not host_reads_allowed(prompt_len):
                raise ValueError("insert_prompt on a GPU corpus needs max_prompt_len (a host int)")
            max_prompt_len = int(prompt_len.max()) if bs else 0
        ten = self._tenant(tenant, bs)
        ch = self.cfg.insert_chunk
        for c0 in range(0, max_prompt_len, ch):
            start = torch.full((bs,), c0, dtype=torch.int32, device=self.device)
            cnt = (prompt_len.to(torch.int32) - c0).clamp(0, ch)
            self._insert(self.tag, self.tok, self.cnt, self.claim, self.coef, history.tokens, history.lens,
                         slots, ten, start, cnt, ch, self.cfg.n_max, False, self._scratch)

    def reset(self) -> None:
        """Forget everything (e.g. on a model or tokenizer change)."""
        self.tag.zero_()
        self.tok.zero_()
        self.cnt.zero_()
        self.claim.fill_(ref.INT32_MAX)

    def occupancy(self) -> float:
        """Share of entries in use. HOST-SYNCING: diagnostics only."""
        return float((self.cnt > 0).float().mean())


def make_corpus(cfg: CorpusConfig, device, **kw) -> Optional[NgramCorpus]:
    """``NgramCorpus(cfg, device, **kw)``, or ``None`` when ``cfg.isolation == "off"``."""
    cfg.validate()
    return None if cfg.isolation == "off" else NgramCorpus(cfg, device, **kw)
