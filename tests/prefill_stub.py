"""Stand-in SGLang requests for the workers' prefill hook (``sglang_plugin.common.write_prefill_history``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional, Sequence

import torch


def prefill_stub_requests(step, slots: Sequence[int], tenants: Sequence[tuple[Optional[str], ...]]) -> list:
    """Prefill a 3-token prompt into each of ``slots`` through ``write_prefill_history``, one stand-in ``Req`` per
    slot with the ``(extra_key, cache_salt[, routing_key])`` of ``tenants``; returns the requests (``tenant_id``
    reads them)."""
    from sglang_hybrid.sglang_plugin.common import write_prefill_history

    reqs = [SimpleNamespace(rid=f"t{i}", origin_input_ids=[1, 2, 3], output_ids=[], extra_key=t[0], cache_salt=t[1],
                            routing_key=t[2] if len(t) > 2 else None)
            for i, t in enumerate(tenants)]
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False), reqs=reqs,
                            req_pool_indices=torch.tensor(list(slots)))
    write_prefill_history(step, batch, torch.arange(4, 4 + len(reqs), dtype=torch.int32), "cpu")
    return reqs
