"""A real spot-trace replay against `recycle simulate`'s prediction for the same window.

Per round, side by side: a failure-free `recycle train` of the grid (replaying a trace whose
nodes never leave, so its clock starts as the trace run's does) and, per case, the same run
replaying a window of a real EC2 spot trace (`--trace FILE --trace-start --trace-hours
--time-scale X --snapshot-every K`). Both plan with the job spec `recycle profile` measured
for this model and train past the window's end.

Realised progress: iterations the trace run completed in the trace's compressed window
(wall [t0, t0 + hours*3600/X], t0 when every worker is in and the trace's clock starts),
over those the failure-free run of the same round completed in its own window of the same
length; and, less exposed to the load other jobs put on a shared machine, over the trace
run's own failure-free rate (its stretches with every worker up: before the first kill and
after the window, once every replacement is back). Simulated progress: `recycle
simulate`'s `recycle-short` policy (`--policy`; the runtime's rule: roles on the job's own
partition, the shape cut once fewer workers than stages live) on
the same window (written as a spot trace), grid, M, --gpus-per-node, --placement and --snapshot-every, on the profiled spec with its time unit
set so that the failure-free iteration lasts what it lasted in the runs (times X: the
simulator runs on the trace's clock); detection = the runs' median time from a SIGKILL to
every survivor training under the next plan (their summaries' `recovery`), times X. A
second simulation also delays each recovery by the runs' median replacement start (times
X), as the replay did. Exactness: each trace run's summary against the failure-free run's
and the one-process --reference run's.

    PYTHONPATH=. python benchmarks/trace_vs_simulate.py [--rounds 2] [--time-scale 180]

Writes benchmarks/results/trace_vs_simulate.md and .json (and prints the table).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.trace_progress import (closeness, delayed_events, first_replan, identical_until_replan,
                                       median_or, parse_lines,  # noqa: E402
                                       own_rate, recovery_seconds, restore_events,
                                       simulated, window_progress, write_eventless,
                                       write_failstop, write_window)
from executor.launch.faults.trace_replay import load_window  # noqa: E402
from planner.simulation.trace import Placement, parse_duration  # noqa: E402

PY = sys.executable
# A GPT whose iteration (about 0.1 s here) is mostly compute, so that the profiled costs
# mean something, and short enough a run (hundreds of iterations) that fp32 rounding
# between re-routed and failure-free runs stays inside compare()'s 1e-5.
MODEL = "--vocab 64 --seq-len 32 --d-model 128 --layers 3 --heads 4 --micro-batch-size 4"


@dataclass(frozen=True)
class Case:
    trace: str  # p3 | g4dn (benchmarks/traces/NAME-trace.csv)
    gpus_per_node: int
    placement: str

    @property
    def path(self) -> str:
        return os.path.join("benchmarks", "traces", f"{self.trace}-trace.csv")

    @property
    def name(self) -> str:
        return f"{self.trace}-g{self.gpus_per_node}-{self.placement}"

    @classmethod
    def parse(cls, text: str) -> "Case":
        trace, g, placement = text.split(":")
        return cls(trace, int(g), placement)


def run_cli(args: list[str], timeout: float) -> tuple[int, list[tuple[float, str]], float]:
    """`python -m recycle.cli ARGS`, each output line stamped on arrival (monotonic s)."""
    from planner.procs import die_with_parent
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", COLUMNS="200")
    t0 = time.monotonic()
    p = subprocess.Popen([PY, "-m", "recycle.cli", *args], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         preexec_fn=die_with_parent)  # its workers die with it (worker.py)
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    lines = [(time.monotonic(), line) for line in p.stdout]
    rc = p.wait()
    timer.cancel()
    return rc, lines, time.monotonic() - t0


def train(args: list[str], summary: str, timeout: float) -> dict:
    """One `recycle train` run: its lines parsed, its summary (None if it halted)."""
    rc, lines, wall = run_cli(["train", *args, "--summary", summary], timeout)
    with open(os.path.splitext(summary)[0] + ".log", "w") as fh:  # kept for a look after
        fh.write("".join(f"{t - lines[0][0]:8.3f} {x}" for t, x in lines) if lines else "")
    log = parse_lines(lines)
    if rc == 3 and log.halted:  # a halt: counted, and its progress up to it
        return {"log": log, "summary": None, "path": None, "wall": wall}
    if rc != 0:
        raise SystemExit(f"recycle train {' '.join(args)} exited {rc}:\n"
                         + "".join(x for _, x in lines)[-3000:])
    with open(summary) as fh:
        return {"log": log, "summary": json.load(fh), "path": summary, "wall": wall}


def load(path: str) -> dict:
    with open(path) as fh:
        return json.load(fh)


def simulate(job: str, trace: str, hours: float, case: Case, unit_s: float, costs: dict,
             K: int, fmt: str, policy: str) -> dict:
    g = 1 if fmt == "failstop" else case.gpus_per_node  # fail-stop names every worker
    args = ["simulate", job, "--trace", trace, "--trace-format", fmt, "--hours", str(hours),
            "--gpus-per-node", str(g), "--placement", case.placement,
            "--unit-s", repr(unit_s), "--detect-seconds", repr(costs["detect_s"]),
            "--restart-minutes", repr(costs["restart_s"] / 60),
            "--checkpoint-minutes", repr(costs["checkpoint_s"] / 60),
            "--snapshot-every", str(K), "--policy", policy, "--json", "--no-progress",
            "--jobs", "1"]
    rc, lines, _ = run_cli(args, 300)
    text = "".join(t for _, t in lines)
    if rc != 0:
        raise SystemExit(f"recycle simulate exited {rc}: {text[-2000:]}")
    return simulated(json.loads(text[text.index("{"):]), policy)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", default=[],
                    help="TRACE:G:PLACEMENT (default p3:1:stages p3:2:replicas g4dn:1:stages)")
    ap.add_argument("--trace-start", default="1h")
    ap.add_argument("--trace-hours", type=float, default=2.0)
    ap.add_argument("--time-scale", type=float, default=180.0)
    ap.add_argument("--snapshot-every", type=int, default=5)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=None,
                    help="default: 1.5x what fits the window, from a calibration run")
    ap.add_argument("--model-args", default=MODEL, help="model flags of `recycle train`")
    ap.add_argument("-d", type=int, default=2)
    ap.add_argument("-s", type=int, default=3)
    ap.add_argument("-m", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/trace_vs_simulate.md")
    ap.add_argument("--policy", default="recycle-short",
                    help="the simulated policy the runs are held against")
    a = ap.parse_args()
    cases = [Case.parse(c) for c in a.case] or [
        Case("p3", 1, "stages"), Case("p3", 2, "replicas"), Case("g4dn", 1, "stages")]
    X, hours = a.time_scale, a.trace_hours
    start_s, window_s = parse_duration(a.trace_start), hours * 3600 / a.time_scale
    work = tempfile.mkdtemp(prefix="trace-vs-simulate-")
    load0 = os.getloadavg()[0]
    model = shlex.split(a.model_args)
    grid = ["-d", str(a.d), "-s", str(a.s), "-m", str(a.m)]

    # the job spec: this model's per-stage costs, measured; every run plans with it
    job = os.path.join(work, "job.json")
    rc, lines, _ = run_cli(["profile", *model, *grid, "--out", job], 300)
    if rc != 0:
        raise SystemExit("recycle profile failed:\n" + "".join(t for _, t in lines))
    from planner.inputs.limits import load_spec
    from planner.simulation.costs import greedy_period
    P0 = greedy_period(load_spec(job))  # the failure-free plan's period, in spec units

    eventless = os.path.join(work, "eventless.csv")
    write_eventless(eventless, a.d * a.s)
    common = [*model, *grid, "--job", job, "--time-scale", repr(X), "--trace-hours",
              repr(hours), "--snapshot-every", str(a.snapshot_every), "--checkpoint-every",
              str(a.checkpoint_every), "--timeout", "4",
              "--no-detect-stragglers"]  # on a shared machine it re-plans on noise
    N = a.iterations
    if N is None:  # a failure-free run gives the rate; the window needs rate * window_s
        cal = train(common + ["--iterations", "150", "--trace", eventless, "--run-dir",
                              os.path.join(work, "cal")], os.path.join(work, "cal.json"), 600)
        its = cal["log"].iters[len(cal["log"].iters) // 3:]  # past the warm-up
        rate = (its[-1][1] - its[0][1]) / (its[-1][0] - its[0][0])
        N = int(math.ceil(rate * window_s * 1.5)) + 20
        print(f"calibration: {rate:.1f} iterations/s failure-free: {N} iterations", flush=True)
    common += ["--iterations", str(N)]
    ref = os.path.join(work, "ref.json")
    rc, lines, _ = run_cli(["train", *model, *grid, "--job", job, "--iterations", str(N),
                            "--reference", "--summary", ref], 1200)
    if rc != 0:
        raise SystemExit("the reference run failed:\n" + "".join(t for _, t in lines)[-2000:])

    free, got = [], {c: [] for c in cases}
    for r in range(a.rounds):
        order = [None, *cases] if r % 2 == 0 else [*cases[::-1], None]  # interleaved A/B
        for c in order:
            tag = f"r{r}-{'free' if c is None else c.name}"
            extra = (["--trace", eventless] if c is None else
                     ["--trace", c.path, "--trace-start", a.trace_start, "--gpus-per-node",
                      str(c.gpus_per_node), "--placement", c.placement])
            res = train(common + extra + ["--run-dir", os.path.join(work, tag)],
                        os.path.join(work, f"{tag}.json"), 120 + 10 * window_s)
            # ~15 MB of DCP checkpoints a run; the logs and summary are what we read
            shutil.rmtree(os.path.join(work, tag, "checkpoints"), ignore_errors=True)
            log = res["log"]
            res["progress"] = window_progress(log, window_s, halted=log.halted)
            res["own_rate"] = own_rate(log, window_s)
            res["round"] = r
            (free if c is None else got[c]).append(res)
            print(f"{tag}: {res['progress']:.1f} iterations in the {window_s:.1f} s window, "
                  f"run {res['wall']:.1f} s, " + ("HALTED: " + log.halt_reason if log.halted
                                                  else f"{res['summary'].get('elastic')}"),
                  flush=True)
    rows = [case_row(c, got[c], free, ref, job, P0, a, work, start_s, window_s) for c in cases]
    write(rows, a, N, window_s, P0, load0, free, ref)
    print(f"run logs, worker logs and summaries in {work}")


def case_row(c: Case, runs, free, ref, job, P0, a, work, start_s, window_s) -> dict:
    X, hours = a.time_scale, a.trace_hours
    done = [b for b in runs if b["summary"] is not None]  # not halted
    vs_free = [closeness(b["summary"], free[b["round"]]["summary"]) for b in done]
    vs_ref = [closeness(b["summary"], load(ref)) for b in done]
    iter_wall = statistics.mean(window_s / f["progress"] for f in free)
    costs = {"iter_s": iter_wall * X,
             "detect_s": X * median_or([s for b in done for s in recovery_seconds(b["summary"])]),
             "start_s": X * median_or([s for b in runs for s in b["log"].starts])}
    costs["restart_s"] = max(costs["start_s"], 1.0)
    costs["checkpoint_s"] = a.checkpoint_every * costs["iter_s"]
    unit_s = costs["iter_s"] / P0  # the profiled period lasts the measured iteration
    win = os.path.join(work, f"{c.name}-window.csv")
    node_events = write_window(c.path, start_s, hours, win)
    tr = load_window(c.path, Placement(a.d, a.s, c.gpus_per_node, c.placement), start_s, hours)
    sim = simulate(job, win, hours, c, unit_s, costs, a.snapshot_every, "spot", a.policy)
    delayed = os.path.join(work, f"{c.name}-delayed.csv")
    write_failstop(delayed, delayed_events(tr, costs["start_s"]))
    sim_d = simulate(job, delayed, hours, c, unit_s, costs, a.snapshot_every, "failstop",
                     a.policy)
    realised = [b["progress"] / free[b["round"]]["progress"] for b in runs]
    own = [b["progress"] / (b["own_rate"] * window_s) for b in runs if b["own_rate"]]
    kept = statistics.median(realised)  # the machine's load moves single rounds
    return {
        "case": c.name, "trace": c.path, "gpus_per_node": c.gpus_per_node,
        "placement": c.placement, "node_events": node_events,
        "worker_events": len(tr.events), "worker_failures": tr.failures,
        "realised": realised, "realised_median": kept, "rounds": [b["round"] for b in runs],
        "realised_own_rate": own,
        "simulated": sim, "ratio": kept / sim["kept"] if sim["kept"] else None,
        "ratio_own_rate": statistics.median(own) / sim["kept"] if own and sim["kept"] else None,
        "simulated_delayed": sim_d,
        "ratio_delayed": kept / sim_d["kept"] if sim_d["kept"] else None,
        "window_iterations": [b["progress"] for b in runs],
        "free_window_iterations": [free[b["round"]]["progress"] for b in runs],
        "elastic": [dict(b["summary"]["elastic"], restore_events=restore_events(b["summary"]))
                    for b in done],
        "deaths": [b["log"].deaths for b in runs], "halts": sum(b["log"].halted for b in runs),
        "halt_reasons": [b["log"].halt_reason for b in runs if b["log"].halted],
        "wall_s": [round(b["wall"], 1) for b in runs],
        "vs_failure_free": vs_free, "vs_reference": vs_ref,
        "first_replan": [first_replan(b["summary"]) for b in done],
        "identical_until_replan": bool(done) and all(
            identical_until_replan(c, first_replan(b["summary"])) for c, b in zip(vs_free, done)),
        # fp32 rounding grows gradually; a wrong state jumps (trace_progress.closeness)
        "no_jump": bool(done) and all(c["jump"] is None for c in vs_free),
        "halted_rounds": [b["round"] for b in runs if b["summary"] is None],
        "costs": costs, "unit_s": unit_s,
    }


def write(rows, a, N, window_s, P0, load0, free, ref) -> None:
    from benchmarks.trace_report import markdown
    cmd = "PYTHONPATH=. python benchmarks/trace_vs_simulate.py" + (
        "" if len(sys.argv) == 1 else " " + " ".join(shlex.quote(x) for x in sys.argv[1:]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    free_ref = [closeness(f["summary"], load(ref)) for f in free]
    head = (f"Made by `{cmd}` at commit {commit} ({platform.machine()}, {os.cpu_count()} "
            f"cores shared with other jobs, 1-min load {load0:.1f} at the start and "
            f"{os.getloadavg()[0]:.1f} at the end, CPU workers, Python "
            f"{platform.python_version()}, {time.strftime('%Y-%m-%d', time.gmtime())}).")
    mbs = int(a.model_args.split("--micro-batch-size")[1].split()[0]) \
        if "--micro-batch-size" in a.model_args else 4
    text = markdown(rows, head, a, N, window_s, a.d * a.m * mbs, free_ref)
    print(text)
    with open(os.path.join(ROOT, a.out), "w") as fh:
        fh.write(text)
    data = {"command": cmd, "commit": commit, "iterations": N, "time_scale": a.time_scale,
            "window_s": window_s, "period_units": P0, "rows": rows,
            "free_window_iterations": [f["progress"] for f in free],
            "free_own_rates": [f["own_rate"] for f in free],
            "free_window_rates": [f["progress"] / window_s for f in free],
            "failure_free_vs_reference": free_ref}
    with open(os.path.join(ROOT, os.path.splitext(a.out)[0] + ".json"), "w") as fh:
        json.dump(data, fh, indent=1, default=str)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
