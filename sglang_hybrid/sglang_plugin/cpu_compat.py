"""Fixes that make SGLang 0.5.23's speculative decoding correct on a CPU (``SGLANG_USE_CPU_ENGINE=1``).

``apply_cpu_compat()`` is called by the plugin entry point (``plugin.register``), which SGLang runs in every
process it starts (the launcher, the spawned scheduler, the detokenizer). Nothing happens unless
``SGLANG_USE_CPU_ENGINE=1``. Function replacements go through SGLang's own hook mechanism
(``sglang.srt.plugins.hook_registry.HookRegistry``), which patches the function in its module and in every
already-imported module holding a ``from ... import`` binding of it; modules imported later bind the patched
function from its module.

Fix 1 (the bug that made CPU speculative decoding lossy): the verify tree-mask layout
-----------------------------------------------------------------------------------
``sglang/srt/speculative/eagle_utils.py: default_tree_mask_mode()`` returns ``TreeMaskMode.QLEN_ONLY`` whenever
SGLang runs on CPU (``_is_cpu``), ``TreeMaskMode.FULL_MASK`` otherwise. The EAGLE-family workers
(``eagle_worker_v2.py``, ``standalone_worker_v2.py``, ``multi_layer_eagle_worker_v2.py``) build the target-verify
mask in that layout (``build_tree_kernel_efficient`` / ``build_chain_tree``), and
``layers/attention/verify_mask.py: maybe_create_verify_mask`` sizes the preallocated mask buffer by it.

- ``QLEN_ONLY``: ``N x N`` cells per request (``bs*N*N`` in all), only the draft-to-draft part. Only the
  ``intel_amx`` backend reads this layout (``layers/attention/intel_amx_backend.py`` passes
  ``spec_info.custom_mask`` to ``extend_attention_cpu``, and only for real trees, ``tree_topk != 1``).
- ``FULL_MASK``: ``N x (seq_len + N)`` cells per request (prefix columns, then the tree columns), requests back
  to back. The ``triton`` backend reads this layout in ``TARGET_VERIFY``: ``layers/attention/triton_backend.py``
  sets ``mask_indptr = cumsum(N * (seq_lens + N))`` and ``kernels/ops/attention/extend_attention.py`` reads row
  ``m`` of request ``b`` at ``mask_indptr[b] + m * (seq_len + N) + column``.

On a CPU without AMX the only backend that can verify is ``triton`` (under ``TRITON_INTERPRET=1``), so it read
a ``QLEN_ONLY`` mask with ``FULL_MASK`` indexing: wrong cells, and past the end of the buffer for long prefixes.
Outputs diverged from plain decoding from the first verify and changed from run to run. The replacement,
:func:`cpu_default_tree_mask_mode`, returns ``QLEN_ONLY`` only when the backend that runs ``TARGET_VERIFY`` (the
decode backend if ``speculative_attention_mode == "decode"``, else the prefill backend) is ``intel_amx``, and
``FULL_MASK`` otherwise.

Fix 2: sampling (temperature > 0) verification on CPU
------------------------------------------------------
``eagle_utils.py: _verify_uses_greedy()`` returns True whenever ``is_cpu``: on CPU, EAGLE-family verification
commits the target's argmax even for requests with temperature > 0, so speculative outputs are greedy and do
not follow the target distribution that plain decoding samples from. The reason is that SGLang has no CPU
kernel for ``tree_speculative_sampling_target_only``
(``sglang/kernels/ops/speculative/verify_sampling.py`` sets it to None off CUDA/MUSA/NPU). This module provides
:func:`tree_speculative_sampling_target_only_cpu`, a host (torch) port of the CUDA kernel
(``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh: TreeSpeculativeSamplingTargetOnly``), binds it
as ``tree_speculative_sampling_target_only`` in ``verify_sampling`` and ``eagle_utils`` (plain attribute
assignment: the original value is None, which the hook registry's ``from ... import`` propagation must never
be given), and wraps ``_verify_uses_greedy`` (an ``AROUND`` hook) so that it is called with ``is_cpu=False``.
Still unsupported on CPU after this: ``top_k`` / ``top_p`` in speculative sampling (SGLang's
``top_k_renorm_prob`` / ``top_p_renorm_prob`` are None on CPU) and ``--speculative-use-rejection-sampling``
(a Triton kernel; it runs only under ``TRITON_INTERPRET=1``).

Fixes 3-5: SGLang's DSPARK (and HYBRID_SPARK on a DSpark draft) on CPU
-----------------------------------------------------------------------
Measured in ``shared/design/dspark-on-cpu.md``; each is inert off CPU.

3. ``arg_groups/speculative_hook.py: _handle_dspark`` refuses any device but cuda/npu/xpu. The AROUND hook
   :func:`_handle_dspark_cpu` runs it with a view of the server arguments that reports ``device == "cuda"``
   (only ``device`` is rewritten, only while the original runs, only when the device is ``cpu``). Only the
   built-in ``DSPARK`` reaches ``_handle_dspark`` (a registered algorithm goes through its own
   ``handle_server_args``): this lets the CPU suite run built-in DSPARK as the baseline.
4. ``DSparkWorkerV2._forward_decode`` calls ``batch.seq_lens.record_stream(...)``, which raises
   ``RuntimeError: unknown parameter type`` for a CPU tensor. :func:`_record_stream_cpu_noop` makes
   ``torch.Tensor.record_stream`` a no-op for CPU tensors (there is no allocator stream to record on CPU) and
   calls the original for every other tensor.
5. ``layers/attention/triton_backend.py: TritonAttnBackend.init_forward_metadata`` builds a uniform
   ``qo_indptr`` (``num_tokens_per_req`` per request) for ``TARGET_VERIFY`` and ignores
   ``spec_info.ragged_verify_layout``; DSpark's ``compact`` verify packs only ``sum(verify_lens)`` rows, so the
   interpreted attention read past its rows. :func:`_triton_ragged_verify_hook` sets
   ``forward_metadata.qo_indptr`` from the layout's device ``qo_indptr`` for a target verify that carries a
   layout, on a CPU backend only.
"""

