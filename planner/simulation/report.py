"""What a simulation shows: a table, JSON for scripts, throughput over time as PNG / HTML."""
from __future__ import annotations

import html
import json
from typing import Optional

from planner.simulation.compare import Result

COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#ff7f0e", "#e377c2",
          "#17becf"]


def rows(result: Result) -> list[dict]:
    """Per policy: throughput kept (of failure-free), samples, stall, work lost, and
    ReCycle's throughput over this policy's (> 1: ReCycle trains more)."""
    spm = result.model.samples_per_microbatch
    names = [o.policy for o in result.outcomes]
    ref = result.outcome("recycle").microbatches if "recycle" in names else None
    out = []
    for o in result.outcomes:
        out.append({
            "policy": o.policy,
            "kept": o.microbatches / result.ideal if result.ideal else 0.0,
            "samples": o.microbatches * spm,
            "stalled_h": o.stalled_s / 3600,
            "lost_samples": o.lost * spm,
            "failures": o.failures,
            "restarts": o.restarts,
            # None where undefined: no ReCycle run, or a policy that kept nothing
            "recycle_ratio": ref / o.microbatches if ref is not None and o.microbatches > 0
            else None,
        })
    return out


def limit_shares(result: Result, ref: str = "limit") -> dict[str, float]:
    """Each policy's samples over the limit's (docs/design.md section 12); empty without a
    limit run."""
    names = [o.policy for o in result.outcomes]
    if ref not in names or result.outcome(ref).microbatches <= 0:
        return {}
    top = result.outcome(ref).microbatches
    return {o.policy: o.microbatches / top for o in result.outcomes}


LOST = {"inflight": "iteration in flight", "snapshot": "since the snapshot (rollback)",
        "checkpoint": "since the checkpoint (restore)", "fraction": "skipped"}


SLOWER = "slower than the limit"
SHAPE_GAP = "slower than the best one-depth shape"
SCHEDULE_GAP = "the bound's relaxation (bubbles, p2p, whole workers)"


def remainder(result: Result, policy: str = "recycle", ref: str = "limit") -> dict[str, float]:
    """Where `policy`'s remainder to the limit goes, in micro-batches, exactly: what the
    limit trains while `policy` stalls, per cause of the stall (detection, state moves,
    restart, paused, ...); the work `policy` trains and loses, per kind; and, while it
    trains, the difference of the two rates. With a `shape-limit` run that difference is
    split in two: what the best one-depth shape the planner schedules trains beyond
    `policy` (the shape and roles it keeps), and what the limit trains beyond that shape
    (what the bound leaves out: bubbles, p2p latency, whole workers); otherwise it is one
    part, "slower than the limit". The parts add up to the limit's micro-batches less the
    policy's."""
    T = result.duration_s
    limit = _integral(result.outcome(ref).segments, T)
    o = result.outcome(policy)
    out: dict[str, float] = {}
    for a, b, cause in o.stall_spans:
        out[cause] = out.get(cause, 0.0) + limit(a, b)
    for kind, mb in o.lost_by.items():
        name = LOST.get(kind, kind)
        out[name] = out.get(name, 0.0) + mb
    training = [(a, min(b, T), r) for a, b, r in o.segments if a < T]
    if "shape-limit" not in {x.policy for x in result.outcomes}:
        out[SLOWER] = sum(limit(a, b) - r * (b - a) for a, b, r in training)
        return out
    shape = _integral(result.outcome("shape-limit").segments, T)
    out[SHAPE_GAP] = sum(shape(a, b) - r * (b - a) for a, b, r in training)
    out[SCHEDULE_GAP] = sum(limit(a, b) - shape(a, b) for a, b, _ in training)
    return out


def _integral(segments, T: float):
    """f(a, b): the micro-batches the (t0, t1, rate) segments train in [a, b) within [0, T)."""
    import bisect

    segs = sorted(segments)
    starts = [a for a, _, _ in segs]
    cum = [0.0]
    for a, b, r in segs:
        cum.append(cum[-1] + r * (b - a))

    def upto(t: float) -> float:
        i = bisect.bisect_right(starts, t)
        if i == 0:
            return 0.0
        a, b, r = segs[i - 1]
        return cum[i - 1] + r * (min(t, b) - a)

    def between(a: float, b: float) -> float:
        a, b = max(0.0, a), min(T, b)
        return upto(b) - upto(a) if b > a else 0.0

    return between


