"""The sampling oracle of the end-to-end tests: exact HF distributions, chi-square bins, and the test's power.

With temperature > 0, the first ``depth`` tokens of ``n`` identical requests are compared with the exact
distribution of the target model (HF transformers, fp64 softmax of ``logits / T``): continuations are grouped into
bins that each expect at least ``min_expected`` samples (exact ``depth``-token continuations, "this prefix then
anything not covered by a deeper bin", and the rest), and a Pearson chi-square test must not reject.

The prompt is chosen so that the test has power against two concrete ways speculative sampling can go wrong at
the tokens produced by verification (steps 2..depth): collapsing to the argmax (greedy verification), and
drawing the bonus token from the full target distribution instead of excluding the rejected draft token (modelled
with the draft token being the target argmax: ``P(argmax) = q(2 - q)`` instead of ``q``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from e2e_scenarios import FIRST_TOKEN, hf_model
from tests.oracles.penalty_oracle import penalise

SAMPLING_TEMPERATURE = 0.7
SAMPLING_N = 120
SAMPLING_DEPTH = 3
ALPHA = 1e-3  # rejection level of the chi-square tests
MIN_POWER = 0.9

Prefix = Tuple[int, ...]


@dataclass(frozen=True)
class Bins:
    """A partition of the ``depth``-token continuations into chi-square bins.

    ``leaves``: exact continuations with their probabilities; ``residuals``: prefix ``p`` stands for every
    continuation that starts with ``p`` and falls in no deeper bin; ``rest``: everything else. ``children``: the
    expanded prefixes (``()`` is the root) and the tokens expanded under each."""

    depth: int
    leaves: Dict[Prefix, float]
    residuals: Dict[Prefix, float]
    rest: float
    children: Dict[Prefix, Tuple[int, ...]]

    def labels(self) -> List[Tuple[str, Prefix]]:
        return [("leaf", k) for k in self.leaves] + [("prefix", k) for k in self.residuals] + [("rest", ())]

    def probabilities(self) -> List[float]:
        return list(self.leaves.values()) + list(self.residuals.values()) + [self.rest]

    def bin_of(self, continuation: Sequence[int]) -> int:
        """Index (in :meth:`labels` order) of the bin a sampled continuation falls into."""
        seq = tuple(continuation[: self.depth])
        labels = self.labels()
        if seq in self.leaves:
            return labels.index(("leaf", seq))
        for k in range(self.depth - 1, 0, -1):
            if seq[:k] in self.residuals:
                return labels.index(("prefix", seq[:k]))
        return len(labels) - 1

    def count(self, continuations: Sequence[Sequence[int]]) -> List[int]:
        counts = [0] * len(self.labels())
        for c in continuations:
            counts[self.bin_of(c)] += 1
        return counts


@functools.lru_cache(maxsize=4096)
@torch.no_grad()
def next_probs(model_path: str, prefix: Prefix, temperature: float,
               penalty: Optional[Tuple[Tuple[str, float], ...]] = None, output_len: int = 0) -> torch.Tensor:
    """HF next-token distribution after ``prefix`` (prompt included) at ``temperature`` (fp64). ``penalty``
    (``(name, value)`` pairs of ``frequency_penalty`` / ``presence_penalty`` / ``repetition_penalty``): SGLang's penalties on the counts of the
    last ``output_len`` tokens of ``prefix`` (the output), applied before the temperature."""
    logits = hf_model(model_path)(torch.tensor([list(prefix)])).logits[0, -1].to(torch.float64)
    if penalty and output_len:
        logits = penalise(logits, prefix[-output_len:], dict(penalty))
    return torch.softmax(logits / temperature, dim=-1)


def sequence_bins(
    model_path: str, prompt: Sequence[int], temperature: float, n: int, depth: int, min_expected: float = 5.0,
    penalty: Optional[Dict[str, float]] = None,
) -> Bins:
    """Exact binned distribution of the first ``depth`` sampled tokens for ``n`` samples."""
    threshold = min_expected / n
    leaves: Dict[Prefix, float] = {}
    residuals: Dict[Prefix, float] = {}
    children: Dict[Prefix, Tuple[int, ...]] = {}
    frontier: List[Tuple[Prefix, float]] = [((), 1.0)]
    while frontier:
        prefix, mass = frontier.pop()
        probs = next_probs(model_path, tuple(prompt) + prefix, temperature,
                           None if penalty is None else tuple(sorted(penalty.items())), len(prefix))
        kids = tuple(torch.nonzero(probs * mass >= threshold).flatten().tolist())
        children[prefix] = kids
        covered = 0.0
        for tok in kids:
            child, p = prefix + (tok,), mass * float(probs[tok])
            covered += p
            if len(child) == depth:
                leaves[child] = p
            else:
                frontier.append((child, p))
        if prefix and mass - covered >= threshold:
            residuals[prefix] = mass - covered
    rest = max(0.0, 1.0 - sum(leaves.values()) - sum(residuals.values()))
    return Bins(depth=depth, leaves=leaves, residuals=residuals, rest=rest, children=children)


Transform = Callable[[torch.Tensor], torch.Tensor]


def greedy_collapse(p: torch.Tensor) -> torch.Tensor:
    """Alternative: verification commits the argmax."""
    out = torch.zeros_like(p)
    out[int(p.argmax())] = 1.0
    return out


def rejected_draft_not_excluded(p: torch.Tensor) -> torch.Tensor:
    """Alternative: the draft token (taken to be the argmax, probability ``q``) is accepted with probability
    ``q``, and on rejection the bonus token is drawn from ``p`` itself instead of ``p`` without the draft token."""
    a, q = int(p.argmax()), float(p.max())
    out = p * (1.0 - q)
    out[a] = q * (2.0 - q)
    return out


def alternative_probabilities(
    bins: Bins, model_path: str, prompt: Sequence[int], temperature: float, transform: Transform
) -> List[float]:
    """Bin probabilities when every token after the first is drawn from ``transform(p)`` instead of ``p``."""

    @functools.lru_cache(maxsize=None)
    def prob(seq: Prefix) -> float:
        if not seq:
            return 1.0
        p = next_probs(model_path, tuple(prompt) + seq[:-1], temperature)
        if len(seq) > 1:
            p = transform(p)
        return prob(seq[:-1]) * float(p[seq[-1]])

    out = [prob(k) for k in bins.leaves]
    for k in bins.residuals:
        out.append(prob(k) - sum(prob(k + (t,)) for t in bins.children.get(k, ())))
    out.append(max(0.0, 1.0 - sum(out)))
    return out


def _merge_small_rest(values: List[List[float]], expected: List[float], min_expected: float) -> List[List[float]]:
    """Merge the last (rest) bin into the smallest other bin when it expects fewer than ``min_expected``."""
    if expected[-1] >= min_expected or len(expected) < 2:
        return values
    k = min(range(len(expected) - 1), key=lambda i: expected[i])
    merged = []
    for v in values:
        v = list(v)
        v[k] += v.pop()
        merged.append(v)
    return merged


def chi_square(counts: Sequence[int], bins: Bins, n: int, min_expected: float = 5.0) -> Tuple[float, float, int]:
    """Pearson chi-square of ``counts`` against ``bins``; returns ``(statistic, p_value, degrees_of_freedom)``."""
    from scipy.stats import chisquare

    exp = [p * n for p in bins.probabilities()]
    obs, exp = _merge_small_rest([[float(c) for c in counts], exp], exp, min_expected)
    exp = [e * sum(obs) / sum(exp) for e in exp]
    res = chisquare(obs, exp)
    return float(res.statistic), float(res.pvalue), len(obs) - 1


def power(bins: Bins, alternative: List[float], n: int, alpha: float = ALPHA, min_expected: float = 5.0) -> float:
    """Approximate power of the chi-square test (noncentral chi-square) if samples follow ``alternative``."""
    from scipy.stats import chi2, ncx2

    true = bins.probabilities()
    true, alt = _merge_small_rest([true, list(alternative)], [p * n for p in true], min_expected)
    lam = n * sum((a - t) ** 2 / t for a, t in zip(alt, true) if t > 0)
    dof = len(true) - 1
    return float(1.0 - ncx2.cdf(chi2.ppf(1.0 - alpha, dof), dof, lam))


@dataclass(frozen=True)
class SamplingCase:
    prompt: List[int]
    bins: Bins
    temperature: float
    n: int
    power_vs_greedy: float
    power_vs_no_exclusion: float


def pick_sampling_case(
    model_path: str,
    vocab: int,
    temperature: float = SAMPLING_TEMPERATURE,
    n: int = SAMPLING_N,
    depth: int = SAMPLING_DEPTH,
    seed: int = 99,
    tries: int = 12,
    penalty: Optional[Dict[str, float]] = None,
    alternatives: Tuple[Transform, Transform] = (greedy_collapse, rejected_draft_not_excluded),
) -> SamplingCase:
    """Among ``tries`` seeded 8-token prompts, the one whose test is most powerful against both ``alternatives``
    (ties: more bins); raises if even that one has power below ``MIN_POWER``. ``penalty``: the bins' tokens after
    the first are drawn under it (``sequence_bins``)."""
    g = torch.Generator().manual_seed(seed)
    best: Optional[Tuple[Tuple[float, int], SamplingCase]] = None
    for _ in range(tries):
        prompt = torch.randint(FIRST_TOKEN, vocab, (8,), generator=g).tolist()
        bins = sequence_bins(model_path, prompt, temperature, n, depth, penalty=penalty)
        if len(bins.leaves) < 2:
            continue
        pw = [power(bins, alternative_probabilities(bins, model_path, prompt, temperature, t), n) for t in alternatives]
        case = SamplingCase(prompt, bins, temperature, n, pw[0], pw[1])
        key = (min(pw), len(bins.labels()))
        if best is None or key > best[0]:
            best = (key, case)
    if best is None or best[0][0] < MIN_POWER:
        raise RuntimeError(f"no sampling prompt reaches power {MIN_POWER} (best {best and best[0]})")
    return best[1]

def identity(p: torch.Tensor) -> torch.Tensor:
    """Alternative (with ``sequence_bins(..., penalty=)``): the tokens after the first drawn without penalties."""
    return p


def pick_penalised_sampling_case(model_path: str, vocab: int, penalty: Dict[str, float], seed: int = 7) -> SamplingCase:
    """:func:`pick_sampling_case` with the tokens after the first drawn under ``penalty``, against greedy
    verification and against the same draws without penalties (stored as ``power_vs_no_exclusion``)."""
    return pick_sampling_case(model_path, vocab, seed=seed, penalty=penalty, alternatives=(greedy_collapse, identity))
