"""The HYBRID_SPARK workers: SGLang's EAGLE V2 / stand-alone V2 workers plus the n-gram chain.

Five methods of the host worker are wrapped (all declared in ``hooks.py``); ``init_cuda_graphs`` and
``activate_step_by_batch`` only for ``narrow_above`` (``window_switch.py``). The other three:

* ``alloc_memory_pool``: once SGLang has sized the request pool, the device state is built (one token-history
  row per request-pool slot, buffers for the largest batch).

* ``_forward_prefill_batch``: after the target prefill, each request's prompt (and the first sampled token)
  is written into its request-pool slot of the token-history table. Chunked prefill re-writes the row at every
  chunk; prefix-cache hits need nothing special (the full prompt is on the host); a retracted request is
  re-prefilled with its prompt plus the output so far. A slot that is reused starts from a fresh row, so a
  finished or aborted request's history can never leak into its successor.
* ``verify``: between the draft and the target verify, the n-gram lookup, calibration and price-based
  selection replace each request's draft chain by the chosen chain (same chain topology, so the tree mask,
  positions and KV plan are untouched) and cap its verify length by unlinking ``retrieve_next_token`` past
  it. When the verify window is wider than the model chain (``wide_chain.py``), the model chain fills its
  first ``gamma`` columns and an n-gram chain may use all of them. SGLang's own greedy / sampling verification
  then accepts a prefix, so output is unchanged at temperature 0 and the target distribution is kept when
  sampling (the drafts are deterministic). After verify, the committed tokens are appended to the history and
  the statistics updated, all on the device.

The draft model's state update (draft extend) runs unchanged from the accepted prefix, whichever drafter
proposed it.

Sampling penalties (``penalties.py``, ``penalty_glue.py``): SGLang's EAGLE verify applies them "relaxed" (the
output's accumulated penalties at every window position). For requests holding a penalty row, ``verify`` sets
those accumulated tensors' rows to neutral and the target worker's ``forward_batch_generation`` (wrapped on this
instance) puts the exact per-position penalties on the verify logits before SGLang's ``eagle_sample`` reads them.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

from ..memory import tensors_added
from ..step import HybridStep
from .common import load_options, report_device_memory, write_prefill_history
from .penalty_glue import WorkerPenalties

logger = logging.getLogger("sglang_hybrid")


class HybridMixin:
    """Adds the n-gram chain and the price-based choice to an EAGLE-family V2 worker."""

    hybrid: HybridStep

    def _hybrid_init(self) -> None:
        """At construction: read and validate the options and the calibration table (errors surface at start-up)."""
        self._hybrid_cfg, self._hybrid_calib = load_options()
        self.hybrid = None
        self._hybrid_switch = None
        self._hybrid_auto = None
        self._penalties = None
        self._pen_verify_ids = None  # set for the target's verify forward of a step with penalised requests

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        """Once SGLang has sized the request pool: build the device state (one history row per pool slot)."""
        super().alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        from sglang.srt.runtime_context import get_spec

        cfg = self._hybrid_cfg
        pool = req_to_token_pool if req_to_token_pool is not None else self.target_worker.model_runner.req_to_token_pool
        num_slots = int(pool.req_to_token.shape[0])
        context_len = int(self.target_worker.model_runner.model_config.context_len)
        width = cfg.history_width or context_len
        gamma = int(self.speculative_num_steps)
        window = int(self.speculative_num_draft_tokens) - 1  # > gamma: widened for long n-gram chains
        max_bs = num_slots
        if get_spec().speculative_dspark_sps_table_path and cfg.narrow_above >= 0:
            # An SPS budget trades verify tokens for step time; this verify runs the whole window for every
            # request whatever is chosen, so capping verify lengths would only lose accepted tokens.
            logger.warning(
                "HYBRID_SPARK: --speculative-dspark-sps-table-path is ignored with an EAGLE-family draft model: "
                "its verify window is fixed, so the batch budget never binds (each request takes its better chain); "
                "with SGLANG_HYBRID_NARROW_ABOVE=auto it sets the window switch's threshold"
            )
        self.hybrid = HybridStep(
            cfg, num_slots=num_slots, width=width, gamma=gamma, max_bs=max_bs, device=self.device,
            calibration=self._hybrid_calib, max_context_len=context_len, verify_window=window,
        )
        from .wide_chain import pads, reserve

        if window > gamma:
            reserve(self.device, window, max_bs)
        own = set(vars(self))  # the worker's buffers are what it gains from here on (memory.tensors_added)
        self._hybrid_cols = torch.arange(window + 1, dtype=torch.int32, device=self.device).view(1, -1)
        self._hybrid_unlink = torch.zeros(max_bs, window + 1, dtype=torch.bool, device=self.device)
        from ..graphs import for_serving
        from ..warmup import warm_up_for_serving
        from .observability import install

        def warm_inputs(bs: int) -> dict:  # as verify() passes them: int64 slots, a slice of the draft tokens
            tokens = torch.zeros(bs, window + 1, dtype=torch.int64, device=self.device)
            return {"slots": torch.arange(bs, dtype=torch.int64, device=self.device),
                    "model_tokens": tokens[:, 1 : 1 + gamma], "window": window}

        warm_up_for_serving(self.hybrid, warm_inputs)
        self._hybrid_calls = for_serving(self.hybrid)  # the step, or its CUDA-graph replay (step_graphs)
        vocab = int(self.target_worker.model_runner.model_config.vocab_size)
        self._penalties = WorkerPenalties(cfg.penalty_rows, num_slots, vocab, self.device, self.hybrid._guard, "EAGLE")
        self._hybrid_wrap_target_verify_forward()
        report_device_memory(self.hybrid, penalties=self._penalties.table, **{
            "worker buffers": tensors_added(self, own),
            "wide-chain pads": pads()})
        install(self.hybrid, extra=self._penalties.metrics)
        logger.info(
            "HYBRID_SPARK ready: %d slots x %d history tokens, gamma=%d, verify window %d, n-gram %s",
            num_slots, width, gamma, window, self.hybrid.ngram_cfg,
        )

    def _hybrid_wrap_target_verify_forward(self) -> None:
        """The target worker's ``forward_batch_generation`` (this instance's): after the verify forward of a step with
        penalised requests, their penalties go onto its logits, before SGLang's ``eagle_sample`` reads them."""
        target = self.target_worker
        forward = target.forward_batch_generation

        def forward_batch_generation(*args, **kwargs):
            out = forward(*args, **kwargs)
            if self._pen_verify_ids is not None and kwargs.get("is_verify"):
                ids, self._pen_verify_ids = self._pen_verify_ids, None
                self._penalties.apply(out.logits_output.next_token_logits, ids)
            return out

        target.forward_batch_generation = forward_batch_generation

    def init_cuda_graphs(self):
        """After SGLang's capture: with ``narrow_above`` and a widened window, build the narrow runtime state."""
        super().init_cuda_graphs()
        cfg = self._hybrid_cfg
        if cfg.narrow_above != 0 and self.speculative_num_draft_tokens > self.speculative_num_steps + 1:
            from .window_switch import WindowSwitch

            threshold = cfg.narrow_above
            if threshold < 0:  # auto: from the SPS table, then from the acceptance measured under each window
                from sglang.srt.runtime_context import get_spec

                from .auto_narrow import AutoNarrowDriver

                steps = int(self.speculative_num_steps)
                self._hybrid_auto = AutoNarrowDriver(
                    self.hybrid, sps_path=get_spec().speculative_dspark_sps_table_path,
                    wide_tokens=int(self.speculative_num_draft_tokens), narrow_tokens=steps + 1, gamma=steps,
                    model_prior=cfg.model_prior, max_batch_size=self.hybrid.max_bs)
                threshold = self._hybrid_auto.threshold
                logger.info("HYBRID_SPARK: narrow_above auto = %d at start-up (SPS table %s)", threshold,
                            self._hybrid_auto.sps_source)
            self._hybrid_switch = WindowSwitch(self, threshold, all_batch_sizes=self._hybrid_auto is not None)

    def activate_step_by_batch(self, batch_size: int) -> None:
        """SGLang's per-decode-step hook: pick the verify window for this batch size (host-side)."""
        super().activate_step_by_batch(batch_size)
        if self._hybrid_switch is not None:
            if self._hybrid_auto is not None and batch_size > 0:
                self._hybrid_auto.before_step(self._hybrid_switch, batch_size)
            self._hybrid_switch.activate(batch_size)

    # -- prefill ---------------------------------------------------------------------------------------
    def _forward_prefill_batch(self, batch, on_publish=None, pp_proxy_tensors=None, coordination_plan=None):
        out = super()._forward_prefill_batch(batch, on_publish, pp_proxy_tensors, coordination_plan)
        write_prefill_history(self.hybrid, batch, out.next_token_ids, self.device)
        self._penalties.on_prefill(batch, out.next_token_ids)
        return out

    # -- decode ------------------------------------------------------------------------------------------
    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        vi = batch.spec_info
        hy = self.hybrid
        n = vi.draft_token_num  # the verify window, root included (narrower when WindowSwitch narrowed it)
        active = not batch.forward_mode.is_idle() and vi.topk == 1 and hy.gamma + 1 <= n <= hy.verify_window + 1
        proposal = None
        if active:
            bs = batch.req_pool_indices.shape[0]
            tokens = vi.draft_token.view(bs, n)
            proposal = self._hybrid_calls.propose(batch.req_pool_indices, tokens[:, 1 : 1 + hy.gamma], window=n - 1)
            tokens[:, 1 : 1 + proposal.tokens.shape[1]].copy_(proposal.tokens)
            # Cap each request's acceptance at its verify length: unlink the chain after node verify_len.
            unlink = self._hybrid_unlink[:bs, :n]
            torch.ge(self._hybrid_cols[:, :n], proposal.verify_len.view(-1, 1), out=unlink)
            vi.retrieve_next_token.masked_fill_(unlink, -1)
        pen = self._penalties
        pen.begin_step(batch)
        if pen.rows and active:  # exact penalties on these rows (penalties.py) instead of SGLang's relaxed ones
            pen.take_over_relaxed(batch.sampling_info)
            self._pen_verify_ids = vi.draft_token.view(-1, n)
        elif pen.rows:
            pen.note_unapplied("an idle batch or a verify window the selection does not cover")
            pen.rows = []
        out = super().verify(batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier)
        if self._pen_verify_ids is not None:  # no verify forward (is_verify=True) took them: SGLang changed
            self._pen_verify_ids = None
            pen.note_unapplied("the target's verify forward was not seen (is_verify=True)")
        pen.commit(batch, out.next_token_ids, out.accept_lens)
        if proposal is not None:
            bs = batch.req_pool_indices.shape[0]
            committed = out.next_token_ids.view(bs, -1)
            self._hybrid_calls.record(batch.req_pool_indices, proposal, committed, out.accept_lens)
            if self.hybrid.should_log():
                logger.info("HYBRID_SPARK metrics %s", self.hybrid.metrics())
        return out

    def hybrid_metrics(self) -> dict:
        m = self.hybrid.metrics()
        m.update(self._penalties.metrics())
        return m


class HybridEagleWorker(HybridMixin, EAGLEWorkerV2):
    """HYBRID_SPARK with an EAGLE / EAGLE-3 chain draft head."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self._hybrid_init()


class HybridStandaloneWorker(HybridMixin, StandaloneWorkerV2):
    """HYBRID_SPARK with a small stand-alone draft model."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self._hybrid_init()
