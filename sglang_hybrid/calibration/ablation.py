"""Feature ablations: refit with one feature collapsed (or a fitting choice changed) and compare held-out metrics.

A feature is "removed" by giving it a single bucket, so every variant has the same file format. Used by
``hybrid-spark calibrate --ablate`` to decide which optional features earn their place.
"""

from __future__ import annotations

from typing import Any, Sequence

from .fit import DEFAULT_MONOTONE, fit_table
from .metrics import evaluate
from .samples import Samples
from .table import Feature

__all__ = ["collapse", "run_ablations", "format_ablations"]


def collapse(features: Sequence[Feature], name: str) -> list[Feature]:
    """``features`` with ``name`` reduced to one bucket over its whole range (``agree`` is dropped)."""
    out = []
    for f in features:
        if f.name != name:
            out.append(f)
        elif name != "agree":
            out.append(Feature(f.name, (f.edges[0], f.edges[-1])))
    return out


def _replace(features: Sequence[Feature], new: Feature) -> list[Feature]:
    return [new if f.name == new.name else f for f in features]


def run_ablations(train: Samples, held: Samples, features: Sequence[Feature], prior_strength: float,
                  ) -> list[tuple[str, dict[str, Any]]]:
    """Held-out metrics of the full fit and of each variant: ``[(name, evaluate(...)), ...]``."""
    feats = list(features)
    mono = dict(DEFAULT_MONOTONE)
    variants: list[tuple[str, list[Feature], float, dict[str, int]]] = [("full", feats, prior_strength, mono)]
    for name in ("match_count", "in_prompt", "agree", "match_len", "position"):
        if any(f.name == name for f in feats):
            variants.append((f"without {name}", collapse(feats, name), prior_strength, mono))
    mc = next(f for f in feats if f.name == "match_count")
    if mc.edges[-1] is None:
        variants.append(("match_count 1,2,3-4,5-8,9-16,17-32,33+",
                         _replace(feats, Feature("match_count", (1, 2, 3, 5, 9, 17, 33, None))), prior_strength, mono))
    variants.append(("match_count increasing (pooled)", feats, prior_strength, {**mono, "match_count": 1}))
    variants.append(("match_count unconstrained", feats, prior_strength, {**mono, "match_count": 0}))
    variants.append(("no monotone constraint", feats, prior_strength, {"match_len": 0, "match_count": 0}))
    variants.append(("prior_strength 0", feats, 0.0, mono))
    variants.append(("prior_strength 200", feats, 200.0, mono))
    results = []
    for name, fs, s, directions in variants:
        table = fit_table(train, fs, prior_strength=s, monotone=directions)
        results.append((name, evaluate(table, held)))
    return results


def format_ablations(results: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """A plain-text table of the ablation results (survival and q: ECE, AUC, Brier, log loss)."""
    head = f"{'variant':<40} {'surv ECE':>9} {'surv AUC':>9} {'surv Brier':>10} {'surv LL':>8} " \
           f"{'q ECE':>8} {'q AUC':>8} {'q LL':>8}"
    lines = [head, "-" * len(head)]
    for name, m in results:
        s, q = m["survival"], m["q"]
        sa = float("nan") if s["auc"] is None else s["auc"]
        qa = float("nan") if q["auc"] is None else q["auc"]
        lines.append(f"{name:<40} {s['ece']:>9.4f} {sa:>9.4f} {s['brier']:>10.5f} {s['log_loss']:>8.4f} "
                     f"{q['ece']:>8.4f} {qa:>8.4f} {q['log_loss']:>8.4f}")
    return "\n".join(lines)