def series(result: Result, bins: int = 240) -> tuple[list[float], dict[str, list[float]]]:
    """Hours at bin centres, and per policy its mean training rate in each bin as a share
    of the failure-free rate (stalls count as zero; lost work is not subtracted)."""
    T = result.duration_s
    width = T / bins
    hours = [(i + 0.5) * width / 3600 for i in range(bins)]
    out = {}
    for o in result.outcomes:
        acc = [0.0] * bins
        for a, b, rate in o.segments:
            i = int(a // width)
            while a < b and i < bins:
                end = min(b, (i + 1) * width)
                acc[i] += rate * (end - a)
                a, i = end, i + 1
        out[o.policy] = [v / width / result.base_rate for v in acc]
    return hours, out


def to_json(result: Result, command: str = "") -> str:
    hours, ser = series(result, 120)
    return json.dumps({
        "command": command,
        "job": {"replicas": result.job.replicas, "stages": result.job.stages,
                "microbatches": result.job.microbatches, "model": result.model.name},
        "trace": {"source": result.trace.source, "failures": result.trace.failures,
                  "hours": result.duration_s / 3600},
        "failure_free_samples_per_s": result.base_rate * result.model.samples_per_microbatch,
        "policies": rows(result),
        "limit_shares": limit_shares(result),  # each policy's samples over the limit's
        # where recycle's remainder to the limit goes, in samples (remainder())
        "remainder_samples": {k: v * result.model.samples_per_microbatch
                              for k, v in (remainder(result) if {"recycle", "limit"} <= {
                                  o.policy for o in result.outcomes} else {}).items()},
        "policy_stats": result.policy_stats,  # the recycle policy's moves and restores
        "stats": result.stats,  # the same per elastic policy (recycle, recycle-roles)
        "series": {"hours": hours, "throughput": ser},
    }, indent=1, default=lambda x: None)


def markdown(result: Result) -> str:
    shares = limit_shares(result)
    lines = ["| policy | throughput kept | samples | stalled (h) | work lost (samples) | "
             "failures | restarts | ReCycle / policy |" + (" share of the limit |" if shares else ""),
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if shares else "")]
    for r in rows(result):
        ratio = r["recycle_ratio"]
        lines.append(f"| {r['policy']} | {r['kept']:.1%} | {r['samples']:.4g} | "
                     f"{r['stalled_h']:.2f} | {r['lost_samples']:.3g} | {r['failures']} | "
                     f"{r['restarts']} | {'-' if ratio is None else f'{ratio:.3f}x'} |"
                     + (f" {shares[r['policy']]:.1%} |" if shares else ""))
    return "\n".join(lines)


def write_png(result: Result, path: str, title: str = "") -> None:
    import matplotlib  # lazily: only this output needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours, ser = series(result)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    styles = ["-", "--", ":", "-."]
    for k, ((name, ys), color) in enumerate(zip(ser.items(), COLORS)):
        ax.step(hours, [100 * y for y in ys], where="mid", label=name, color=color, lw=1.3,
                ls=styles[k % len(styles)])
    ax.set_xlabel("hours")
    ax.set_ylabel("throughput, % of failure-free")
    ax.set_ylim(0, 105)
    ax.set_title(title or heading(result), fontsize=10)
    ax.legend(fontsize=8, ncol=4, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def heading(result: Result) -> str:
    j = result.job
    return (f"{result.model.name}, {j.replicas}x{j.stages} grid: {result.trace.source} "
            f"({result.trace.failures} failures)")


def write_html(result: Result, path: str, title: str = "") -> None:
    """A self-contained page: an SVG line per policy and the table, no script."""
    hours, ser = series(result)
    W, H, L, B = 860, 360, 50, 30
    T = hours[-1] + hours[0] if hours else 1

    def xy(h, y):
        return L + (W - L - 10) * h / T, (H - B) - (H - B - 10) * min(1.05, y) / 1.05

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 16}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect x="{L}" y="10" width="{W - L - 10}" height="{H - B - 10}" fill="none" '
             f'stroke="#999"/>']
    for pct in (0, 25, 50, 75, 100):
        _, y = xy(0, pct / 100)
        parts.append(f'<line x1="{L}" x2="{W - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{L - 5}" y="{y + 4:.1f}" text-anchor="end">{pct}%</text>')
    for i in range(0, 7):
        x, _ = xy(T * i / 6, 0)
        parts.append(f'<text x="{x:.1f}" y="{H - 12}" text-anchor="middle">'
                     f'{T * i / 6:.1f} h</text>')
    for k, ((name, ys), color) in enumerate(zip(ser.items(), COLORS)):
        pts = " ".join("%.1f,%.1f" % xy(h, y) for h, y in zip(hours, ys))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.4" '
                     f'points="{pts}"><title>{html.escape(name)}</title></polyline>')
        parts.append(f'<text x="{L + 10 + 105 * k}" y="{H + 10}" fill="{color}">'
                     f'&#9632; {html.escape(name)}</text>')
    parts.append("</svg>")
    table = ["<table><tr><th>policy</th><th>kept</th><th>samples</th><th>stalled (h)</th>"
             "<th>lost samples</th><th>ReCycle / policy</th></tr>"]
    for r in rows(result):
        ratio = "-" if r["recycle_ratio"] is None else f"{r['recycle_ratio']:.3f}x"
        table.append(f"<tr><td>{html.escape(r['policy'])}</td><td>{r['kept']:.1%}</td>"
                     f"<td>{r['samples']:.4g}</td><td>{r['stalled_h']:.2f}</td>"
                     f"<td>{r['lost_samples']:.3g}</td><td>{ratio}</td></tr>")
    table.append("</table>")
    doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>recycle simulate</title>"
           f"<style>body{{font-family:sans-serif}}td,th{{padding:2px 10px;text-align:right}}"
           f"</style></head><body><h3>{html.escape(title or heading(result))}</h3>"
           f"<p>Throughput over time, % of the failure-free rate.</p>{''.join(parts)}"
           f"{''.join(table)}</body></html>")
    with open(path, "w") as fh:
        fh.write(doc)


def check_writable(path: Optional[str]) -> None:
    """Fail before simulating, not after, when an output cannot be written."""
    import os

    if path is None:
        return
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise ValueError(f"cannot write {path}: no such directory or not writable")
