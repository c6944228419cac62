"""A wide verify window for small batches, SGLang's ``steps + 1`` for large ones (option ``narrow_above``).

A wide window pays off only while the verify forward is memory-bound: every request runs the whole window
whichever chain it takes (``README.md``, "Fixed window"). ``WindowSwitch`` keeps two of SGLang's own runtime
states, the one the worker started with (the wide window) and one built for ``steps + 1`` with
``EAGLEWorkerV2.build_adaptive_runtime_state`` (its draft and target attention backends and CUDA graphs,
captured for the batch sizes above ``narrow_above`` only), and swaps between them by batch size at the start
of each decode step, through ``EAGLEWorkerV2.activate_step_by_batch`` (SGLang's own per-batch hook of its
adaptive mode).

Two details of SGLang 0.5.23 (both declared in ``hooks.py``):

* ``apply_runtime_state`` returns early unless ``speculative_num_steps`` changes (its adaptive states differ in
  steps); ours differ only in the window, so :meth:`WindowSwitch._apply` presents a steps count that differs.
* The scheduler reserves KV for ``max_speculative_num_draft_tokens()``, the largest window published at
  start-up, so a batch scheduled under one state can run under the other.

The switch is host-side: the batch size is known on the host, nothing is read from the device.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_hybrid")


class WindowSwitch:
    """Two runtime states of an EAGLE-family V2 worker: its initial (wide) window and ``steps + 1``."""

    def __init__(self, worker, narrow_above: int, all_batch_sizes: bool = False) -> None:
        from sglang.srt.runtime_context import get_exec
        from sglang.srt.speculative import eagle_worker_v2 as w2
        from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState

        self.worker = worker
        self.narrow_above = int(narrow_above)
        self.switches = 0
        dw = worker._draft_worker
        tm = worker._target_worker.model_runner
        self.wide = SpecRuntimeState(
            speculative_num_steps=worker.speculative_num_steps,
            speculative_num_draft_tokens=worker.speculative_num_draft_tokens,
            draft_attn_backend=dw.draft_attn_backend,
            cuda_graph_runner=dw.cuda_graph_runner,
            target_attn_backend=tm.attn_backend,
            target_graph_runner=tm.decode_cuda_graph_runner,
            draft_extend_attn_backend=dw.draft_extend_attn_backend,
            cuda_graph_runner_for_draft_extend=dw.cuda_graph_runner_for_draft_extend,
        )
        graphs_off = w2.check_cuda_graph_backend(w2.Phase.DECODE, w2.Backend.DISABLED)
        # The narrow state's graphs: the batch sizes above the threshold, or all of them when it moves (auto).
        graph_bs = None if graphs_off else [b for b in get_exec().graph.cuda_graph_bs_decode
                                            if all_batch_sizes or b > self.narrow_above]
        steps = worker.speculative_num_steps
        with (
            w2.draft_tp_context(dw.parallel_layout),
            w2.speculative_moe_backend_context(),
            w2.speculative_moe_a2a_backend_context(),
        ):
            self.narrow = worker.build_adaptive_runtime_state(
                speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1, cuda_graph_bs=graph_bs,
            )
        logger.info(
            "HYBRID_SPARK: verify window %d for batches of up to %d requests, %d above (CUDA graphs for %s)",
            self.wide.speculative_num_draft_tokens, self.narrow_above, steps + 1,
            "no batch size" if graph_bs is None else graph_bs,
        )

    def state_for(self, batch_size: int):
        return self.narrow if batch_size > self.narrow_above else self.wide

    def activate(self, batch_size: int) -> None:
        """Switch to the state for this batch size (called at the start of every decode step)."""
        if batch_size <= 0:
            return
        state = self.state_for(batch_size)
        if state.speculative_num_draft_tokens != self.worker.speculative_num_draft_tokens:
            self._apply(state)
            self.switches += 1

    def _apply(self, state) -> None:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        w = self.worker
        steps = w.speculative_num_steps
        w.speculative_num_steps = -1  # apply_runtime_state switches only when the steps differ
        try:
            EAGLEWorkerV2.apply_runtime_state(w, state)
        finally:
            w.speculative_num_steps = steps
