"""``HybridSparkAlgo``: the algorithm object SGLang's scheduler, model runner and workers dispatch on.

SGLang 0.5.23's ``CustomSpecAlgo`` lacks several methods the scheduler calls on every algorithm
(``create_future_map``, ``need_topk``, ``carries_draft_hidden_states``, ``get_platform_worker_cls``,
``build_disagg_draft_input``); this class supplies them and joins the built-in EAGLE-family branches
according to the draft model: ``is_eagle()``/``is_eagle3()`` for an EAGLE / EAGLE-3 head, ``is_standalone()``
for a small stand-alone draft model, ``is_dspark()``/``is_dflash_family()`` for a DSpark block drafter (these
switch on the target's hidden-state capture, the draft logits rows, the confidence relay of the overlap scheduler
and the ragged-verify graphs, as for SGLang's own DSPARK).

The draft kind is resolved once in the launching process (``handle_server_args``) and handed to the spawned
scheduler processes through the environment variable ``SGLANG_HYBRID_RESOLVED_DRAFT_KIND``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from ..config import HybridConfig, HybridConfigError

logger = logging.getLogger("sglang_hybrid")

ALGO_NAME = "HYBRID_SPARK"
RESOLVED_KIND_ENV = "SGLANG_HYBRID_RESOLVED_DRAFT_KIND"
SUPPORTED_KINDS = ("eagle", "eagle3", "standalone", "dspark")
DEFAULT_NUM_STEPS = 3


def detect_draft_kind(draft_model_path: Optional[str]) -> str:
    """Classify a draft model by the ``architectures`` in its ``config.json`` (a local directory)."""
    if not draft_model_path:
        raise HybridConfigError(
            f"--speculative-algorithm {ALGO_NAME} needs --speculative-draft-model-path "
            "(a DSpark, EAGLE, EAGLE-3 or small stand-alone draft model)"
        )
    cfg_file = os.path.join(draft_model_path, "config.json")
    if not os.path.isfile(cfg_file):
        raise HybridConfigError(
            f"cannot detect the draft model kind: {cfg_file} not found; set SGLANG_HYBRID_DRAFT_KIND to one of "
            f"{SUPPORTED_KINDS} (or dspark)"
        )
    try:
        with open(cfg_file, encoding="utf-8") as f:
            archs = " ".join(json.load(f).get("architectures") or [])
    except (OSError, json.JSONDecodeError) as e:
        raise HybridConfigError(f"cannot read the draft model config {cfg_file}: {e}") from None
    low = archs.lower()
    if "dspark" in low:
        return "dspark"
    if "eagle3" in low:
        return "eagle3"
    if "eagle" in low or "mtp" in low or "nextn" in low:
        return "eagle"
    return "standalone"


def validate_and_resolve(args: Any, cfg: HybridConfig) -> str:
    """Check the server arguments HYBRID_SPARK cannot run with; return the resolved draft kind."""
    kind = cfg.draft_kind if cfg.draft_kind != "auto" else detect_draft_kind(args.speculative_draft_model_path)
    if kind not in SUPPORTED_KINDS:
        raise HybridConfigError(f"{ALGO_NAME}: unsupported draft kind {kind!r}")
    topk = getattr(args, "speculative_eagle_topk", None)
    if topk not in (None, 1):
        raise HybridConfigError(
            f"{ALGO_NAME} drafts chains: --speculative-eagle-topk must be 1 (tree drafting with topk > 1 "
            f"is not supported), got {topk}"
        )
    if int(getattr(args, "pp_size", 1) or 1) > 1:
        raise HybridConfigError(f"{ALGO_NAME} does not support pipeline parallelism (--pp-size > 1)")
    if getattr(args, "enable_dp_attention", False):
        raise HybridConfigError(f"{ALGO_NAME} does not support data-parallel attention (--enable-dp-attention)")
    if getattr(args, "disaggregation_mode", "null") not in (None, "null"):
        raise HybridConfigError(f"{ALGO_NAME} does not support PD disaggregation (--disaggregation-mode)")
    if getattr(args, "speculative_adaptive", False):
        raise HybridConfigError(f"{ALGO_NAME} does not support --speculative-adaptive")
    if getattr(args, "enable_multi_layer_eagle", False):
        raise HybridConfigError(f"{ALGO_NAME} does not support --enable-multi-layer-eagle")
    device = getattr(args, "device", None)
    if cfg.step_graphs == "on" and device is not None and not str(device).startswith("cuda"):
        raise HybridConfigError(
            f"sglang-hybrid option 'step_graphs': 'on' replays CUDA graphs and needs --device cuda, got {device}")
    if kind == "dspark":
        return kind  # the window and block checks: dspark_args.resolve_dspark_args
    steps = getattr(args, "speculative_num_steps", None)
    steps = DEFAULT_NUM_STEPS if steps is None else steps
    n_tokens = getattr(args, "speculative_num_draft_tokens", None)
    if steps < 1:
        raise HybridConfigError(f"{ALGO_NAME}: --speculative-num-steps must be >= 1, got {steps}")
    if n_tokens is not None and n_tokens < steps + 1:
        raise HybridConfigError(
            f"{ALGO_NAME} verifies chains: --speculative-num-draft-tokens (the verify window, root included) must be "
            f">= --speculative-num-steps + 1 ({steps + 1}), got {n_tokens}"
        )
    if n_tokens is not None and cfg.max_draft > n_tokens - 1:
        raise HybridConfigError(
            f"sglang-hybrid option 'max_draft' ({cfg.max_draft}) does not fit the verify window "
            f"--speculative-num-draft-tokens {n_tokens} (at most {n_tokens - 1} draft tokens); raise the flag or "
            "leave one of the two unset"
        )
    return kind


def verify_window(steps: int, n_tokens: Optional[int], cfg: HybridConfig) -> int:
    """The verify window (``--speculative-num-draft-tokens``, root included) for a validated configuration.

    The flag wins when given; else ``max(steps, max_draft) + 1``, so ``max_draft`` larger than the model chain
    widens the window for long n-gram copies (see ``wide_chain.py``), and the default (``max_draft = 0``) keeps
    SGLang's ``steps + 1``.
    """
    if n_tokens is not None:
        return int(n_tokens)
    return max(steps, cfg.max_draft) + 1


class HybridSparkAlgo(CustomSpecAlgo):
    """The HYBRID_SPARK algorithm: a DSpark or EAGLE-family drafter plus the on-device n-gram drafter."""

    def _kind(self) -> str:
        kind = getattr(self, "_resolved_kind", None) or os.environ.get(RESOLVED_KIND_ENV)
        if kind:
            return kind
        # A process that did not see handle_server_args (e.g. a test building ServerArgs by hand).
        from sglang.srt.runtime_context import get_spec

        kind = validate_and_resolve(get_spec(), HybridConfig.from_env())
        self._resolved_kind = kind
        return kind

    # --- predicates SGLang dispatches on -------------------------------------------------------------
    def is_eagle(self) -> bool:
        return self._kind() in ("eagle", "eagle3")

    def is_dspark(self) -> bool:
        return self._kind() == "dspark"

    def is_dflash_family(self) -> bool:
        return self.is_dspark()

    def supports_ragged_verify(self) -> bool:
        return self.is_dspark()

    def supports_target_verify_for_draft(self) -> bool:
        return self.is_dspark()

    def supports_prefill_shared_read_done(self) -> bool:
        # DSpark injects the draft KV after the target prefill, on locations computed before it (as DSPARK).
        return self.is_dspark()

    def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
        if self.is_dspark() and is_draft_worker:
            return num_draft_tokens - 1
        return num_draft_tokens

    def is_eagle3(self) -> bool:
        return self._kind() == "eagle3"

    def is_standalone(self) -> bool:
        return self._kind() == "standalone"

    def need_topk(self) -> bool:
        return not self.is_dspark()

    def carries_draft_hidden_states(self) -> bool:
        return self.is_eagle()

    def supports_grammar_overlap(self) -> bool:
        # The EAGLE V2 verify path we reuse advances the grammar FSM behind the scheduler's barrier.
        return True

    def supports_mixed_chunk(self) -> bool:
        return False

    def has_draft_kv(self) -> bool:
        return True

    def get_platform_worker_cls(self) -> Optional[type]:
        return None

    def build_disagg_draft_input(self, batch, last_tokens_tensor, future_map):
        return None

    def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    # --- start-up ------------------------------------------------------------------------------------
    def handle_server_args(self, server_args) -> None:
        """Validate and fill defaults. ``server_args`` is SGLang's recording stand-in: write fields directly."""
        cfg = HybridConfig.from_env()
        kind = validate_and_resolve(server_args, cfg)
        self._resolved_kind = kind
        os.environ[RESOLVED_KIND_ENV] = kind  # inherited by the spawned scheduler processes
        if kind == "dspark":
            from .dspark_args import resolve_dspark_args

            gamma = resolve_dspark_args(server_args, cfg)
            logger.info(
                "%s: DSpark draft model, block %d, verify window %d, options %s",
                ALGO_NAME, gamma, server_args.speculative_num_draft_tokens, cfg.to_dict(),
            )
            return
        steps = server_args.speculative_num_steps
        if steps is None:
            steps = DEFAULT_NUM_STEPS
            server_args.speculative_num_steps = steps
        server_args.speculative_eagle_topk = 1
        server_args.speculative_num_draft_tokens = verify_window(steps, server_args.speculative_num_draft_tokens, cfg)
        if server_args.max_running_requests is None:
            server_args.max_running_requests = 48
        server_args.enable_mixed_chunk = False
        logger.info(
            "%s: %s draft model, %d draft steps, verify window %d, options %s",
            ALGO_NAME, kind, steps, server_args.speculative_num_draft_tokens, cfg.to_dict(),
        )


def worker_factory(server_args) -> type:
    """SGLang asks the registered factory for the worker class."""
    algo_kind = os.environ.get(RESOLVED_KIND_ENV)
    if algo_kind is None:
        algo_kind = validate_and_resolve(server_args, HybridConfig.from_env())
    if algo_kind == "dspark":
        from .dspark_worker import HybridDSparkWorker

        return HybridDSparkWorker
    from .worker import HybridEagleWorker, HybridStandaloneWorker

    return HybridStandaloneWorker if algo_kind == "standalone" else HybridEagleWorker