from __future__ import annotations

import logging
import os
from typing import List, Optional

import torch

logger = logging.getLogger("sglang_hybrid")

TREE_MASK_TARGET = "sglang.srt.speculative.eagle_utils.default_tree_mask_mode"
VERIFY_GREEDY_TARGET = "sglang.srt.speculative.eagle_utils._verify_uses_greedy"
SAMPLER_MODULES = ("sglang.kernels.ops.speculative.verify_sampling", "sglang.srt.speculative.eagle_utils")
SAMPLER_NAME = "tree_speculative_sampling_target_only"
DSPARK_GATE_TARGET = "sglang.srt.arg_groups.speculative_hook._handle_dspark"
TRITON_METADATA_TARGET = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata"

_APPLIED: List[str] = []


def cpu_engine_enabled() -> bool:
    """Whether SGLang runs its CPU engine in this process (``SGLANG_USE_CPU_ENGINE=1``)."""
    return os.environ.get("SGLANG_USE_CPU_ENGINE", "0") == "1"


def target_verify_attention_backend() -> Optional[str]:
    """The attention backend that runs ``TARGET_VERIFY`` in this process, or None before SGLang has published
    its resolved server configuration."""
    try:
        from sglang.srt.runtime_context import attention_backends, get_spec

        prefill, decode = attention_backends()
        mode = get_spec().speculative_attention_mode
    except Exception:  # noqa: BLE001 - not published yet (ValueError)
        return None
    return decode if mode == "decode" else prefill


def cpu_default_tree_mask_mode():
    """Replacement of ``eagle_utils.default_tree_mask_mode`` on CPU: the layout the verify backend reads.

    Before the server configuration is published, falls back to SGLang's CPU default backend (``intel_amx``
    exactly when ``cpu_has_amx_support()``)."""
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode

    backend = target_verify_attention_backend()
    if backend is None:
        from sglang.srt.utils import cpu_has_amx_support

        backend = "intel_amx" if cpu_has_amx_support() else "triton"
    return TreeMaskMode.QLEN_ONLY if backend == "intel_amx" else TreeMaskMode.FULL_MASK


def _sample_residual(q: torch.Tensor, p: Optional[torch.Tensor], coin: float) -> int:
    """Sample from ``relu(q - p)`` with the uniform ``coin`` as flashinfer's ``DeviceSamplingFromProb`` does:
    the first index whose inclusive prefix sum exceeds ``coin * sum``; if none (rounding), the last index with
    positive mass, else ``d - 1``."""
    relu = q if p is None else (q - p).clamp_min(0)
    cdf = torch.cumsum(relu.to(torch.float64), 0)
    u = coin * float(cdf[-1])
    idx = int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64), right=True)[0])
    if idx < relu.numel():
        return idx
    positive = torch.nonzero(relu > 0)
    return int(positive[-1, 0]) if positive.numel() else relu.numel() - 1


