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


def _none(x) -> str:
    return "-" if x is None else str(x)


def _realised(r: dict) -> str:
    halted = set(r.get("halted_rounds", ()))
    per = ", ".join(f"{x:.3f}{'h' if i in halted else ''}"
                    for i, x in zip(r.get("rounds", range(len(r["realised"]))), r["realised"]))
    return per


def _own(r: dict) -> str:
    """Realised over the run's own failure-free rate, per round, and its median over the
    simulated figure."""
    if r["ratio_own_rate"] is None:
        return "-"
    return f"{r['ratio_own_rate']:.2f} ({_per(r['realised_own_rate'], '{:.3f}')})"


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
        f"interleaved; per-round figures are separated by commas (h: that run halted). "
        f"Realised: iterations trained in "
        f"the window over the failure-free run's in its own (same round); \"over the run's "
        f"own rate\": over what the trace run's own failure-free rate (before its first kill "
        f"and after the window, every worker up) gives in the window (median ratio, then "
        f"per round). Simulated: `recycle simulate`, policy "
        f"`{getattr(a, 'policy', 'recycle-roles')}`, same window, grid, placement and K, "
        f"costs below.",
        "",
        "| trace window, nodes | node events / workers killed / restarted (completed runs) | "
        "moves / snapshot restores / shape changes (completed runs) / halts: run | the same, simulated | samples in the window: trace / "
        "failure-free | realised, per round | realised (median) | simulated | **realised / "
        "simulated** | the same, over the run's own rate | simulated, replacements delayed "
        "as measured | realised / that |",
        "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        el, sim, sd = r["elastic"], r["simulated"], r["simulated_delayed"]
        g = r["gpus_per_node"]
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        md.append(
            f"| {r['case'].split('-')[0].upper()}, {g} GPU{'s' if g > 1 else ''} a node, "
            f"{r['placement']} | {r['node_events']} / {_per(r['deaths'])} / "
            f"{_per(e['trace_restarts'] for e in el)} | "
            f"{_per(e['moves'] for e in el)} / {_per(e['restore_events'] for e in el)} / "
            f"{_per(e.get('shape_changes', 0) for e in el)} / "
            f"{r['halts']} | {sim['moves']} / {sim['snapshot_restores']} / "
            f"{sim.get('shape_changes', 0)} / 0 | "
            f"{mean(r['window_iterations']) * samples_per_iteration:.0f} / "
            f"{mean(r['free_window_iterations']) * samples_per_iteration:.0f} | "
            f"{_realised(r)} | {r['realised_median']:.3f} | {sim['kept']:.3f} | "
            f"**{r['ratio']:.2f}** | {_own(r)} | {sd['kept']:.3f} | {r['ratio_delayed']:.2f} |")
    f = free_ref[0] if free_ref else {}
    md += ["", "Exactness: each trace run's losses against the failure-free run's of its round "
           "(and the one-process `--reference` run's). A re-routed micro-batch sums in "
           "another order, and Adam grows that fp32 rounding, gradually: the failure-free "
           "runs' losses differ from the reference's from iteration "
           f"{f.get('first_difference')} and "
           + (f"by over 1e-5 from iteration {f['first_over_1e-5']}" if f.get("first_over_1e-5")
              is not None else "never by over 1e-5 in these iterations")
           + ". A run counts as exact when its losses are "
           "bit-identical to the failure-free run's until its first re-plan and never jump: "
           "no loss differs by over 1e-5 within 50 iterations of all differing by under "
           "1e-6 (what a wrong state does). Halted runs have no summary.", "",
           "| case | first difference / first re-plan (iteration) | first difference over "
           "1e-5 | jump at | largest loss difference | exact |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ff = r["vs_failure_free"]
        md.append(f"| {r['case']} | {_per(zip(ff, r['first_replan']), _first)} | "
                  f"{_per((c['first_over_1e-5'] for c in ff), _none)} | "
                  f"{_per((c['jump'] for c in ff), _none)} | "
                  f"{_per((c['max_loss_diff'] for c in ff), '{:.1g}')} | "
                  f"{'yes' if r['identical_until_replan'] and r['no_jump'] else 'NO'} |")
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
    halts = [f"- {r['case']}, round {k}: {h.split('; newest checkpoint')[0].split('; no complete')[0]}"
             for r in rows for k, h in zip(r.get("halted_rounds", ()), r["halt_reasons"])]
    if halts:
        md += ["", "Halts (exit 3):", ""] + halts
    starts = sorted(r["costs"]["start_s"] / X for r in rows)
    md += ["", EXPLAIN.format(X=X, start=starts[len(starts) // 2] if starts else 0.0), ""]
    return "\n".join(md) + "\n"


EXPLAIN = """What makes realised / simulated differ from 1: process start and state load do not
compress (a replacement takes about {start:.1f} s to start and load its stage, {X:g}x that on the
trace's clock, while the simulator's new node trains at once: the delayed column); 6 worker
processes share 2 cores, so a re-routed plan does not run at its planned period, and a
starting process takes CPU from those training; and the load of other jobs on this machine
moves single rounds by more than the trace costs."""
