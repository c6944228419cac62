"""PNG plot of the simulated throughput ratios versus batch size, one panel per workload kind."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def plot_ratios(runs: Sequence[dict], path: str | Path, title: str = "Hybrid Spark, simulated") -> Path:
    """Plot ``hybrid_over_dspark`` and ``hybrid_over_ngram`` against batch size for each kind in ``runs``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (used as matplotlib.ticker)

    kinds = sorted({str(r["kind"]) for r in runs})
    if not kinds:
        raise ValueError("plot: no runs to plot")
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        rs = sorted((r for r in runs if str(r["kind"]) == kind), key=lambda r: r["batch_size"])
        bss = [r["batch_size"] for r in rs]
        for key, label, style in (("hybrid_over_dspark", "Hybrid / DSpark", "o-"),
                                  ("hybrid_over_ngram", "Hybrid / NGRAM", "s--")):
            ys = [r["ratios"].get(key) for r in rs]
            pts = [(b, y) for b, y in zip(bss, ys) if y is not None]
            if pts:
                ax.plot([b for b, _ in pts], [y for _, y in pts], style, label=label)
                for b, y in pts:
                    ax.annotate(f"{y:.2f}", (b, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        ax.axhline(1.0, color="gray", lw=0.8)
        ys_all = [y for r in rs for y in r["ratios"].values() if y]
        if ys_all and max(ys_all) / min(ys_all) > 3:  # NGRAM far behind on chat: keep the other line readable
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.set_xscale("log", base=2)
        ax.set_xticks(bss)
        ax.set_xticklabels([str(b) for b in bss])
        ax.set_xlabel("batch size (concurrent requests)")
        ax.set_ylabel("output throughput ratio")
        ax.set_title(kind)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