def tree_speculative_sampling_target_only_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Host port of SGLang's CUDA ``tree_speculative_sampling_target_only`` (same arguments, in place).

    Per request ``b`` (``N`` tree nodes, ``V`` vocabulary): walk from the root; at each depth try the children of
    the last accepted node in sibling order, accumulating their target probabilities; accept child ``c`` (token
    ``t``) if ``target_probs[b, node, t] > 0`` and (``coin < acc / threshold_acc`` or ``p >= threshold_single``),
    where ``coin = uniform_samples[b, node]``; a rejected child's target probability is copied into
    ``draft_probs`` (so the final draw excludes it). Finally draw the bonus token from
    ``relu(target_probs[b, node] - draft_probs[b, node])`` (``draft_probs`` ignored when the chain is full) with
    ``uniform_samples_for_final_sampling[b]``. With ``threshold_* = 1`` and a deterministic draft this keeps the
    target distribution exactly. Writes ``predicts``, ``accept_index`` (root first), ``accept_token_num``
    (accepted drafts, bonus excluded) and ``draft_probs``. ``deterministic`` is accepted for signature parity.
    """
    if candidates.dim() != 2:
        raise ValueError(f"candidates must be [bs, N], got {tuple(candidates.shape)}")
    bs, n = candidates.shape
    if target_probs.numel() == 0 or bs == 0:
        return
    vocab = target_probs.shape[-1]
    if target_probs.shape != (bs, n, vocab) or draft_probs.shape != (bs, n, vocab):
        raise ValueError(
            f"target_probs and draft_probs must be [bs, N, V] = [{bs}, {n}, V], got "
            f"{tuple(target_probs.shape)} and {tuple(draft_probs.shape)}"
        )
    if accept_index.dim() != 2 or accept_index.shape[0] != bs:
        raise ValueError(f"accept_index must be [bs, spec_tokens], got {tuple(accept_index.shape)}")
    if not (0.0 <= threshold_single <= 1.0 and 0.0 <= threshold_acc <= 1.0):
        raise ValueError(f"thresholds must lie in [0, 1], got {threshold_single}, {threshold_acc}")
    num_spec = accept_index.shape[1]
    thr_acc = max(float(threshold_acc), 1e-9)
    ri = retrive_index.reshape(bs, n).tolist()
    rnt = retrive_next_token.reshape(bs, n).tolist()
    rns = retrive_next_sibling.reshape(bs, n).tolist()
    cand = candidates.tolist()
    coins = uniform_samples.reshape(bs, n).tolist()
    final_coins = uniform_samples_for_final_sampling.reshape(bs).tolist()
    flat_pred = predicts.view(-1)
    for b in range(bs):
        prob_acc, node = 0.0, 0
        coin = coins[b][0]
        last = ri[b][0]
        accept_index[b, 0] = last
        num_acc, cur = 0, 0
        for _ in range(1, num_spec):
            cur = rnt[b][cur]
            while cur != -1:
                token = cand[b][cur]
                p = float(target_probs[b, node, token])
                prob_acc += p
                if p > 0 and (coin < prob_acc / thr_acc or p >= threshold_single):
                    prob_acc, node = 0.0, cur
                    coin = coins[b][cur]
                    flat_pred[last] = token
                    num_acc += 1
                    accept_index[b, num_acc] = ri[b][cur]
                    last = ri[b][cur]
                    break
                draft_probs[b, node, token] = target_probs[b, node, token]
                cur = rns[b][cur]
            if cur == -1:
                break
        accept_token_num[b] = num_acc
        p_row = None if num_acc == num_spec - 1 else draft_probs[b, node]
        flat_pred[last] = _sample_residual(target_probs[b, node], p_row, final_coins[b])


def _calls(installed: object, hook: object) -> bool:
    """Whether the hook registry's wrapper ``installed`` dispatches to ``hook`` (its closure holds it)."""
    cells = getattr(installed, "__closure__", None) or ()
    return any(getattr(c, "cell_contents", None) is hook for c in cells)


def _mask_mode_hook():
    return cpu_default_tree_mask_mode()


def _verify_greedy_hook(original_fn, *args, **kwargs):
    kwargs["is_cpu"] = False  # a CPU sampler exists now (tree_speculative_sampling_target_only_cpu)
    return original_fn(*args, **kwargs)


class _CudaDeviceView:
    """A resolving view of the server arguments that reports ``device == "cuda"`` where it says ``cpu``."""

    def __init__(self, view):
        object.__setattr__(self, "_view", view)

    def __getattr__(self, name):
        value = getattr(object.__getattribute__(self, "_view"), name)
        return "cuda" if name == "device" and value == "cpu" else value


