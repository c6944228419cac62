"""SPS tables (engine steps per second vs verify batch tokens B) in SGLang's ``SpsCostTable`` format.

The JSON format is SGLang 0.5.23's (``sglang/srt/speculative/dspark_components/dspark_sps.py``)::

    {"sample_batch_tokens": [1, 2, ...], "sample_steps_per_sec": [270.1, ...], "max_batch_tokens": 16896}

Lookup is SGLang's floor probe: SPS(B) is the value of the largest probe <= B (the first probe below
it, the last probe above it). :func:`dense_sps` evaluates it once on the host for every B into a device
tensor the selection indexes, so the decode step never touches the table.

Default table (until one is measured with ``sglang/benchmark/dspark_sps_profiler.py`` on the target GPU):
:func:`roofline_sps_table` for an 8B dense bf16 model on one H200, shipped as
``sglang_hybrid/data/sps/roofline_8b_h200.json``. Step time at B verified tokens::

    t(B) = overhead + (weight_bytes + KV(B)) / hbm_bw + (2 * params / flops) * max(0, B - B_knee)

* weights: 8e9 params x 2 bytes = 16 GB read once per step at 4.3 TB/s (measured copy rate on an H200)
  = 3.72 ms;
* compute: 2 x 8e9 FLOPs per verified token at 790 TFLOP/s (measured bf16 GEMM rate) = 20.25 us per
  token, hidden under the weight read up to B_knee = weight time / per-token compute = 184 tokens, then
  added linearly;
* KV reads: the table is one-dimensional in B, so it assumes (as SGLang's profiler conditions its
  measurements) that a step of B tokens comes from B / tokens_per_request requests, tokens_per_request =
  8 (gamma = 7 drafts + the root); each request reads context_len = 1024 tokens of KV at 147456 bytes
  per token (Qwen3-8B: 36 layers x 8 KV heads x 128 head dim x K,V x bf16), i.e. 35 us per request,
  4.4 us per verified token;
* overhead: 150 us fixed per step (kernel launches, sampling, scheduling).

Probes: every B in 1..64, then steps of B // 32 (about 3%), up to max_batch_tokens = 512 x 33 = 16896
(bs = 512 with 32-token chains); steps/sec rounded to 3 decimals. A floor-probe lookup between probes
over-states SPS by at most one step (about 3%). Replace it with a measured table when a GPU is at hand.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

__all__ = [
    "DEFAULT_ROOFLINE_PATH",
    "SpsTable",
    "SpsTableError",
    "dense_sps",
    "load_default_sps_table",
    "load_sps_table",
    "roofline_probes",
    "roofline_sps_table",
    "roofline_step_seconds",
    "write_roofline_sps_table",
]

DEFAULT_ROOFLINE_PATH = Path(__file__).resolve().parent.parent / "data" / "sps" / "roofline_8b_h200.json"


class SpsTableError(ValueError):
    """A bad SPS table; the message names the file (or the argument) and the field."""


@dataclass(frozen=True)
class SpsTable:
    """SGLang's ``SpsCostTable`` fields, validated; ``source`` names where it came from (for errors)."""

    sample_batch_tokens: tuple[int, ...]
    sample_steps_per_sec: tuple[float, ...]
    max_batch_tokens: int
    source: str = field(default="<memory>", compare=False)

    def __post_init__(self) -> None:
        def bad(why: str) -> SpsTableError:
            return SpsTableError(f"SPS table {self.source}: {why}")

        bt, sps = self.sample_batch_tokens, self.sample_steps_per_sec
        if len(bt) == 0:
            raise bad("'sample_batch_tokens' is empty (needs at least one probe)")
        if len(bt) != len(sps):
            raise bad(f"'sample_batch_tokens' and 'sample_steps_per_sec' lengths differ ({len(bt)} vs {len(sps)})")
        for i, b in enumerate(bt):
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise bad(f"'sample_batch_tokens'[{i}] must be an int >= 1, got {b!r}")
        for i in range(1, len(bt)):
            if bt[i] <= bt[i - 1]:
                raise bad(f"'sample_batch_tokens' must be strictly increasing (sorted, no repeats); "
                          f"entry {i} = {bt[i]} follows {bt[i - 1]}")
        for i, s in enumerate(sps):
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
                raise bad(f"'sample_steps_per_sec'[{i}] must be a finite number > 0, got {s!r}")
        mbt = self.max_batch_tokens
        if isinstance(mbt, bool) or not isinstance(mbt, int) or mbt < bt[-1]:
            raise bad(f"'max_batch_tokens' must be an int >= the largest probe {bt[-1]}, got {mbt!r}")

    def lookup(self, batch_tokens: int) -> float:
        """SGLang's floor-probe lookup: steps/sec at ``batch_tokens`` verify tokens."""
        i = int(np.searchsorted(np.asarray(self.sample_batch_tokens), batch_tokens, side="right")) - 1
        return float(self.sample_steps_per_sec[max(0, min(i, len(self.sample_batch_tokens) - 1))])

    def to_dict(self) -> dict[str, Any]:
        return {
            "sample_batch_tokens": list(self.sample_batch_tokens),
            "sample_steps_per_sec": [float(s) for s in self.sample_steps_per_sec],
            "max_batch_tokens": self.max_batch_tokens,
        }

    def to_json(self) -> str:
        """JSON that SGLang's ``SpsCostTable.from_json`` / ``load_sps_table_from_path`` read."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, source: str = "<memory>") -> "SpsTable":
        """Build from a decoded JSON object; unknown keys are ignored, as SGLang does."""
        if not isinstance(data, dict):
            raise SpsTableError(f"SPS table {source}: expected a JSON object, got {type(data).__name__}")
        if "bias_seconds" in data:
            raise SpsTableError(f"SPS table {source}: is an SpsAdditiveCostTable (has 'bias_seconds'); only the "
                                f"SpsCostTable format (sample_batch_tokens, sample_steps_per_sec, max_batch_tokens) "
                                f"is supported")
        for key in ("sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"):
            if key not in data:
                raise SpsTableError(f"SPS table {source}: missing key '{key}'")
        for key in ("sample_batch_tokens", "sample_steps_per_sec"):
            if not isinstance(data[key], list):
                raise SpsTableError(f"SPS table {source}: '{key}' must be a list, got {type(data[key]).__name__}")
        return cls(tuple(data["sample_batch_tokens"]), tuple(data["sample_steps_per_sec"]),
                   data["max_batch_tokens"], source=source)


def load_sps_table(path: str | Path) -> SpsTable:
    """Load and validate an SPS table JSON file; every error names the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpsTableError(f"SPS table {p}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpsTableError(f"SPS table {p}: cannot read ({e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpsTableError(f"SPS table {p}: malformed JSON ({e})") from None
    return SpsTable.from_dict(data, source=str(p))


def load_default_sps_table() -> SpsTable:
    """The shipped roofline table (8B dense bf16 on one H200)."""
    return load_sps_table(DEFAULT_ROOFLINE_PATH)


def dense_sps(table, max_tokens: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``sps[B]`` for every B in 0..max_tokens (floor-probe lookup), float32 on ``device``.

    ``table`` is an :class:`SpsTable` or SGLang's ``SpsCostTable`` (anything with ``sample_batch_tokens``
    and ``sample_steps_per_sec``). The selection needs ``max_tokens >= max_bs * (1 + Lm)``. Runs on the host
    once, at start-up.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise SpsTableError(f"dense_sps: argument 'max_tokens' must be an int >= 1, got {max_tokens!r}")
    try:
        edges = np.asarray(list(table.sample_batch_tokens), dtype=np.int64)
        vals = np.asarray(list(table.sample_steps_per_sec), dtype=np.float64)
    except AttributeError:
        raise SpsTableError(f"dense_sps: argument 'table' must have sample_batch_tokens and sample_steps_per_sec, "
                            f"got {type(table).__name__}") from None
    if edges.size == 0 or edges.size != vals.size:
        raise SpsTableError("dense_sps: argument 'table' needs equal, non-empty probe and value lists")
    if not np.all(np.isfinite(vals)) or np.any(vals <= 0):
        raise SpsTableError("dense_sps: argument 'table' has non-positive or non-finite steps/sec")
    b = np.arange(max_tokens + 1, dtype=np.int64)
    idx = np.clip(np.searchsorted(edges, b, side="right") - 1, 0, edges.size - 1)
    return torch.tensor(vals[idx], dtype=torch.float32, device=device)


def roofline_step_seconds(
    batch_tokens: np.ndarray | Sequence[int],
    *,
    params: float = 8.0e9,
    bytes_per_param: float = 2.0,
    hbm_bytes_per_s: float = 4.3e12,
    flops_per_s: float = 790e12,
    kv_bytes_per_token: float = 36 * 8 * 128 * 2 * 2,
    context_len: int = 1024,
    tokens_per_request: int = 8,
    overhead_s: float = 150e-6,
) -> np.ndarray:
    """Roofline step time (seconds) at each verify batch size; the model is in the module docstring."""
    b = np.asarray(batch_tokens, dtype=np.float64)
    weight_s = params * bytes_per_param / hbm_bytes_per_s
    kv_s = (b / tokens_per_request) * context_len * kv_bytes_per_token / hbm_bytes_per_s
    per_token_s = 2.0 * params / flops_per_s
    knee = weight_s / per_token_s
    return overhead_s + weight_s + kv_s + per_token_s * np.maximum(0.0, b - knee)


def roofline_probes(max_batch_tokens: int = 512 * 33, dense_upto: int = 64, step_div: int = 32) -> list[int]:
    """Probe batch sizes: every B up to ``dense_upto``, then steps of ``B // step_div``, ending at the max."""
    probes, b = [], 1
    while b < max_batch_tokens:
        probes.append(b)
        b += 1 if b < dense_upto else max(1, b // step_div)
    probes.append(max_batch_tokens)
    return probes


def roofline_sps_table(max_batch_tokens: int = 512 * 33, **model: float) -> SpsTable:
    """The documented default SPS table; keyword arguments override :func:`roofline_step_seconds`'s model."""
    probes = roofline_probes(max_batch_tokens)
    t = roofline_step_seconds(probes, **model)
    sps = tuple(round(float(1.0 / x), 3) for x in t)
    return SpsTable(tuple(probes), sps, max_batch_tokens, source="roofline_sps_table()")


def roofline_json(table: Optional[SpsTable] = None) -> str:
    """The shipped file's exact text: the table plus a ``_comment`` key (ignored by SGLang and by us)."""
    table = table or roofline_sps_table()
    d = {"_comment": ("Roofline default, not a measurement: 8B dense bf16 on one H200; see "
                      "sglang_hybrid/selection/sps.py (roofline_sps_table) for the model and its assumptions.")}
    d.update(table.to_dict())
    return json.dumps(d, indent=1) + "\n"


def write_roofline_sps_table(path: str | Path = DEFAULT_ROOFLINE_PATH) -> Path:
    """Regenerate the shipped default table file.

    ``python -c "from sglang_hybrid.selection.sps import write_roofline_sps_table as w; w()"``
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(roofline_json(), encoding="utf-8")
    return p
