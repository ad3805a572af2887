"""Gantt chart of a plan as SVG (or an HTML page around it).

One row per worker, grouped by replica; F/I/W/B/OPT in distinct colours; micro-batches
re-routed to a worker of another replica drawn hatched with a dark outline; failed workers
shown as a red row. With roles, each row names the worker that fills the slot, and a worker
that moved into it says from where. Hovering a box shows its action, micro-batch, owner and times.
"""
from __future__ import annotations

from html import escape

from planner.plan import Plan

COLORS = {"F": "#4C78A8", "I": "#54A24B", "W": "#F2B134", "B": "#8E6CBF", "OPT": "#9D9D9D"}
NAMES = {"F": "forward", "I": "input grad", "W": "weight grad", "B": "full backward",
         "OPT": "all-reduce + step"}
ROW, LEFT, TOP, WIDTH = 22, 118, 46, 1100


def render_svg(plan: Plan) -> str:
    job = plan.job
    end = max((a.end for w in plan.workers for a in w.actions), default=1) or 1
    scale = WIDTH / end
    failed = {tuple(f) for f in plan.failed}
    rows = [(d, s) for d in range(job.replicas) for s in range(job.stages)]
    height = TOP + ROW * len(rows) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" '
           f'height="{height}" font-family="sans-serif" font-size="11">',
           '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#000" '
           'stroke-opacity="0.35" stroke-width="2"/></pattern></defs>',
           f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">'
           f'{escape(_title(plan))}</text>']
    x = LEFT
    for op in ("F", "I", "W", "B", "OPT"):
        out.append(f'<rect x="{x}" y="24" width="12" height="12" fill="{COLORS[op]}"/>'
                   f'<text x="{x + 16}" y="34">{op} {NAMES[op]}</text>')
        x += 155
    out.append(f'<rect x="{x}" y="24" width="12" height="12" fill="#ccc"/>'
               f'<rect x="{x}" y="24" width="12" height="12" fill="url(#hatch)" stroke="#000"/>'
               f'<text x="{x + 16}" y="34">re-routed micro-batch</text>')
    by_key = {(w.replica, w.stage): w for w in plan.workers}
    for i, (d, s) in enumerate(rows):
        y = TOP + i * ROW
        if d > 0 and s == 0:
            out.append(f'<line x1="0" x2="{LEFT + WIDTH}" y1="{y - 1}" y2="{y - 1}" stroke="#888"/>')
        who = _who(plan, d, s)
        out.append(f'<text x="4" y="{y + 15}">replica {d} stage {s}</text>'
                   + (f'<title>{escape(who)}</title>' if who else ""))
        if who:
            out.append(f'<text x="{LEFT - 4}" y="{y + 15}" text-anchor="end" fill="#555" '
                       f'font-size="9">{escape(who.split(" ")[0])}</text>')
        if (d, s) in failed:
            out.append(f'<rect x="{LEFT}" y="{y + 2}" width="{WIDTH}" height="{ROW - 4}" '
                       f'fill="#fbe3e3"/><text x="{LEFT + 6}" y="{y + 15}" fill="#b00">'
                       f'FAILED: its micro-batches run on stage-{s} peers</text>')
            continue
        for a in by_key[(d, s)].actions:
            ax, aw = LEFT + a.start * scale, max((a.end - a.start) * scale, 0.8)
            rerouted = a.microbatch is not None and job.owner(a.microbatch) != d
            tip = (f"{a.label(s)} on replica {d} stage {s}: {a.start}..{a.end}"
                   + (f" (micro-batch of replica {job.owner(a.microbatch)})" if rerouted else ""))
            out.append(f'<g><title>{escape(tip)}</title><rect x="{ax:.2f}" y="{y + 2}" '
                       f'width="{aw:.2f}" height="{ROW - 4}" fill="{COLORS[a.op]}" '
                       f'stroke="{"#000" if rerouted else "#fff"}" stroke-width="{1.2 if rerouted else 0.4}"/>')
            if rerouted:
                out.append(f'<rect x="{ax:.2f}" y="{y + 2}" width="{aw:.2f}" height="{ROW - 4}" '
                           f'fill="url(#hatch)"/>')
            if a.microbatch is not None and aw > 14:
                out.append(f'<text x="{ax + aw / 2:.2f}" y="{y + 15}" text-anchor="middle" '
                           f'fill="#fff">{a.microbatch}</text>')
            out.append("</g>")
    axis_y = TOP + ROW * len(rows) + 14
    for k in range(11):
        t = round(end * k / 10)
        out.append(f'<text x="{LEFT + t * scale:.1f}" y="{axis_y}" text-anchor="middle" '
                   f'fill="#555">{t}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _who(plan: Plan, d: int, s: int) -> str:
    """With roles: the worker filling slot (d, s), and its move if it made one."""
    if plan.roles is None:
        return ""
    w = plan.worker_id(d, s)
    if w is None:
        return ""
    mv = next((m for m in plan.moves or [] if m.worker == w), None)
    if mv is None:
        return w
    frm = "fresh" if mv.from_stage is None else f"stage {mv.from_stage}"
    return f"{w} (moved from {frm}, {mv.bytes} bytes from {mv.source})"


def _title(plan: Plan) -> str:
    m = plan.metrics
    failed = ", ".join(f"{r}:{s}" for r, s in plan.failed) or "none"
    moves = f"  moves: {len(plan.moves)}" if plan.moves else ""
    return (f"{plan.solver.name} ({plan.solver.status}) D={plan.job.replicas} "
            f"S={plan.job.stages} M={plan.job.microbatches} failed: {failed}  period {m.period}  "
            f"makespan {m.makespan}  bound {m.lower_bound}  gap {m.gap:.1%}{moves}")


def render_html(plan: Plan) -> str:
    return ("<!doctype html><html><head><meta charset='utf-8'><title>ReCycle plan</title>"
            "</head><body style='margin:12px'>" + render_svg(plan) + "</body></html>\n")


def write_gantt(plan: Plan, path: str) -> None:
    text = render_html(plan) if path.endswith((".html", ".htm")) else render_svg(plan)
    with open(path, "w") as fh:
        fh.write(text)
