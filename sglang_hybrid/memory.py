"""How much device memory HYBRID_SPARK's own state holds, by part.

SGLang sizes its KV cache from ``--mem-fraction-static`` before the speculative worker builds its state, so what
the plugin allocates comes out of the headroom SGLang keeps for activations and CUDA graphs. The workers add up
their tensors once at start-up (:func:`device_bytes`), log the total by part and report it in the metrics
(``device_bytes``), so an operator can see it and make room (a smaller ``--mem-fraction-static``, option
``history_width``, ``corpus_entries`` or ``penalty_rows``). The state is allocated once, with shapes fixed by the
request pool: decode steps add a few bytes per batch size the first time they meet it (what the GPU warm-up creates
before the report) and nothing after (``tests/test_memory.py``).
"""

from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional, Tuple

import torch

_LEAVES = (str, bytes, int, float, bool, complex, type(None), torch.device, torch.dtype, type)


def _walk(obj, device: torch.device, seen_objs: set, seen_storages: set) -> int:
    """Bytes of the storages on ``device`` reachable from ``obj`` that ``seen_storages`` does not hold yet (each
    counted once, whatever views of it are reachable). Plain containers are followed, and the attributes of this
    package's own objects; nothing else (a model, SGLang's state, a logger) is ours to count."""
    if isinstance(obj, _LEAVES):
        return 0
    if id(obj) in seen_objs:
        return 0
    seen_objs.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.device != device:
            return 0
        storage = obj.untyped_storage()
        key = storage.data_ptr()
        if key in seen_storages or storage.nbytes() == 0:
            return 0
        seen_storages.add(key)
        return storage.nbytes()
    if isinstance(obj, Mapping):
        items: Iterable = obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = obj
    elif not type(obj).__module__.startswith(__package__ or "sglang_hybrid"):
        return 0
    else:
        items = list(getattr(obj, "__dict__", {}).values())
        for cls in type(obj).__mro__:
            items += [getattr(obj, s) for s in getattr(cls, "__slots__", ()) if isinstance(s, str) and hasattr(obj, s)]
    return sum(_walk(x, device, seen_objs, seen_storages) for x in items)


def device_bytes(parts: Mapping[str, object], device) -> Dict[str, int]:
    """Bytes on ``device`` held by each named part (in order: a storage shared by two parts counts in the first),
    and their ``"total"``."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    seen_objs: set = set()
    seen_storages: set = set()
    out = {name: _walk(obj, dev, seen_objs, seen_storages) for name, obj in parts.items()}
    out["total"] = sum(out.values())
    return out


def tensors_added(obj, before: Iterable[str]) -> Tuple[torch.Tensor, ...]:
    """The tensors ``obj`` holds in attributes that are not in ``before`` (``set(vars(obj))`` taken earlier): what
    a worker allocated for itself since then, so a buffer added later is counted without being listed by hand.
    Attributes that hold other objects (the step, the penalties) are left to their own parts."""
    old = set(before)
    return tuple(v for k, v in vars(obj).items() if k not in old and isinstance(v, torch.Tensor))


def mib(n: int) -> float:
    return n / (1 << 20)


def summary(by_part: Mapping[str, int], notes: Optional[Mapping[str, str]] = None) -> str:
    """``"123.4 MiB: token history 100.0 MiB (...), corpus 16.0 MiB, ..."``; parts holding nothing are left out."""
    notes = notes or {}
    parts: Tuple[str, ...] = tuple(
        f"{name} {mib(n):.1f} MiB" + (f" ({notes[name]})" if name in notes else "")
        for name, n in by_part.items() if name != "total" and n > 0)
    return f"{mib(by_part['total']):.1f} MiB: " + ", ".join(parts)