def _handle_dspark_cpu(original_fn, server_args, *args, **kwargs):
    """AROUND ``_handle_dspark``: pass its device gate on CPU (fix 3); everything else it checks still runs."""
    from sglang.srt.arg_groups import speculative_hook as sh

    real = sh.resolving_view
    if real(server_args).device != "cpu":
        return original_fn(server_args, *args, **kwargs)
    sh.resolving_view = lambda sa: _CudaDeviceView(real(sa))
    try:
        return original_fn(server_args, *args, **kwargs)
    finally:
        sh.resolving_view = real


_ORIGINAL_RECORD_STREAM = torch.Tensor.record_stream


def _record_stream_cpu_noop(self, stream):
    """``torch.Tensor.record_stream`` that does nothing for a CPU tensor (fix 4)."""
    if self.device.type == "cpu":
        return None
    return _ORIGINAL_RECORD_STREAM(self, stream)


def _triton_ragged_verify_hook(original_fn, self, forward_batch, *args, **kwargs):
    """AROUND ``TritonAttnBackend.init_forward_metadata``: a ragged target verify reads the layout's
    ``qo_indptr`` (fix 5). CPU backends only."""
    out = original_fn(self, forward_batch, *args, **kwargs)
    layout = getattr(getattr(forward_batch, "spec_info", None), "ragged_verify_layout", None)
    if (layout is not None and forward_batch.forward_mode.is_target_verify()
            and torch.device(self.device).type == "cpu"):
        bs = int(layout.verify_lens.numel())
        self.forward_metadata.qo_indptr = layout.qo_indptr_device[: bs + 1].to(torch.int32)
    return out


def apply_cpu_compat() -> List[str]:
    """Apply the CPU fixes if ``SGLANG_USE_CPU_ENGINE=1``; return the dotted names of what was patched.

    Idempotent: a repeated call patches nothing again and returns the same list. Returns ``[]`` when the CPU
    engine is off. Raises ``RuntimeError`` if a patch cannot be applied (for example ``sgl_kernel`` is missing, so
    SGLang's CPU modules cannot be imported): speculative decoding on CPU without these fixes is silently wrong.
    """
    if not cpu_engine_enabled():
        return []
    if _APPLIED:
        return list(_APPLIED)
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    try:
        eagle_utils = importlib.import_module("sglang.srt.speculative.eagle_utils")
        modules = [importlib.import_module(m) for m in SAMPLER_MODULES]
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"sglang_hybrid cpu_compat: cannot import SGLang's speculative modules: {e!r}") from e
    HookRegistry.register(TREE_MASK_TARGET, _mask_mode_hook, HookType.REPLACE)
    HookRegistry.register(VERIFY_GREEDY_TARGET, _verify_greedy_hook, HookType.AROUND)
    HookRegistry.register(DSPARK_GATE_TARGET, _handle_dspark_cpu, HookType.AROUND)
    HookRegistry.register(TRITON_METADATA_TARGET, _triton_ragged_verify_hook, HookType.AROUND)
    HookRegistry.apply_hooks()
    from sglang.srt.arg_groups import speculative_hook
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    for owner, target, hook in (
        (eagle_utils, TREE_MASK_TARGET, _mask_mode_hook),
        (eagle_utils, VERIFY_GREEDY_TARGET, _verify_greedy_hook),
        (speculative_hook, DSPARK_GATE_TARGET, _handle_dspark_cpu),
        (TritonAttnBackend, TRITON_METADATA_TARGET, _triton_ragged_verify_hook),
    ):
        if not _calls(getattr(owner, target.rsplit(".", 1)[1]), hook):
            raise RuntimeError(f"sglang_hybrid cpu_compat: the hook on {target} was not applied")
    torch.Tensor.record_stream = _record_stream_cpu_noop
    patched = [TREE_MASK_TARGET, VERIFY_GREEDY_TARGET, DSPARK_GATE_TARGET, TRITON_METADATA_TARGET,
               "torch.Tensor.record_stream"]
    for mod in modules:
        current = getattr(mod, SAMPLER_NAME, None)
        if current is None or current is tree_speculative_sampling_target_only_cpu:
            setattr(mod, SAMPLER_NAME, tree_speculative_sampling_target_only_cpu)
            patched.append(f"{mod.__name__}.{SAMPLER_NAME}")
        else:
            raise RuntimeError(f"sglang_hybrid cpu_compat: {mod.__name__}.{SAMPLER_NAME} is unexpectedly set on CPU")
    _APPLIED.extend(patched)
    logger.info("sglang_hybrid cpu_compat: patched %s", ", ".join(_APPLIED))
    return list(_APPLIED)
