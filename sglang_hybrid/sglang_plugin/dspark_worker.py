"""HYBRID_SPARK on a DSpark drafter: SGLang's ``DSparkWorkerV2`` plus the n-gram chain, under DSpark's budget.

Where it hooks in (every attribute is declared in ``hooks.py``):

* ``__init__``: after SGLang builds the worker, its draft proposer (``self._proposer``, a
  ``DraftBlockProposer``) is wrapped by :class:`HybridProposer`. ``DSparkWorkerV2._forward_decode`` calls
  ``self._proposer.propose(...)`` and then hands ``proposal.confidence`` to its planner
  (``resolve_verify_token_budget`` / ``schedule_layout``) and ``proposal.draft_block.draft_tokens`` to the
  verify; so the wrapper's return value is exactly "between the proposal and the planner". There it runs the
  n-gram lookup, the calibration and the price-based selection (``HybridStep.propose``, SPS mode with the SPS
  table SGLang's DSPARK uses), and returns a proposal whose tokens are each request's chosen chain and whose
  confidences are that chain's (``HybridStep.planner_confidence``): a request on the model chain keeps DSpark's
  own confidences (lifted on the tokens the history echoes, ``calibration/echo.py``), a request on the n-gram
  chain carries its calibrated per-token acceptance. DSpark's planner
  then sets the batch budget and every request's verify length, unchanged, and its ragged verify (``compact``:
  only ``sum(verify_lens)`` rows reach the target) checks each chain at its own length. The proposal's folded
  verify ids are dropped (``verify_ids=None``, ``folded=False``), so the verify ids are rebuilt from the merged
  tokens and the folded in-graph accept (CUDA graphs only) stays off for these steps.
* Sampling: DSpark's rejection sampling divides by the draft distribution. An n-gram token is a deterministic
  draft, so for a request on the n-gram chain the draft logits rows become one-hot at its tokens (``-inf``
  elsewhere, in place), which makes the acceptance ``min(1, p_target(x) / 1)``: the target distribution is
  kept (the same argument as for EAGLE's deterministic chains). Greedy drafts (``greedy_draft``) are one-hot
  already.
* Penalties: SGLang 0.5.23's DSpark verify adds ``logit_bias`` at every position but applies no frequency,
  presence or repetition penalty, nor ``min_new_tokens``, after a request's first token (it never feeds the output
  tokens to the penalizers, and looks for DFlash's ``acc_linear_penalties``). This worker applies them itself
  (``penalties.py``): the verify executor's ``accept_and_finalize`` is wrapped so that, before the accept, each
  penalised request's logits at verify position ``j`` are penalised with its output's token counts plus the drafts
  at positions ``1..j``, and its stop tokens held back while the output before ``j`` is shorter than
  ``min_new_tokens`` (kept on the device: rows given at prefill, every commit added after the step; the bias is
  taken out and put back, plain decoding's order). Greedy output then equals plain decoding's; sampling draws from
  the penalised distribution. Penalised requests beyond option ``penalty_rows`` decode as on DSPARK (counted in
  ``penalty_steps_unapplied``, warned once). The merge keeps ``folded=False``, so neither the folded accept nor
  the sampling-accept graph (which read the logits inside a CUDA graph) runs.
* ``_forward_prefill``: after SGLang's prefill, each request's prompt starts its token-history row.
* ``_forward_decode``: after SGLang's step, the committed tokens (``next_token_ids``, accepted drafts and bonus at
  the front of each row) are appended to the history and the counters updated, on the device.
* ``alloc_memory_pool``: once SGLang has sized the request pool, the device state is built.

N-gram chains longer than the DSpark block: the verify window is ``max(gamma, max_draft) + 1``
(``dspark_args.py``); SGLang's DSpark worker then drafts ``window - 1`` tokens, and the model chain is the first
``gamma`` of them. Past them DSpark's drafts are replaced by the n-gram tail (``calibration/tail.py``: what the
history holds after the model chain), with its calibrated confidence, 0 where there is none; in sampling mode
those columns' draft logits are one-hot at the tail's tokens too. No SGLang change is needed.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import msgspec
import torch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

from ..memory import tensors_added
from ..step import HybridStep, Proposal
from .common import load_options, load_sps2d, report_device_memory, write_prefill_history
from .dspark_args import check_sps_table, model_chain_gamma
from .penalty_glue import WorkerPenalties

logger = logging.getLogger("sglang_hybrid")


class HybridProposer:
    """Wraps DSpark's ``DraftBlockProposer``: its proposal, with each request's chosen chain merged in."""

    def __init__(self, inner: Any, worker: "HybridDSparkWorker") -> None:
        self._inner = inner
        self._worker = worker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def propose(self, **kwargs: Any):
        proposal = self._inner.propose(**kwargs)
        return self._worker._hybrid_merge(kwargs["batch"], proposal, kwargs.get("sampling_info"))


def _sps_table_for_selection(mode: str, path: Optional[str], max_batch_tokens: int):
    """The SPS table the selection prices with: DSpark's own (``--speculative-dspark-sps-table-path``, else SGLang's
    uninitialized flat table, under which verifying is free and each request simply takes its better chain);
    None in ``static`` mode, where every request verifies the whole window and no budget exists."""
    if mode == "static":
        return None
    table = check_sps_table(path)
    if table is None:
        from sglang.srt.speculative.dspark_components.dspark_sps import build_uninitialized_sps_table

        table = build_uninitialized_sps_table(max_batch_tokens=max_batch_tokens)
    return table


class HybridDSparkWorker(DSparkWorkerV2):
    """HYBRID_SPARK with a DSpark block drafter (confidence head, SPS budget, ragged verify)."""

    hybrid: Optional[HybridStep] = None

    def __init__(self, server_args, gpu_id, nccl_port, target_worker, draft_worker_cls=TpModelWorker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker, draft_worker_cls)
        self._hybrid_cfg, self._hybrid_calib = load_options()
        self.hybrid = None
        self._hybrid_pending: Optional[Proposal] = None
        self._hybrid_last_budget: Optional[int] = None
        self._penalties: Optional[WorkerPenalties] = None
        if self._hosts_draft:
            self._proposer = HybridProposer(self._proposer, self)
            self._model_gamma = model_chain_gamma(server_args, int(self.gamma))
            accept = self._verify_executor.accept_and_finalize

            def accept_and_finalize(**kwargs: Any):
                self._hybrid_penalise(kwargs)
                return accept(**kwargs)

            self._verify_executor.accept_and_finalize = accept_and_finalize

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        super().alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        if not self._hosts_draft:
            return
        from sglang.srt.runtime_context import get_spec

        from ..selection import dense_sps

        cfg = self._hybrid_cfg
        pool = req_to_token_pool if req_to_token_pool is not None else self.model_runner.req_to_token_pool
        num_slots = int(pool.req_to_token.shape[0])
        context_len = int(self.model_runner.model_config.context_len)
        window = int(self.gamma)  # SGLang's gamma: the verify window minus the root
        gamma = self._model_gamma
        max_bs = num_slots
        mode = self._verify_planner.mode_value
        width = max(gamma, min(cfg.max_draft or window, window))
        table = _sps_table_for_selection(mode, get_spec().speculative_dspark_sps_table_path, max_bs * (window + 1))
        sps = None if table is None else dense_sps(table, max_bs * (1 + width), device=self.device)
        self.hybrid = HybridStep(
            cfg, num_slots=num_slots, width=cfg.history_width or context_len, gamma=gamma, max_bs=max_bs,
            device=self.device, calibration=self._hybrid_calib, sps_dense=sps, max_context_len=context_len,
            verify_window=window, sps2d=load_sps2d(cfg),
        )
        self._penalties = WorkerPenalties(cfg.penalty_rows, num_slots, int(self.model_runner.model_config.vocab_size),
                                          self.device, self.hybrid._guard, "DSpark")
        own = set(vars(self))  # the worker's buffers are what it gains from here on (memory.tensors_added)
        self._ctx_tokens = torch.zeros((), dtype=torch.float32, device=self.device)
        dt = torch.int64
        self._merged_tokens = torch.zeros(max_bs, window, dtype=dt, device=self.device)
        self._merged_conf = torch.zeros(max_bs, window, dtype=torch.float32, device=self.device)
        self._full_vlen = torch.full((max_bs,), window, dtype=torch.int32, device=self.device)
        self._verified = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self._one_i32 = torch.ones((), dtype=torch.int32, device=self.device)
        self._onehot_rows = torch.zeros(max_bs, 1, dtype=torch.bool, device=self.device)
        self._onehot_src = torch.zeros(max_bs, window, 1, dtype=torch.float32, device=self.device)
        # With the n-gram tail on, the model rows' columns past the model block are n-gram tokens: one-hot too.
        self._tail_cols = None
        if self.hybrid.tail is not None:
            self._tail_cols = (torch.arange(window, device=self.device) >= gamma).view(1, -1)
            self._onehot_mask = torch.zeros(max_bs, window, dtype=torch.bool, device=self.device)
        from ..graphs import for_serving
        from ..warmup import warm_up_for_serving
        from .observability import install

        def warm_inputs(bs: int) -> dict:  # as _hybrid_merge passes them: int64 slots, slices of DSpark's block
            tokens = torch.zeros(bs, window, dtype=torch.int64, device=self.device)
            conf = torch.full((bs, window), 0.5, dtype=torch.float32, device=self.device)
            return {"slots": torch.arange(bs, dtype=torch.int64, device=self.device), "model_tokens": tokens[:, :gamma],
                    "model_confidence": conf[:, :gamma],
                    "context_tokens": self._ctx_tokens if self.hybrid.sps2d is not None else None}

        warm_up_for_serving(self.hybrid, warm_inputs)
        self._hybrid_calls = for_serving(self.hybrid)  # the step, or its CUDA-graph replay (step_graphs)
        report_device_memory(self.hybrid, penalties=self._penalties.table,
                             **{"worker buffers": tensors_added(self, own)})
        install(self.hybrid, extra=self._hybrid_extra_metrics)
        logger.info(
            "HYBRID_SPARK (DSpark) ready: %d slots, model block %d, verify window %d, verify mode %s, SPS %s, "
            "n-gram %s", num_slots, gamma, window + 1, mode,
            "off (static)" if table is None else (get_spec().speculative_dspark_sps_table_path or "uninitialized"),
            self.hybrid.ngram_cfg,
        )

    # -- the merge, between DSpark's proposal and its planner ------------------------------------------------
    def _hybrid_merge(self, batch, proposal, sampling_info):
        hy = self.hybrid
        if hy is None:
            return proposal
        block = proposal.draft_block
        tokens = block.draft_tokens  # [bs, window]
        bs, g = tokens.shape
        m = self._model_gamma
        conf = proposal.confidence
        ctx = None
        if hy.sps2d is not None:  # the KV tokens this step reads: the 2-D price's context
            ctx = self._ctx_tokens
            torch.sum(batch.seq_lens, 0, dtype=torch.float32, out=ctx)
        chosen = self._hybrid_calls.propose(
            batch.req_pool_indices, tokens[:, :m],
            model_confidence=None if conf is None else conf[:, :m], context_tokens=ctx,
        )
        w = chosen.tokens.shape[1]
        merged64 = self._merged_tokens[:bs, :g]
        merged64[:, :w].copy_(chosen.tokens)
        merged64[:, w:].copy_(tokens[:, w:])  # past the chains: DSpark's own drafts, confidence 0
        merged = merged64 if tokens.dtype == merged64.dtype else merged64.to(tokens.dtype)  # host-known dtype
        new_conf = None
        if conf is not None:
            new_conf = hy.planner_confidence(chosen, conf, self._merged_conf[:bs, :g])
        if (sampling_info is not None and not sampling_info.is_all_greedy and not block.greedy_draft
                and block.corrected_logits is not None):
            self._one_hot_ngram_rows(block.corrected_logits, merged64, chosen.choice)
        self._hybrid_pending = chosen
        return msgspec.structs.replace(
            proposal,
            draft_block=msgspec.structs.replace(block, draft_tokens=merged),
            confidence=new_conf,
            verify_ids=None,
            folded=False,
        )

    # -- penalties (penalties.py, penalty_glue.py) ---------------------------------------------------------
    def _hybrid_penalise(self, kwargs: dict) -> None:
        """Before DSpark's accept: this step's penalised rows' penalties at every verify position, in place on the
        target's logits (which already carry ``logit_bias``: DSpark's verify adds it at every position)."""
        pen = self._penalties
        if pen is None or not pen.rows:
            return
        info = kwargs.get("sampling_info")
        pen.apply(kwargs["target_logits"], kwargs["verify_ids_2d"], bias=None if info is None else info.logit_bias)

    def _one_hot_ngram_rows(self, logits: torch.Tensor, tokens: torch.Tensor, choice: torch.Tensor) -> None:
        """Draft logits of the n-gram tokens: one-hot at their tokens (in place, no allocation beyond a gather
        the size of the tokens). That is every row of a request on the n-gram chain and, with the tail on, the
        model rows' columns past the model block (the tail, or DSpark's own drafts there, which the planner sees
        with confidence 0: a deterministic draft is as valid for the rejection sampling)."""
        bs, g, _ = logits.shape
        rows = self._onehot_rows[:bs]
        torch.eq(choice.view(-1, 1), self._one_i32, out=rows)
        mask = rows.view(bs, 1, 1)
        if self._tail_cols is not None:
            m = self._onehot_mask[:bs, :g]
            torch.logical_or(rows, self._tail_cols[:, :g], out=m)
            mask = m.view(bs, g, 1)
        idx = tokens.view(bs, g, 1)
        keep = self._onehot_src[:bs, :g]
        torch.gather(logits, 2, idx, out=keep)
        logits.masked_fill_(mask, float("-inf"))
        keep.masked_fill_(mask, 0.0)
        logits.scatter_(2, idx, keep)

    # -- prefill and decode ----------------------------------------------------------------------------------
    def _forward_prefill(self, batch, on_publish, pp_proxy_tensors=None):
        out = super()._forward_prefill(batch, on_publish, pp_proxy_tensors)
        if self.hybrid is not None:
            write_prefill_history(self.hybrid, batch, out.next_token_ids, self.device)
            self._penalties.on_prefill(batch, out.next_token_ids)
        return out

    def _forward_decode(self, batch, on_publish, grammar_barrier=None, coordination_plan=None):
        self._hybrid_pending = None
        if self._penalties is not None:
            self._penalties.begin_step(batch)
        out = super()._forward_decode(batch, on_publish, grammar_barrier, coordination_plan)
        if self._penalties is not None:
            self._penalties.commit(batch, out.next_token_ids, out.accept_lens)
        chosen, self._hybrid_pending = self._hybrid_pending, None
        if chosen is not None and self.hybrid is not None:
            bs = batch.req_pool_indices.shape[0]
            verified = self._full_vlen[:bs]
            if out.cap_lens is not None:  # the ragged layout's rows per request, root included
                verified = torch.sub(out.cap_lens, self._one_i32, out=self._verified[:bs])
            self._hybrid_calls.record(batch.req_pool_indices, chosen, out.next_token_ids.view(bs, -1),
                                      out.accept_lens, verified_len=verified)
            budget = getattr(batch.spec_info, "verify_token_budget", None)
            self._hybrid_last_budget = budget if isinstance(budget, int) else None
            if self.hybrid.should_log():
                logger.info("HYBRID_SPARK metrics %s", self.hybrid_metrics())
        return out

    def _hybrid_extra_metrics(self) -> dict:
        return {
            "drafter": "dspark",
            "verify_mode": self._verify_planner.mode_value,
            "verify_token_budget": self._hybrid_last_budget,
            **self._penalties.metrics(),
        }

    def hybrid_metrics(self) -> dict:
        m = self.hybrid.metrics()
        m.update(self._hybrid_extra_metrics())
        return m
