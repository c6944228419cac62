"""Reliability diagram of a calibration table on held-out samples (matplotlib, Agg backend)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .metrics import ece, events, reliability
from .samples import Samples
from .table import CalibrationTable

__all__ = ["reliability_plot"]


def reliability_plot(table: CalibrationTable, samples: Samples, path: str | os.PathLike, title: str = "") -> Path:
    """Write a two-panel PNG (per-token ``q`` and survival): observed frequency against mean prediction per
    bin, with the diagonal and each bin's share of events; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eq, es = events(table, samples)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), dpi=100)
    for ax, ev, name in ((axes[0], eq, "per-token q"), (axes[1], es, "survival a_j")):
        r = reliability(ev.pred, ev.outcome)
        ok = r["count"] > 0
        ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--")
        ax.plot(r["mean_pred"][ok], r["observed"][ok], marker="o", color="C0", label="observed")
        share = r["count"] / max(1.0, r["count"].sum())
        ax.bar(r["edges"][:-1], share, width=np.diff(r["edges"]), align="edge", color="C1", alpha=0.35,
               label="share of events")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted")
        ax.set_ylabel("observed acceptance")
        ax.set_title(f"{name}: ECE {ece(ev.pred, ev.outcome):.4f}, {ev.pred.size} events")
        ax.legend(loc="upper left", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, metadata={"Software": None})
    plt.close(fig)
    return p
