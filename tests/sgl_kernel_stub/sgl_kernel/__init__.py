"""Test-only stand-in for the CPU build of ``sgl_kernel`` (SGLang's native kernel package).

SGLang 0.5.23 on CPU (``SGLANG_USE_CPU_ENGINE=1``, ``device="cpu"``) imports a handful of ``*_cpu`` ops from
``sgl_kernel``. The PyPI ``sglang-kernel`` wheel is the CUDA build (it fails to import without
``libcuda.so.1``) and the real CPU build is not on PyPI, so the end-to-end tests put this directory
(``tests/sgl_kernel_stub``) first on ``sys.path`` / ``PYTHONPATH``. It is never installed: it lives under
``tests/`` only and the package's ``setuptools`` configuration includes ``sglang_hybrid*`` only.

Each op is a plain-torch (host) implementation with the semantics of SGLang's own Triton twin (the GPU path);
``tests/test_sgl_kernel_stub.py`` checks them against those twins under ``TRITON_INTERPRET=1``.

Any other name raises :class:`StubOpNotImplementedError` naming the op. That class is both a
``NotImplementedError`` and an ``AttributeError``, so ``hasattr(sgl_kernel, name)`` is False and
``from sgl_kernel import name`` is an ``ImportError`` (feature probes keep working), while a direct
``sgl_kernel.name`` says clearly which op is missing.
"""

from __future__ import annotations

from ._kv_ops import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    copy_all_layer_kv_cache_cpu,
)
from ._spec_ops import (
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)

IS_TEST_STUB = True
"""Marker: this is the test-only stand-in, not a real ``sgl_kernel`` build."""

IMPLEMENTED_OPS = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
)

__all__ = list(IMPLEMENTED_OPS) + ["IS_TEST_STUB", "IMPLEMENTED_OPS", "StubOpNotImplementedError"]


class StubOpNotImplementedError(NotImplementedError, AttributeError):
    """Raised for any ``sgl_kernel`` op this stand-in does not implement."""


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    raise StubOpNotImplementedError(
        f"sgl_kernel.{name} is not implemented by the test stand-in (tests/sgl_kernel_stub/sgl_kernel); "
        f"it implements only: {', '.join(IMPLEMENTED_OPS)}"
    )
