"""Every SGLang attribute this plugin overrides or calls, declared in one place and checked at load time.

SGLang moves fast and its speculative-decoding internals are not a stable API. Rather than failing on a GPU
in the middle of serving, the plugin checks at registration that each attribute below exists and still takes
the parameters we pass (by name). On a mismatch it logs one error naming the SGLang version and every
mismatch, and registers nothing, so SGLang keeps working without HYBRID_SPARK.

Add a line here whenever the plugin starts to override or call another SGLang attribute;
``tests/test_plugin_hooks.py`` checks that every method the plugin's classes override is declared here.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

SUPPORTED_SGLANG = "0.5.23"


@dataclass(frozen=True)
class HostAttr:
    """``module:qualname`` of an SGLang attribute, and the parameter names we rely on (in order)."""

    target: str
    params: tuple[str, ...] | None = None  # None: only existence is checked
    why: str = ""

    def resolve(self) -> Any:
        module_name, _, qualname = self.target.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj


_W2 = "sglang.srt.speculative.eagle_worker_v2"
_REG = "sglang.srt.speculative.spec_registry"
_DSP = "sglang.srt.speculative.dspark_components"

HOST_ATTRS: tuple[HostAttr, ...] = (
    # Registration (spec_info / spec_registry).
    HostAttr("sglang.srt.speculative.spec_info:SpeculativeAlgorithm.register",
             ("cls", "name", "supports_overlap", "validate_server_args", "spec_class"), "registers HYBRID_SPARK"),
    HostAttr("sglang.srt.speculative.spec_info:SpeculativeAlgorithm.from_string", ("cls", "name")),
    HostAttr(f"{_REG}:CustomSpecAlgo.__init__",
             ("self", "name", "factory", "supports_overlap", "validate_server_args"), "base of HybridSparkAlgo"),
    HostAttr(f"{_REG}:CustomSpecAlgo.create_worker", ("self", "server_args")),
    HostAttr(f"{_REG}:CustomSpecAlgo.handle_server_args", ("self", "server_args")),
    HostAttr("sglang.srt.speculative.spec_info:SpeculativeAlgorithm.create_future_map",
             ("self", "device", "req_to_token_pool", "needs_cpu_seq_lens", "needs_confidence_relay"),
             "the scheduler calls it on every algorithm; CustomSpecAlgo lacks it"),
    HostAttr("sglang.srt.managers.overlap_utils:FutureMap.__init__",
             ("self", "device", "spec_algo", "req_to_token_pool", "needs_cpu_seq_lens", "needs_confidence_relay")),
    HostAttr("sglang.srt.speculative.spec_info:SpeculativeAlgorithm.carries_draft_hidden_states", ("self",)),
    HostAttr("sglang.srt.speculative.spec_info:SpeculativeAlgorithm.need_topk", ("self",)),
    HostAttr("sglang.srt.speculative.spec_info:SpeculativeAlgorithm.get_platform_worker_cls", ("self",)),
    HostAttr("sglang.srt.speculative.spec_info:SpeculativeAlgorithm.build_disagg_draft_input",
             ("self", "batch", "last_tokens_tensor", "future_map")),
    # The EAGLE-family workers we subclass, and the two methods we wrap.
    HostAttr(f"{_W2}:EAGLEWorkerV2.__init__", ("self", "server_args", "gpu_id", "nccl_port", "target_worker")),
    HostAttr(f"{_W2}:EAGLEWorkerV2.verify", ("self", "batch", "pp_proxy_tensors", "grammar_barrier"),
             "HYBRID_SPARK merges the n-gram chain into the verify input, then records the outcome"),
    HostAttr(f"{_W2}:EAGLEWorkerV2._forward_prefill_batch",
             ("self", "batch", "on_publish", "pp_proxy_tensors", "coordination_plan"),
             "HYBRID_SPARK writes each new request's prompt into the token-history table"),
    HostAttr(f"{_W2}:EAGLEWorkerV2.alloc_memory_pool",
             ("self", "memory_pool_config", "req_to_token_pool", "token_to_kv_pool_allocator"),
             "HYBRID_SPARK sizes its token-history table by the request pool"),
    HostAttr("sglang.srt.speculative.standalone_worker_v2:StandaloneWorkerV2.__init__",
             ("self", "server_args", "gpu_id", "nccl_port", "target_worker")),
    # Verify windows wider than the model chain (wide_chain.py): two AROUND hooks through SGLang's HookRegistry.
    HostAttr("sglang.srt.speculative.base_spec_worker:EagleDraftWorkerBase._rebuild_topk1_chain_buffers", ("self",),
             "builds the draft chain's buffers for steps tokens when the verify window is wider"),
    HostAttr("sglang.srt.speculative.eagle_worker_common:build_eagle_verify_input",
             ("batch", "draft_input", "parent_list", "top_scores_index", "draft_tokens", "draft_probs",
              "target_worker", "topk", "num_steps", "num_draft_tokens", "tree_mask_mode", "device"),
             "pads the model chain to the widened verify window"),
    HostAttr("sglang.srt.plugins.hook_registry:HookRegistry.register", ("cls", "target", "hook", "hook_type")),
    # A wide window for small batches, steps + 1 for large ones (window_switch.py): SGLang's adaptive runtime states.
    HostAttr("sglang.srt.managers.tp_worker:TpModelWorker.forward_batch_generation",
             ("self", "batch", "forward_batch", "pp_proxy_tensors", "is_verify"),
             "wrapped on the EAGLE-family worker's target: after the verify forward (is_verify=True, by keyword in "
             "eagle_worker_common.run_eagle_verify) the exact penalties go onto its logits (penalty_glue.py)"),
    HostAttr("sglang.srt.speculative.eagle_worker_common:run_eagle_verify", None,
             "EAGLEWorkerV2.verify's target forward and eagle_sample, which adds acc_*_penalties (made neutral on the "
             "rows whose exact penalties we apply)"),
    HostAttr(f"{_W2}:EAGLEWorkerV2.init_cuda_graphs", ("self",), "builds the narrow state after SGLang's capture"),
    HostAttr(f"{_W2}:EAGLEWorkerV2.activate_step_by_batch", ("self", "batch_size"),
             "called by SGLang at the start of every decode step: picks the window for the batch size"),
    HostAttr(f"{_W2}:EAGLEWorkerV2.build_adaptive_runtime_state",
             ("self", "speculative_num_steps", "speculative_num_draft_tokens", "cuda_graph_bs")),
    HostAttr(f"{_W2}:EAGLEWorkerV2.apply_runtime_state", ("self", "state"),
             "returns early unless speculative_num_steps changes: WindowSwitch presents a different count"),
    HostAttr("sglang.srt.speculative.adaptive_runtime_state:SpecRuntimeState",
             ("speculative_num_steps", "speculative_num_draft_tokens", "draft_attn_backend", "cuda_graph_runner",
              "target_attn_backend", "target_graph_runner", "draft_extend_attn_backend",
              "cuda_graph_runner_for_draft_extend")),
    HostAttr(f"{_W2}:draft_tp_context"),
    HostAttr(f"{_W2}:speculative_moe_backend_context"),
    HostAttr(f"{_W2}:speculative_moe_a2a_backend_context"),
    HostAttr(f"{_W2}:check_cuda_graph_backend"),
    HostAttr(f"{_W2}:Phase.DECODE"),
    HostAttr(f"{_W2}:Backend.DISABLED"),
    HostAttr("sglang.srt.runtime_context:max_speculative_num_draft_tokens", (),
             "the scheduler reserves KV for the widest window, so a batch may switch state after scheduling"),
    HostAttr(f"{_REG}:CustomSpecAlgo.resolve_max_speculative_num_draft_tokens", ("self", "server_args"),
             "returns the start-up (widest) window, which WindowSwitch never exceeds"),
    # The DSpark worker we subclass (dspark_worker.py), the methods we wrap, and what the merge reads and rewrites.
    HostAttr(f"{_DSP}.dspark_worker_v2:DSparkWorkerV2.__init__",
             ("self", "server_args", "gpu_id", "nccl_port", "target_worker", "draft_worker_cls"),
             "HybridDSparkWorker wraps its draft proposer after construction"),
    HostAttr(f"{_DSP}.dspark_worker_v2:DSparkWorkerV2._forward_decode",
             ("self", "batch", "on_publish", "grammar_barrier", "coordination_plan"),
             "calls self._proposer.propose, then the planner on proposal.confidence; we record after it"),
    HostAttr(f"{_DSP}.dspark_worker_v2:DSparkWorkerV2._forward_prefill", ("self", "batch", "on_publish",
             "pp_proxy_tensors"), "HYBRID_SPARK writes each new request's prompt into the token history"),
    HostAttr(f"{_DSP}.dspark_worker_v2:DSparkWorkerV2.alloc_memory_pool",
             ("self", "memory_pool_config", "req_to_token_pool", "token_to_kv_pool_allocator")),
    HostAttr(f"{_DSP}.dspark_draft:DraftBlockProposer.propose",
             ("self", "batch", "draft_input", "verify_window", "bs", "device", "target_model", "sampling_info"),
             "the wrapped proposer; _forward_decode passes these by keyword"),
    HostAttr(f"{_DSP}.dspark_verify:TargetVerifyExecutor.accept_and_finalize",
             ("self", "folded_accept", "bs", "verify_ids_2d", "target_logits", "draft_block", "sampling_info"),
             "wrapped on the worker's executor: the penalties and logit_bias are applied to target_logits first "
             "(penalties.py); _forward_decode passes these by keyword"),
    HostAttr(f"{_DSP}.dspark_draft:DraftProposal.__struct_fields__", None,
             "draft_block, confidence, folded and verify_ids are replaced (msgspec.structs.replace)"),
    HostAttr(f"{_DSP}.dspark_draft:DraftBlockResult.__struct_fields__", None,
             "draft_tokens replaced; corrected_logits made one-hot on n-gram rows when sampling"),
    HostAttr(f"{_DSP}.dspark_planner:DSparkVerifyPlanner.mode_value", None, "static / cap-accept / compact"),
    HostAttr(f"{_DSP}.dspark_sps:build_uninitialized_sps_table", ("max_batch_tokens",),
             "SGLang's default (flat) SPS table, priced by the selection when no table is given"),
    HostAttr("sglang.srt.speculative.spec_info:SpeculativeAlgorithm.get_num_tokens_per_req_for_target_verify",
             ("self", "num_draft_tokens", "is_draft_worker"), "the DSpark draft worker verifies window - 1 rows"),
    HostAttr("sglang.srt.managers.overlap_utils:decide_needs_confidence_relay", None,
             "relays DSpark's (our merged) confidences to the next steps' budget when is_dspark()"),
    # DSpark on CPU (cpu_compat.py fixes 3-5; CPU only).
    HostAttr("sglang.srt.arg_groups.speculative_hook:_handle_dspark", ("server_args",),
             "built-in DSPARK's device gate (only the CPU baseline needs it)"),
    HostAttr("sglang.srt.arg_groups.speculative_hook:resolving_view", None, "swapped while _handle_dspark runs"),
    HostAttr("sglang.srt.layers.attention.triton_backend:TritonAttnBackend.init_forward_metadata",
             ("self", "forward_batch"), "ragged target verify reads the layout's qo_indptr"),
    # Fields of the verify input we rewrite (dataclass fields; existence checked on the class annotations).
    HostAttr("sglang.srt.speculative.eagle_info:EagleVerifyInput.__dataclass_fields__"),
    # Runtime config bags read by the worker.
    HostAttr("sglang.srt.runtime_context:get_spec", ()),
    # Metrics (observability.py): wrapped in the scheduler process when a HYBRID_SPARK worker is built.
    HostAttr("sglang.srt.managers.scheduler_components.internal_state:"
             "SchedulerInternalStateController._add_speculative", ("self", "state"), "/server_info metrics"),
    HostAttr("sglang.srt.managers.scheduler_components.metrics_reporter:SchedulerMetricsReporter.update_spec_metrics",
             ("self", "bs", "num_correct_drafts", "num_accept_tokens"),
             "keeps spec_num_accept_tokens / spec_num_forward_ct (+ spec_total_*), read for avg_spec_accept_length"),
    HostAttr("sglang.srt.managers.scheduler_components.output_streamer:"
             "SchedulerOutputStreamer.build_additional_customized_info", ("self", "reqs"), "per-request meta_info"),
    HostAttr("sglang.srt.managers.scheduler_components.output_streamer:"
             "SchedulerOutputStreamer.has_additional_customized_info"),
    # CPU compatibility fix (only applied on CPU).
    HostAttr("sglang.srt.speculative.eagle_utils:default_tree_mask_mode"),
)

# Fields of EagleVerifyInput / the DSpark proposal / GenerationBatchResult the workers read or write.
VERIFY_INPUT_FIELDS = ("draft_token", "retrieve_next_token", "spec_steps", "topk", "draft_token_num")
DSPARK_PROPOSAL_FIELDS = ("draft_block", "confidence", "folded", "verify_ids")
DSPARK_BLOCK_FIELDS = ("draft_tokens", "corrected_logits", "greedy_draft")
RESULT_FIELDS = ("next_token_ids", "accept_lens", "cap_lens")
# Fields of the scheduler's Req that name a request's tenant (common.tenant_id, option tenant_key): parameters of
# Req.__init__ stored under the same names. tenant_id reads them with getattr, so a rename would silently make
# every request tenant 0; checked here instead.
REQ_TENANT_FIELDS = ("extra_key", "cache_salt", "routing_key")
# What the DSpark worker's penalties read (dspark_worker.py, penalties.py): the SamplingBatchInfo tensors that say a
# batch has a penalizer on (carries_penalties; besides the field penalizer_orchestrator), its logit_bias, and the
# per-request parameters of SamplingParams (fields of the msgspec struct). They are read by name, so a rename would
# silently drop a request's penalties; checked here instead.
SAMPLING_PENALTY_FIELDS = ("acc_additive_penalties", "acc_scaling_penalties")
SAMPLING_PARAMS_PENALTY_FIELDS = ("frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
                                  "stop_token_ids")


def check_host_api() -> list[str]:
    """Return one line per mismatch between the declarations above and the installed SGLang (empty = ok)."""
    problems: list[str] = []
    for attr in HOST_ATTRS:
        try:
            obj = attr.resolve()
        except Exception as e:  # noqa: BLE001 - any import/attribute failure is a mismatch
            problems.append(f"{attr.target}: missing ({type(e).__name__}: {e})")
            continue
        if attr.params is None:
            continue
        try:
            names = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError) as e:
            problems.append(f"{attr.target}: no inspectable signature ({e})")
            continue
        if names[: len(attr.params)] != attr.params and not _bound_matches(names, attr.params):
            problems.append(f"{attr.target}: parameters {names}, expected to start with {attr.params}")
    try:
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        missing = [f for f in VERIFY_INPUT_FIELDS if f not in EagleVerifyInput.__dataclass_fields__]
        if missing:
            problems.append(f"EagleVerifyInput lacks fields {missing}")
    except Exception as e:  # noqa: BLE001
        problems.append(f"EagleVerifyInput: {type(e).__name__}: {e}")
    try:
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.speculative.dspark_components.dspark_draft import DraftBlockResult, DraftProposal

        for cls, wanted in ((DraftProposal, DSPARK_PROPOSAL_FIELDS), (DraftBlockResult, DSPARK_BLOCK_FIELDS)):
            missing = [f for f in wanted if f not in cls.__struct_fields__]
            if missing:
                problems.append(f"{cls.__name__} lacks fields {missing}")
        missing = [f for f in RESULT_FIELDS if f not in GenerationBatchResult.__dataclass_fields__]
        if missing:
            problems.append(f"GenerationBatchResult lacks fields {missing}")
    except Exception as e:  # noqa: BLE001
        problems.append(f"DSpark proposal / GenerationBatchResult: {type(e).__name__}: {e}")
    try:
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

        from sglang.srt.sampling.sampling_params import SamplingParams

        missing = [f for f in SAMPLING_PENALTY_FIELDS + ("penalizer_orchestrator", "logit_bias")
                   if f not in SamplingBatchInfo.__dataclass_fields__]
        if missing:
            problems.append(f"SamplingBatchInfo lacks fields {missing} (dspark_worker._hybrid_penalise)")
        missing = [f for f in SAMPLING_PARAMS_PENALTY_FIELDS if f not in SamplingParams.__struct_fields__]
        if missing:
            problems.append(f"SamplingParams lacks fields {missing} (penalties.is_penalised)")
    except Exception as e:  # noqa: BLE001
        problems.append(f"SamplingBatchInfo / SamplingParams: {type(e).__name__}: {e}")
    try:
        from sglang.srt.managers.schedule_batch import Req

        missing = [f for f in REQ_TENANT_FIELDS if f not in inspect.signature(Req.__init__).parameters]
        if missing:
            problems.append(f"Req.__init__ lacks parameters {missing} (the tenant of option tenant_key)")
        from sglang.srt.managers.schedule_batch import ReqKvInfo

        if ("req_pool_idx" not in ReqKvInfo.__dataclass_fields__ or not callable(getattr(Req, "finished", None))
                or "eos_token_ids" not in inspect.signature(Req.__init__).parameters):
            problems.append("Req.kv.req_pool_idx, Req.finished() or Req's eos_token_ids is gone (penalties.py: "
                            "the penalised requests' rows and min_new_tokens' stop tokens)")
    except Exception as e:  # noqa: BLE001
        problems.append(f"Req: {type(e).__name__}: {e}")
    return problems


def _bound_matches(names: tuple[str, ...], expected: tuple[str, ...]) -> bool:
    # Class methods resolved through the class come back bound: their signature drops "cls".
    return expected and expected[0] in ("cls",) and names[: len(expected) - 1] == expected[1:]


def sglang_version() -> str:
    try:
        import sglang

        return getattr(sglang, "__version__", "unknown")
    except Exception:  # noqa: BLE001
        return "not importable"
