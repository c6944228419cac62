"""What the EAGLE-family and DSpark workers share: the options, and the token history written at prefill."""

from __future__ import annotations

import logging

import torch

from ..calibration import CalibrationTable
from ..config import HybridConfig
from ..memory import device_bytes, summary
from ..step import HybridStep
from .observability import note_prefill

logger = logging.getLogger("sglang_hybrid")


def load_options() -> tuple[HybridConfig, CalibrationTable]:
    """Read and validate the plugin options and the calibration table (errors surface at start-up)."""
    cfg = HybridConfig.from_env()
    calib = CalibrationTable.load_default() if cfg.calibration == "default" else CalibrationTable.load(cfg.calibration)
    return cfg, calib


def load_sps2d(cfg: HybridConfig):
    """The 2-D SPS table of option ``sps2d_table`` (None when off); a bad file fails at start-up, named."""
    from ..selection.sps2d import load_sps2d_table, roofline_sps2d_table

    if not cfg.sps2d_table:
        return None
    return roofline_sps2d_table() if cfg.sps2d_table == "roofline" else load_sps2d_table(cfg.sps2d_table)


def report_device_memory(hybrid: HybridStep, **extra) -> dict:
    """At start-up: what the step (and the worker's ``extra`` parts) hold on the device, logged by part and kept
    in the metrics (``device_bytes``, ``device_bytes_history``). SGLang sized its KV cache before this state
    existed, so it comes out of the headroom ``--mem-fraction-static`` leaves."""
    by_part = device_bytes(hybrid.device_parts(**extra), hybrid.device)
    hist = hybrid.history
    logger.info("HYBRID_SPARK holds %s on %s, beside SGLang's KV cache (it comes out of the headroom "
                "--mem-fraction-static leaves)", summary(by_part, {
                    "token history": f"{hist.tokens.shape[0]} request slots x {hist.tokens.shape[1]} tokens x 4 B; "
                                     "option history_width"}), hybrid.device)
    hybrid.extra_metrics["device_bytes"] = by_part["total"]
    hybrid.extra_metrics["device_bytes_history"] = by_part["token history"]
    return by_part


def write_prefill_history(hybrid: HybridStep, batch, next_token_ids: torch.Tensor, device) -> None:
    """After a target prefill: each request's prompt (and output so far, after a retraction) and its first sampled
    token start its request-pool slot's history row.

    Chunked prefill re-writes the row at every chunk (the full prompt is on the host); a slot that is reused
    starts from a fresh row, so a finished or aborted request's history never leaks into its successor.
    """
    if batch.forward_mode.is_idle() or not batch.reqs:
        return
    width = hybrid.history.width
    rows = [(list(r.origin_input_ids) + list(r.output_ids))[-width:] for r in batch.reqs]
    longest = max(1, max(len(r) for r in rows))
    prompt = torch.zeros(len(rows), longest, dtype=torch.int32)
    for i, r in enumerate(rows):
        prompt[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
    lens = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    tenant = None
    if hybrid.tracks_tenant:  # the corpus per tenant, or fairness between tenants
        ids = [tenant_id(r, hybrid.cfg.tenant_key) for r in batch.reqs]
        tenant = torch.tensor(ids, dtype=torch.int32).to(device, non_blocking=True)
        hybrid.note_tenants(ids)
    note_prefill(batch.reqs)
    hybrid.on_prefill(
        batch.req_pool_indices,
        prompt.to(device, non_blocking=True),
        lens.to(device, non_blocking=True),
        next_token_ids,
        tenant,
    )


def tenant_id(req, key: str = "cache") -> int:
    """The tenant of an SGLang ``Req`` (the corpus's, and the fairness weights' with ``fairness_scope`` tenant),
    named by option ``tenant_key``: ``"cache"``, what isolates its prefix cache (``extra_key``, to which SGLang
    appends the LoRA id, and ``cache_salt``); ``"routing_key"``, SGLang's routing key (the ``x-smg-routing-key``
    header of the OpenAI API, ``routing_key`` of ``/generate``); or ``"cache+routing_key"``, both. The fields are
    hashed (CRC-32) to 31 bits; a request with none of them set is tenant 0."""
    import zlib

    parts = []
    if key in ("cache", "cache+routing_key"):
        parts += [getattr(req, "extra_key", None) or "", getattr(req, "cache_salt", None) or ""]
    if key in ("routing_key", "cache+routing_key"):
        parts.append(getattr(req, "routing_key", None) or "")
    if not any(parts):
        return 0
    return zlib.crc32("\x00".join(parts).encode("utf-8")) & 0x7FFFFFFF
