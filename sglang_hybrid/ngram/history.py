"""``TokenHistory``: the device-resident token-history table and its batched n-gram lookup.

One row per request-pool slot, a ring buffer of ``width`` int32 tokens (see ``reference.py`` for the exact
semantics). Every per-step method checks its arguments on the host from shapes, dtypes, devices and the
configuration only, then launches fixed-shape device work: no host synchronisation and no allocation (the
lookup writes into buffers preallocated here), so the calls can be captured in a CUDA graph.

Slot indices are device data: on a CPU table they are range-checked on the host (cheap); on a GPU table they
are not read back, and the kernels ignore an out-of-range slot (no write, zero lookup outputs). A padded
batch entry can therefore use slot ``-1``.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, TypeVar

import torch

from ..hostsync import host_reads_allowed
from ..backend import BACKENDS, resolve_backend
from . import reference
from .config import N_MAX_LIMIT, NgramConfig, NgramDraft

T = TypeVar("T")

__all__ = ["TokenHistory", "BACKENDS"]

logger = logging.getLogger("sglang_hybrid.ngram")

_INDEX_DTYPES = (torch.int32, torch.int64)


def _ops(backend: str) -> tuple[Callable[..., None], ...]:
    """``(write_prompt, append, reset, lookup, stash, restore, probe)`` of a backend."""
    if backend == "triton":
        from . import kernels

        return (
            kernels.history_write_prompt_triton,
            kernels.history_append_triton,
            kernels.history_reset_triton,
            kernels.ngram_lookup_triton,
            kernels.history_stash_triton,
            kernels.history_restore_triton,
            kernels.ngram_probe_triton,
        )
    return (
        reference.history_write_prompt_ref,
        reference.history_append_ref,
        reference.history_reset_ref,
        reference.ngram_lookup_ref,
        reference.history_stash_ref,
        reference.history_restore_ref,
        reference.ngram_probe_ref,
    )


class TokenHistory:
    """Token histories of the running requests, one ring-buffer row per request-pool slot.

    Args:
        num_slots: rows (SGLang's ``req_to_token_pool`` size).
        width: tokens kept per row; a longer history keeps its newest ``width`` tokens.
        device: where the table lives.
        backend: ``"auto"`` (Triton on CUDA, torch elsewhere), ``"torch"`` or ``"triton"`` (on CPU only under
            ``TRITON_INTERPRET=1``).
        max_batch_size: largest lookup batch without ``out=`` (the preallocated output buffers are sized for
            it); default ``num_slots``. Writes, appends and resets take up to ``num_slots`` slots.
        max_context_len: the longest history a request can reach; if above ``width`` a warning is logged once.
        max_draft: columns of the preallocated draft buffer (the largest ``NgramConfig.max_draft`` usable
            without an ``out`` argument).
    """

    def __init__(
        self,
        num_slots: int,
        width: int,
        device: torch.device | str,
        *,
        backend: str = "auto",
        max_batch_size: int | None = None,
        max_context_len: int | None = None,
        max_draft: int = NgramConfig.max_draft,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        if max_batch_size is None:
            max_batch_size = num_slots
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        device = torch.device(device)
        self.backend = backend = resolve_backend(backend, device)
        self.num_slots = num_slots
        self.width = width
        self.max_batch_size = max_batch_size
        self.tokens = torch.zeros((num_slots, width), dtype=torch.int32, device=device)
        self.lens = torch.zeros(num_slots, dtype=torch.int32, device=device)
        self.prompt_lens = torch.zeros(num_slots, dtype=torch.int32, device=device)
        self.device = self.tokens.device
        self._draft = NgramDraft(
            tokens=torch.zeros((max_batch_size, max_draft), dtype=torch.int32, device=device),
            length=torch.zeros(max_batch_size, dtype=torch.int32, device=device),
            match_len=torch.zeros(max_batch_size, dtype=torch.int32, device=device),
            match_count=torch.zeros(max_batch_size, dtype=torch.int32, device=device),
            in_prompt=torch.zeros(max_batch_size, dtype=torch.int32, device=device),
        )
        (self._write_prompt, self._append, self._reset, self._lookup, self._stash, self._restore,
         self._probe) = _ops(backend)
        self._overflow_logged = False
        if max_context_len is not None and max_context_len > width:
            self._log_overflow(
                f"token history width {width} < max_context_len {max_context_len}: a longer request keeps "
                f"its newest {width} tokens for n-gram lookup"
            )

    # ---------------------------------------------------------------- checks (host only, no device reads)

    def _log_overflow(self, msg: str) -> None:
        if not self._overflow_logged:
            self._overflow_logged = True
            logger.warning(msg)

    def _check_tensor(self, name: str, t: object, ndim: int, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name} must have dtype {want}, got {str(t.dtype).replace('torch.', '')}")
        if t.device != self.device:
            raise ValueError(f"{name} must be on {self.device} (the table's device), got {t.device}")
        if t.dim() != ndim:
            raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
        return t

    def _check_slots(self, slots: object, distinct: bool, batch_limit: bool = False) -> int:
        slots = self._check_tensor("slots", slots, 1, _INDEX_DTYPES)
        bs = slots.shape[0]
        if batch_limit and bs > self.max_batch_size:
            raise ValueError(f"slots has {bs} entries, more than max_batch_size={self.max_batch_size}")
        if distinct and bs > self.num_slots:
            raise ValueError(f"slots has {bs} entries for a table of {self.num_slots} slots; they must be distinct")
        if host_reads_allowed(slots) and bs > 0:
            lo, hi = int(slots.min()), int(slots.max())
            if lo < 0 or hi >= self.num_slots:
                bad = lo if lo < 0 else hi
                raise ValueError(f"slots holds {bad}, outside [0, {self.num_slots})")
            if distinct and torch.unique(slots).numel() != bs:
                raise ValueError("slots must be distinct within one write_prompt/append call")
        return bs

    def _check_batch(self, name: str, t: object, bs: int, ndim: int, dtypes: tuple[torch.dtype, ...]) -> None:
        t = self._check_tensor(name, t, ndim, dtypes)
        if t.shape[0] != bs:
            raise ValueError(f"{name} has {t.shape[0]} rows, slots has {bs} entries")

    # ---------------------------------------------------------------- operations

    def write_prompt(self, slots: torch.Tensor, prompt: torch.Tensor, prompt_len: torch.Tensor) -> None:
        """Start each slot afresh with ``prompt[b, :prompt_len[b]]`` (int32 tokens; lengths int32/int64).

        ``slots`` must be distinct (checked on a CPU table). ``prompt_len`` is clamped to ``[0, P]`` on the
        device. A prompt longer than ``width`` keeps its newest ``width`` tokens (a warning is logged once).
        """
        bs = self._check_slots(slots, distinct=True)
        self._check_batch("prompt", prompt, bs, 2, (torch.int32,))
        self._check_batch("prompt_len", prompt_len, bs, 1, _INDEX_DTYPES)
        if prompt.shape[1] > self.width:
            self._log_overflow(
                f"prompt of up to {prompt.shape[1]} tokens written to a token history of width {self.width}: "
                f"the row keeps its newest {self.width} tokens"
            )
        self._write_prompt(self.tokens, self.lens, self.prompt_lens, slots, prompt, prompt_len)

    def append(self, slots: torch.Tensor, new_tokens: torch.Tensor, counts: torch.Tensor) -> None:
        """Append ``new_tokens[b, :counts[b]]`` to each slot (accepted draft tokens plus the bonus token).

        ``new_tokens [bs, K]`` int32 with ``K <= width``; ``counts [bs]`` int32/int64, clamped to ``[0, K]``
        on the device. ``slots`` must be distinct (checked on a CPU table).
        """
        bs = self._check_slots(slots, distinct=True)
        self._check_batch("new_tokens", new_tokens, bs, 2, (torch.int32,))
        self._check_batch("counts", counts, bs, 1, _INDEX_DTYPES)
        if new_tokens.shape[1] > self.width:
            raise ValueError(
                f"new_tokens has {new_tokens.shape[1]} columns, more than the row width {self.width}: "
                "an append that would overflow a row in one call"
            )
        self._append(self.tokens, self.lens, slots, new_tokens, counts)

    def reset(self, slots: torch.Tensor) -> None:
        """Forget the histories of ``slots`` (finished, aborted or retracted requests)."""
        self._check_slots(slots, distinct=False)
        self._reset(self.lens, self.prompt_lens, slots)

    def lookup(self, slots: torch.Tensor, cfg: NgramConfig, out: NgramDraft | None = None) -> NgramDraft:
        """Batched n-gram lookup for ``slots``; see ``reference.py`` for the semantics.

        With ``out=None`` the result is views of the table's preallocated buffers (rows ``[:bs]``, columns
        ``[:cfg.max_draft]``), overwritten by the next lookup. ``out`` must hold int32 tensors of shapes
        ``[bs, cfg.max_draft]`` and ``[bs]`` on the table's device.
        """
        if not isinstance(cfg, NgramConfig):
            raise TypeError(f"cfg must be an NgramConfig, got {type(cfg).__name__}")
        cfg.validate()
        bs = self._check_slots(slots, distinct=False, batch_limit=out is None)
        if out is None:
            buf = self._draft
            if cfg.max_draft > buf.tokens.shape[1]:
                raise ValueError(
                    f"cfg.max_draft={cfg.max_draft} exceeds the draft buffer width {buf.tokens.shape[1]} "
                    "(construct TokenHistory with a larger max_draft, or pass out=)"
                )
            out = NgramDraft(
                tokens=buf.tokens[:bs, : cfg.max_draft],
                length=buf.length[:bs],
                match_len=buf.match_len[:bs],
                match_count=buf.match_count[:bs],
                in_prompt=buf.in_prompt[:bs],
            )
        else:
            if not isinstance(out, NgramDraft):
                raise TypeError(f"out must be an NgramDraft, got {type(out).__name__}")
            self._check_tensor("out.tokens", out.tokens, 2, (torch.int32,))
            if tuple(out.tokens.shape) != (bs, cfg.max_draft):
                raise ValueError(f"out.tokens must have shape {(bs, cfg.max_draft)}, got {tuple(out.tokens.shape)}")
            for name in ("length", "match_len", "match_count", "in_prompt"):
                t = self._check_tensor(f"out.{name}", getattr(out, name), 1, (torch.int32,))
                if t.shape[0] != bs:
                    raise ValueError(f"out.{name} must have shape ({bs},), got {tuple(t.shape)}")
        self._lookup(
            self.tokens, self.lens, self.prompt_lens, slots, *out.as_tuple(), cfg.n_min, cfg.n_max, cfg.window
        )
        return out

    def probe_after(self, slots: torch.Tensor, extra: torch.Tensor, points: torch.Tensor, out: torch.Tensor,
                    n: int, window: int = 0) -> torch.Tensor:
        """For each ``k`` in ``points [P]`` (int32): whether a lookup on ``history ++ extra[:k]`` with ``n_min = n``
        would find a match (``reference.py``: "Probe"), into ``out [bs, P]`` (int32, 1 = matched). One launch for
        all points; the table is not touched, so slots need not be distinct. ``extra [bs, G]`` int32."""
        bs = self._check_slots(slots, distinct=False)
        self._check_batch("extra", extra, bs, 2, (torch.int32,))
        self._check_tensor("points", points, 1, (torch.int32,))
        self._check_tensor("out", out, 2, (torch.int32,))
        if tuple(out.shape) != (bs, points.shape[0]):
            raise ValueError(f"out must have shape {(bs, points.shape[0])}, got {tuple(out.shape)}")
        if n < 1 or n > N_MAX_LIMIT or window < 0:
            raise ValueError(f"probe_after: need 1 <= n <= {N_MAX_LIMIT} and window >= 0, got n={n}, window={window}")
        self._probe(self.tokens, self.lens, slots, extra, points, out, n, window)
        return out

    def reserve_after(self, columns: int) -> tuple[torch.Tensor, ...]:
        """Allocate ``lookup_after``'s scratch for ``columns`` appended tokens (once; call it at construction so
        that no decode step, and no CUDA-graph capture, allocates). Another ``columns`` later reallocates."""
        sc = getattr(self, "_after", None)
        if sc is None or sc[0].shape[1] != columns:
            mb, dev = self.max_batch_size, self.device
            sc = (torch.zeros(mb, columns, dtype=torch.int64, device=dev),  # flat ring index of each appended token
                  torch.zeros(mb, columns, dtype=torch.int32, device=dev),  # the tokens it overwrites
                  torch.zeros(mb, dtype=torch.int64, device=dev),  # slots as int64, clamped
                  torch.zeros(mb, dtype=torch.int32, device=dev),  # lengths before the append
                  torch.full((mb,), columns, dtype=torch.int32, device=dev))  # append counts
            if self.backend != "triton":  # the torch stash's column offsets, made here rather than in a step
                reference._cols(columns, dev)
            self._after = sc
        return sc

    def lookup_after(self, slots: torch.Tensor, cfg: NgramConfig, extra: torch.Tensor,
                     out: NgramDraft | None = None) -> NgramDraft:
        """Lookup as if ``extra [bs, G]`` (int32, every column) followed each slot's history; the table is unchanged.

        This drafts a continuation *after* a chain that is not committed yet (the model chain): the suffix is the
        last ``n`` tokens of ``history ++ extra`` and matches are searched in that sequence (``run_after``).
        ``slots`` must be distinct; ``G <= width``.
        """
        return self.run_after(slots, extra, lambda: self.lookup(slots, cfg, out))

    def run_after(self, slots: torch.Tensor, extra: torch.Tensor, fn: Callable[[], T],
                  counts: Optional[torch.Tensor] = None) -> T:
        """``fn()`` run while ``extra [bs, G]`` (int32, every column) follows each slot's history; returns its result.

        It saves the ``G`` ring columns the append will overwrite and the lengths (``stash``), appends ``extra``,
        calls ``fn`` (lookups that read this history: the n-gram's, the corpus's), then puts them back
        (``restore``), all on the device in buffers sized for ``max_batch_size`` rows and ``G`` columns
        (``reserve_after``; no host sync), so the table is unchanged: three launches with the Triton backend.
        ``slots`` must be distinct; ``G <= width``. ``counts [bs]`` (int32, each in ``[0, G]``): append only
        ``extra[b, :counts[b]]`` (the model chain's first ``k`` tokens, ``calibration/splice.py``); default all
        ``G``. The same ``G`` columns are saved and restored either way.
        """
        bs = self._check_slots(slots, distinct=True, batch_limit=True)
        self._check_batch("extra", extra, bs, 2, (torch.int32,))
        g = extra.shape[1]
        if g > self.width:
            raise ValueError(f"extra has {g} columns, more than the row width {self.width}")
        sc = self.reserve_after(g)
        idx, saved, s64, lens0 = sc[0][:bs], sc[1][:bs], sc[2][:bs], sc[3][:bs]
        counts = sc[4][:bs] if counts is None else counts  # append checks a given one
        # An out-of-range slot (a padded entry) reads and restores a real row's own values: a no-op.
        self._stash(self.tokens, self.lens, slots, idx, saved, s64, lens0)
        self.append(slots, extra, counts)
        try:
            return fn()
        finally:
            self._restore(self.tokens, self.lens, idx, saved, s64, lens0)

    # ---------------------------------------------------------------- diagnostics (host-syncing)

    def overflowed_slots(self) -> list[int]:
        """Slots whose history is longer than ``width`` (they keep their newest tokens).

        HOST-SYNCING: reads ``lens`` back; for metrics and logging off the decode hot path only. Logs a warning
        the first time an overflow is seen (once per table).
        """
        slots = torch.nonzero(self.lens > self.width).flatten().tolist()
        if slots:
            self._log_overflow(
                f"{len(slots)} token-history row(s) longer than width {self.width} keep their newest tokens "
                f"(slots {slots[:8]}{'...' if len(slots) > 8 else ''})"
            )
        return slots
