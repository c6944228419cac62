"""The model drafter as a declared acceptance model (the simulator has no draft model to run).

Model: at every decode step the drafter proposes ``gamma`` tokens with per-position *conditional* confidences
``c_k`` (the probability that token k is accepted given tokens 1..k-1 were), as DSpark's calibrated confidence
head does. The target then accepts token k, given 1..k-1 accepted, with probability exactly ``c_k``: the
confidences are calibrated. Each step draws ``c_k ~ Beta(kappa * p_k, kappa * (1 - p_k))`` independently per
position, so ``E[c_k] = p_k`` ("calibrated on average") and ``kappa`` (the concentration) sets how much the
confidences tell apart easy and hard steps (large kappa: every step looks like the mean curve). Then
``E[accepted length with all gamma verified] = 1 + sum_k prod_{i<=k} p_i`` (the 1 is the bonus token).

Default curves: ``p_k = p_1 * decay**(k-1)`` with ``decay = 0.97`` and ``p_1`` solved so that the full-gamma
accepted length (bonus included) is DSpark's published figure at gamma = 7 on Qwen3-8B: about 5.0 tokens per
step on code and 3.7 on chat. These numbers are the model's *inputs*, not results of the simulation.

Random numbers are keyed by (seed, request index, output position), not by step or batch, so every policy sees
the same draws at the same point of the same request (common random numbers; the policy ratios are less
noisy and a policy that never uses the model chain does not shift the others' draws).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_GAMMA = 7
DEFAULT_DECAY = 0.97
DEFAULT_CONCENTRATION = 4.0
# DSpark's published accepted lengths (bonus token included) at gamma = 7: the default curves reproduce them.
PUBLISHED_ACCEPT_LENGTH = {"code-edit": 5.0, "chat": 3.7}


def expected_length(cond: np.ndarray | list[float], verify: int | None = None) -> float:
    """``1 + sum_{k<=verify} prod_{i<=k} cond_i``: expected tokens per step when ``verify`` drafts are checked."""
    c = np.asarray(cond, dtype=np.float64)
    n = len(c) if verify is None else int(verify)
    return 1.0 + float(np.cumprod(c[:n]).sum())


def solve_curve(target_length: float, gamma: int = DEFAULT_GAMMA, decay: float = DEFAULT_DECAY) -> tuple[float, ...]:
    """Per-position mean conditional acceptance ``p_1 * decay**(k-1)`` whose full-gamma length is ``target_length``."""
    if not (1.0 <= target_length <= 1.0 + gamma):
        raise ValueError(f"target_length: must be in [1, 1 + gamma = {1 + gamma}], got {target_length}")
    if not (0.0 < decay <= 1.0):
        raise ValueError(f"decay: must be in (0, 1], got {decay}")
    shape = decay ** np.arange(gamma)
    lo, hi = 0.0, 1.0 / shape.max()
    if expected_length(np.minimum(hi * shape, 1.0)) < target_length:
        raise ValueError(f"target_length {target_length} is not reachable with decay {decay} at gamma {gamma}")
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if expected_length(np.minimum(mid * shape, 1.0)) < target_length:
            lo = mid
        else:
            hi = mid
    return tuple(float(x) for x in np.minimum(hi * shape, 1.0))


@dataclass(frozen=True)
class AcceptanceModel:
    """Declared per-position acceptance of the model drafter (see the module docstring)."""

    cond: tuple[float, ...]  # p_k, k = 1..gamma: mean conditional acceptance
    concentration: float = DEFAULT_CONCENTRATION  # kappa of the Beta draws; inf = always exactly p_k

    def __post_init__(self) -> None:
        if len(self.cond) < 1:
            raise ValueError("cond: needs at least one position")
        if any(not (0.0 <= p <= 1.0) for p in self.cond):
            raise ValueError(f"cond: every p_k must be in [0, 1], got {self.cond}")
        if not self.concentration > 0:
            raise ValueError(f"concentration: must be > 0, got {self.concentration}")

    @property
    def gamma(self) -> int:
        return len(self.cond)

    def expected_length(self, verify: int | None = None) -> float:
        """Expected tokens per step (bonus included) with ``verify`` drafts checked (default all)."""
        return expected_length(self.cond, verify)

    @classmethod
    def for_kind(cls, kind: str, gamma: int = DEFAULT_GAMMA, *, length: float | None = None,
                 decay: float = DEFAULT_DECAY, concentration: float = DEFAULT_CONCENTRATION) -> "AcceptanceModel":
        """The default model of a workload kind (``length`` overrides the published accepted length)."""
        if length is None:
            if kind not in PUBLISHED_ACCEPT_LENGTH:
                raise ValueError(f"kind: no default accepted length for {kind!r}; pass length=")
            length = PUBLISHED_ACCEPT_LENGTH[kind]
            if gamma != DEFAULT_GAMMA:  # keep the same per-position curve, truncated or extended
                cond = solve_curve(length, DEFAULT_GAMMA, decay)
                p1 = cond[0]
                return cls(tuple(float(min(1.0, p1 * decay ** k)) for k in range(gamma)), concentration)
        return cls(solve_curve(length, gamma, decay), concentration)

    def draw(self, seed: int, request_index: int, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """Confidences ``c [num_positions, gamma]`` and uniforms ``u`` (same shape) for one request.

        Row ``p`` serves the step that starts at output position ``p``; token k of that step's model chain is
        accepted (given 1..k-1 were) iff ``u[p, k] < c[p, k]``.
        """
        rng = np.random.default_rng([int(seed), int(request_index), 0x5EED])
        p = np.asarray(self.cond, dtype=np.float64)
        n = max(int(num_positions), 1)
        if np.isinf(self.concentration):
            c = np.broadcast_to(p, (n, self.gamma)).copy()
        else:
            a = np.clip(self.concentration * p, 1e-6, None)
            b = np.clip(self.concentration * (1.0 - p), 1e-6, None)
            c = rng.beta(a, b, size=(n, self.gamma))
        u = rng.random((n, self.gamma))
        return c.astype(np.float32), u.astype(np.float32)


def accepted_prefix(c: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per row, how many leading draft tokens are accepted (``u < c`` until the first failure)."""
    ok = u < c
    return np.where(ok.all(axis=1), ok.shape[1], np.argmin(ok, axis=1)).astype(np.int64)
