"""benchmarks/trace_vs_simulate.py's results as markdown (pure: rows in, text out)."""
from __future__ import annotations


def _per(values, fmt="{}") -> str:
    """Per-round figures, separated by commas (fmt: a format string or a function)."""
    show = fmt if callable(fmt) else fmt.format
    return ", ".join(show(v) for v in values) or "-"


def _first(pair) -> str:
    """First loss difference / first re-plan (iterations)."""
    c, replan = pair
    return (f"{'-' if c['first_difference'] is None else c['first_difference']}/"
            f"{'-' if replan is None else replan}")


def _diff(x) -> str:
    return "-" if x is None else f"{x:.1g}"


def markdown(rows: list[dict], head: str, a, N: int, window_s: float,
             samples_per_iteration: int, free_ref: list[dict]) -> str:
    X = a.time_scale
    md = [
        "# A real spot-trace replay against `recycle simulate`",
        "",
        head,
        "",
        f"Grid {a.d}x{a.s}, M={a.m}, GPT `{a.model_args}`, planned on the spec `recycle "
        f"profile` measured for it; {N} iterations, `--snapshot-every {a.snapshot_every} "
        f"--checkpoint-every {a.checkpoint_every} --timeout 4 --no-detect-stragglers`. "
        f"Window: {a.trace_hours:g} h of each trace from {a.trace_start}, at {X:g}x: "
        f"{window_s:.1f} s of wall time. {a.rounds} rounds, failure-free and trace runs "
        f"interleaved; per-round figures are separated by commas. Realised: iterations trained in "
        f"the window over the failure-free run's in its own (same round); in brackets over "
        f"what the trace run's own failure-free rate (before its first kill and after the "
        f"window, every worker up) gives in the window. Simulated: `recycle simulate`, policy "
        f"`recycle`, same window, grid, placement and K, costs below.",
        "",
        "| trace window, nodes | node events / workers killed / restarted | moves / snapshot "
        "restores / halts: run | the same, simulated | samples in the window: trace / "
        "failure-free | realised | simulated | **realised / simulated** | simulated, "
        "replacements delayed as measured | realised / that |",
        "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        el, sim, sd = r["elastic"], r["simulated"], r["simulated_delayed"]
        g = r["gpus_per_node"]
        own = r["realised_own_rate"]
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        md.append(
            f"| {r['case'].split('-')[0].upper()}, {g} GPU{'s' if g > 1 else ''} a node, "
            f"{r['placement']} | {r['node_events']} / {_per(r['deaths'])} / "
            f"{_per(e['trace_restarts'] for e in el)} | "
            f"{_per(e['moves'] for e in el)} / {_per(e['restore_events'] for e in el)} / "
            f"{r['halts']} | {sim['moves']} / {sim['snapshot_restores']} / 0 | "
            f"{mean(r['window_iterations']) * samples_per_iteration:.0f} / "
            f"{mean(r['free_window_iterations']) * samples_per_iteration:.0f} | "
            f"{_per(r['realised'], '{:.3f}')} ({_per(own, '{:.3f}')}) | {sim['kept']:.3f} | "
            f"**{r['ratio']:.2f}** ({'-' if r['ratio_own_rate'] is None else format(r['ratio_own_rate'], '.2f')}) | "
            f"{sd['kept']:.3f} | {r['ratio_delayed']:.2f} |")
    env = max([1e-5] + [c["max_scaled_diff"] for c in free_ref])
    md += ["", "Exactness: losses and stage checksums against the failure-free run of the same "
           "round and the one-process `--reference` run, scaled as `recycle compare` scales "
           "them (|x - y| / max(1, |x|, |y|); its pass is 1e-5). A re-routed micro-batch sums "
           "in another order, and over hundreds of iterations Adam grows that fp32 rounding: "
           "the failure-free runs themselves end "
           f"{_per(sorted({round(c['max_scaled_diff'], 7) for c in free_ref}), '{:.1g}')} from "
           "the reference, so a trace run counts as exact when its losses are bit-identical "
           "to the failure-free run's until its first re-plan and it ends no further from "
           f"it than that ({env:.1g}); a wrong state would jump at the event instead.", "",
           "| case | bit-identical until the first re-plan (first difference / first re-plan, "
           "iteration) | largest scaled difference: to the failure-free run / to the "
           "reference | exact |", "| --- | --- | --- | --- |"]
    for r in rows:
        ff, rf = r["vs_failure_free"], r["vs_reference"]
        md.append(f"| {r['case']} | {'yes' if r['identical_until_replan'] else 'NO'} "
                  f"({_per(zip(ff, r['first_replan']), _first)}) | "
                  f"{_per((c['max_scaled_diff'] for c in ff), '{:.1g}')} / "
                  f"{_per((c['max_scaled_diff'] for c in rf), '{:.1g}')} | "
                  f"{'yes' if r['identical_until_replan'] and r['within_rounding'] else 'NO'} |")
    md.append("")
    md += [f"Costs the simulations used (wall seconds measured in the runs; times {X:g} on "
           "the trace's clock):", "",
           "| case | failure-free iteration | SIGKILL to every survivor on the next plan "
           "(detection) | replacement process: started to back | trace run's wall time |",
           "| --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        c = r["costs"]
        md.append(f"| {r['case']} | {c['iter_s'] / X * 1e3:.0f} ms ({c['iter_s']:.1f} s) | "
                  f"{c['detect_s'] / X:.2f} s ({c['detect_s']:.0f} s) | "
                  f"{c['start_s'] / X:.2f} s ({c['start_s']:.0f} s) | "
                  f"{_per(r['wall_s'], '{:.0f} s')} |")
    halts = [h for r in rows for h in r["halt_reasons"]]
    if halts:
        md += ["", "Halts:", ""] + [f"- {h}" for h in halts]
    md += ["", EXPLAIN.format(X=X), ""]
    return "\n".join(md) + "\n"


EXPLAIN = """What makes the ratio differ from 1:
- Process start and state load do not compress: a replacement takes the wall time above to
  start and join, {X:g}x that on the trace's clock, while the simulator has the new node's
  workers training the moment the trace adds it (the delayed column moves that back).
- The simulator charges a re-routed plan's planned period while a worker is missing; here 6
  worker processes share 2 cores, so fewer of them each get more CPU, and a starting
  process takes CPU from those training. The load other jobs put on the machine moves both
  runs' rates by more than the trace does (hence the run's own failure-free rate, in
  brackets).
- A rollback to a snapshot and the iteration in flight cost iterations of about the
  measured length; detection is the measured SIGKILL-to-next-plan time. When several
  workers die at one instant the run re-plans once per death, the simulator once."""
