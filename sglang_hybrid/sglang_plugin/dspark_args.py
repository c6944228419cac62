"""Start-up resolution of HYBRID_SPARK on a DSpark draft: what SGLang's ``_handle_dspark`` would set, plus our checks.

A registered algorithm never reaches SGLang's ``arg_groups/speculative_hook.py: _handle_dspark`` (SGLang calls
its ``handle_server_args`` instead), so :func:`resolve_dspark_args` sets what that function sets: one draft
step, topk 1, the verify window and ``max_running_requests``. Every bad configuration is refused here, before
any model loads, with an error naming the option:

* a draft whose ``vocab_size`` differs from the target's (both local ``config.json`` files);
* ``--speculative-dspark-sps-table-path`` that does not parse as SGLang's ``SpsCostTable``;
* a plugin ``max_draft`` below the drafter's block (gamma): the n-gram chain could never compete at full length;
* ``--speculative-num-draft-tokens`` below ``gamma + 1`` (it would cut the model's block).

The verify window (``--speculative-num-draft-tokens``, root included) is ``max(gamma, max_draft) + 1``: SGLang's
DSpark worker takes its gamma from the window (``dspark_config.resolve_runtime_config``), so a window wider than
the checkpoint's block makes the drafter propose ``window - 1`` tokens. The worker keeps only the first
``gamma`` of them as the model chain (past it, DSpark's drafts are replaced by the n-gram tail or get confidence
0), and n-gram chains may fill the whole window. Everything downstream (KV reservation, verify width, accept width, draft KV injection) reads the
window, so no SGLang change is needed for n-gram chains longer than the block.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from ..config import HybridConfig, HybridConfigError

DEFAULT_MAX_RUNNING_REQUESTS = 48


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise HybridConfigError(f"cannot read {what} {path}: {e}") from None
    if not isinstance(data, dict):
        raise HybridConfigError(f"{what} {path} must hold a JSON object")
    return data


def checkpoint_gamma(draft_cfg: dict) -> Optional[int]:
    """The DSpark block size (gamma) a draft ``config.json`` declares, as SGLang's ``parse_dspark_draft_config``
    looks for it (top level, then ``dflash_config`` / ``dspark_config``); None when absent."""
    for holder in (draft_cfg, draft_cfg.get("dflash_config") or {}, draft_cfg.get("dspark_config") or {}):
        value = holder.get("block_size")
        if value is not None:
            return int(value)
    return None


def _check_vocab(args: Any, draft_cfg: dict, draft_path: str) -> None:
    target_cfg_path = os.path.join(str(getattr(args, "model_path", "") or ""), "config.json")
    if not os.path.isfile(target_cfg_path):
        return  # a hub id: SGLang checks the mask token against the target vocabulary at load time
    target = _read_json(target_cfg_path, "the target model config")
    t_vocab = target.get("vocab_size") or (target.get("text_config") or {}).get("vocab_size")
    d_vocab = draft_cfg.get("vocab_size")
    if t_vocab is not None and d_vocab is not None and int(t_vocab) != int(d_vocab):
        raise HybridConfigError(
            f"--speculative-draft-model-path {draft_path}: the DSpark draft's vocab_size ({d_vocab}) differs from "
            f"the target's ({t_vocab}, --model-path {args.model_path}); HYBRID_SPARK needs one vocabulary for "
            "the model chain and the n-gram chain"
        )


def check_sps_table(path: Optional[str]):
    """Parse ``--speculative-dspark-sps-table-path`` now (a bad table fails at start-up, naming the flag)."""
    if not path:
        return None
    from ..selection.sps import SpsTableError, load_sps_table

    try:
        return load_sps_table(path)
    except (SpsTableError, OSError, ValueError) as e:
        raise HybridConfigError(f"--speculative-dspark-sps-table-path {path}: {e}") from None


def resolve_dspark_args(args: Any, cfg: HybridConfig) -> int:
    """Validate and fill the server arguments (SGLang's recording stand-in) for a DSpark draft.

    Returns the model chain length (the checkpoint's gamma)."""
    draft_path = args.speculative_draft_model_path
    draft_cfg = _read_json(os.path.join(draft_path, "config.json"), "the DSpark draft config")
    _check_vocab(args, draft_cfg, draft_path)
    block = getattr(args, "speculative_dspark_block_size", None)
    gamma = int(block) if block is not None else checkpoint_gamma(draft_cfg)
    n_tokens = args.speculative_num_draft_tokens
    if gamma is None:
        if n_tokens is None:
            raise HybridConfigError(
                f"--speculative-draft-model-path {draft_path}: the DSpark draft config declares no block_size; set "
                "--speculative-dspark-block-size (gamma)"
            )
        gamma = int(n_tokens) - 1
    if gamma < 1:
        raise HybridConfigError(f"--speculative-dspark-block-size must be >= 1, got {gamma}")
    if 0 < cfg.max_draft < gamma:
        raise HybridConfigError(
            f"sglang-hybrid option 'max_draft' ({cfg.max_draft}) is below the DSpark block size gamma ({gamma}): "
            f"n-gram chains would be shorter than the model chain; use 0 (fill the window) or >= {gamma}"
        )
    window = max(gamma, cfg.max_draft) + 1
    if n_tokens is not None:
        if int(n_tokens) < gamma + 1:
            raise HybridConfigError(
                f"--speculative-num-draft-tokens ({n_tokens}) is below the DSpark block size + 1 ({gamma + 1}); "
                "HYBRID_SPARK verifies the whole model block"
            )
        if cfg.max_draft > int(n_tokens) - 1:
            raise HybridConfigError(
                f"sglang-hybrid option 'max_draft' ({cfg.max_draft}) does not fit the verify window "
                f"--speculative-num-draft-tokens {n_tokens}"
            )
        window = int(n_tokens)
    check_sps_table(getattr(args, "speculative_dspark_sps_table_path", None))
    args.speculative_num_steps = 1
    args.speculative_eagle_topk = 1
    args.speculative_num_draft_tokens = window
    if args.max_running_requests is None:
        args.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
    args.enable_mixed_chunk = False
    return gamma


def model_chain_gamma(server_args: Any, window_gamma: int) -> int:
    """In the worker: the model chain length, i.e. the checkpoint's block (``--speculative-dspark-block-size``
    wins), capped by the window's ``window_gamma``; ``window_gamma`` when the checkpoint declares none."""
    block = getattr(server_args, "speculative_dspark_block_size", None)
    if block is None:
        path = os.path.join(str(server_args.speculative_draft_model_path), "config.json")
        block = checkpoint_gamma(_read_json(path, "the DSpark draft config")) if os.path.isfile(path) else None
    return window_gamma if block is None else max(1, min(int(block), window_gamma))
