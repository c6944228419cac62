"""Readable text tables of simulation results."""

from __future__ import annotations

from typing import Sequence

COLUMNS = (("accepted_per_step", "accept/step", "{:.2f}"), ("verified_per_step", "verify/step", "{:.2f}"),
           ("theta", "Theta tok/s", "{:.0f}"), ("throughput", "throughput tok/s", "{:.0f}"),
           ("ngram_chosen_frac", "n-gram chosen", "{:.0%}"), ("steps", "steps", "{}"))


def format_run(r: dict) -> str:
    """One run (a workload at one batch size): a line per policy and the ratios."""
    head = f"{r.get('workload', '')} [{r['kind']}] batch {r['batch_size']}, {r['requests']} requests"
    if r.get("subsampled"):
        head += f" (subsampled: first {r['requests']} of {r.get('total_requests', '?')})"
    if "seconds" in r:
        head += f"  [{r['seconds']} s]"
    lines = [head, "  " + f"{'policy':<8}" + "".join(f"{h:>18}" for _, h, _ in COLUMNS)]
    for name, s in r["policies"].items():
        lines.append("  " + f"{name:<8}" + "".join(f"{fmt.format(s[k]):>18}" for k, _, fmt in COLUMNS))
    cal = r["policies"].get("hybrid", {}).get("ngram_calibration")
    if cal:
        lines.append(f"  hybrid n-gram drafts: calibrated expected accepted {cal['predicted_accepted_per_draft']:.2f} "
                     f"vs actual {cal['actual_accepted_per_draft']:.2f} tokens per draft ({cal['drafts']} drafts)")
    if r["ratios"]:
        lines.append("  " + "   ".join(f"{k.replace('_over_', '/')} = {v:.3f}x" for k, v in r["ratios"].items()))
    for kind, q in r.get("ratios_by_kind", {}).items():
        lines.append(f"  {kind} requests, each one's speed: " + "   ".join(
            f"{k.replace('_over_', '/')} = {v:.3f}x" for k, v in q.items()))
    return "\n".join(lines)


def format_summary(runs: Sequence[dict]) -> str:
    """A compact ratio table: one row per (kind, batch size)."""
    lines = [f"{'workload':<12}{'batch':>6}{'requests':>10}{'hybrid/dspark':>15}{'hybrid/ngram':>14}"
             f"{'hyb/dspark lag0':>17}{'dspark acc':>12}{'ngram acc':>11}{'hybrid acc':>12}"]
    for r in runs:
        p, q = r["policies"], r["ratios"]

        def acc(k: str) -> str:
            return f"{p[k]['accepted_per_step']:.2f}" if k in p else "-"

        def rat(k: str) -> str:
            return f"{q[k]:.3f}x" if k in q else "-"

        lines.append(f"{str(r['kind']):<12}{r['batch_size']:>6}{r['requests']:>10}{rat('hybrid_over_dspark'):>15}"
                     f"{rat('hybrid_over_ngram'):>14}{rat('hybrid_over_dspark_lag0'):>17}{acc('dspark'):>12}{acc('ngram'):>11}{acc('hybrid'):>12}")
    return "\n".join(lines)
