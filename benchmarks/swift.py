"""SWIFT's logging and replay as the runtime does it (executor/runtime/replay/), measured on
`recycle train`'s launcher and real worker processes:

1. steady state: ms per iteration with the boundary logs on (the default budget) against
   `--log-memory off`, no failure, interleaved rounds (each goes first in turn), median;
2. recovery from a stage lost whole (both workers of stage 1 of a 2x3 grid SIGKILLed in
   the iteration whose step is the next snapshot: K-1 iterations since the last one, the
   most a loss can cost), replay against the global rollback (logs off), for K = 5, 10,
   20: the time from the kill to the end of the iteration it hit (when the run is back
   where it was), the stage-iterations trained twice (rollback: every stage; replay: the
   lost stage's, alone), and the host memory a worker's log held;
3. the simulator fed these costs (planner/simulation: `recycle` and `swift-replay` pay
   the logging's 1% of throughput, a replay stalls for the lost stage's F+I+W per
   micro-batch since its snapshot) on the real spot traces of simulate_real.md: `recycle`
   as it runs now, `recycle` without logs (a stage lost whole rolls the job back), and
   `swift-replay` (fixed roles and partition, replaying).

    PYTHONPATH=. python benchmarks/swift.py [--rounds 3] [--iterations 30]

Writes benchmarks/results/swift.md (and prints it).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from benchmarks.executor_bench import bench_config
from executor.inputs.launch_spec import Faults, LaunchSpec, sections
from executor.launch.launcher import Coordinator
from planner.job import JobSpec

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 4
D, S, M = 2, 3, 4
MODEL = dict(d_model=128, n_layers=6, seq_len=32, micro_batch_size=2)  # two blocks a stage
# the steady state also on executor.md's configuration (benchmarks/bench_executor.py):
# larger messages for its compute (micro-batch 8, seq 64), one replica of two stages
CONFIGS = {"2x3, d_model 128, 6 blocks, seq 32, micro-batch 2, M=4": ((2, 3, 4), MODEL),
           "1x2, d_model 128, 4 blocks, seq 64, micro-batch 8, M=4 (executor.md's)":
               ((1, 2, 4), dict(d_model=128, n_layers=4, seq_len=64, micro_batch_size=8))}


def run_once(iterations: int, run_dir: str, log_memory: str, snapshot_every: int,
             kills=(), grid=(D, S, M), model=MODEL) -> dict:
    cfg = bench_config("gpt", **model)
    spec = LaunchSpec(cfg, JobSpec.uniform(*grid), iterations, solver="greedy",
                      deadline_s=900, run_dir=run_dir,
                      faults=Faults(kills=list(kills)), detect_stragglers=False,
                      **sections(timeout=30.0, checkpoint_every=10 ** 9,
                                 snapshot_every=snapshot_every, log_memory=log_memory))
    c = Coordinator(spec, console=Console(stderr=True, quiet=True))
    res = c.run()
    wall_minus_mono = time.time() - time.monotonic()  # kills are stamped in wall time
    if res.summary is None:
        raise SystemExit(f"halted: {res.halted} ({run_dir})")
    ends = {i: t + wall_minus_mono for i, t in c.iteration_end.items()}
    out = {"ends": ends, "elastic": res.summary.elastic, "losses": res.summary.losses,
           "kills_at": [t for t, _, _ in c.record.kills_at]}
    its = sorted(ends)
    steady = [ends[b] - ends[a] for a, b in zip(its, its[1:]) if a >= WARMUP]
    out["ms"] = 1e3 * statistics.median(steady) if steady else float("nan")
    return out


def steady_state(rounds: int, iterations: int, tmp: str) -> dict:
    """config -> {"on": [runs], "off": [runs]}, interleaved, each mode first in turn."""
    out = {}
    for k, (name, (grid, model)) in enumerate(CONFIGS.items()):
        got = out[name] = {"on": [], "off": []}
        for r in range(rounds):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                res = run_once(iterations, os.path.join(tmp, f"steady-{k}-{r}-{mode}"),
                               "10%" if mode == "on" else "off", snapshot_every=5,
                               grid=grid, model=model)
                got[mode].append(res)
                print(f"steady {name} round {r} logs {mode}: {res['ms']:.1f} ms/iteration, "
                      f"log {res['elastic']['log_mib_per_worker']:.2f} MiB", flush=True)
    return out


def recovery(k: int, mode: str, tmp: str) -> dict:
    hit = 2 * k - 1  # its step would be the second snapshot: k-1 iterations since the first
    res = run_once(hit + 4, os.path.join(tmp, f"recover-{k}-{mode}"),
                   "10%" if mode == "replay" else "off", snapshot_every=k,
                   kills=[(0, 1, hit), (1, 1, hit)])
    # the first iteration no stage can have finished before the kill: hit + 1 needs stage
    # 1's forward; its end is when the run is past where it was (hit + 2: one more, clean)
    back = res["ends"][hit + 2] - min(res["kills_at"])
    el = res["elastic"]
    retrained = el["retrained_iterations"] * S
    replayed = el["replayed_iterations"]  # of one stage
    print(f"K={k} {mode}: back in {back:.2f} s, replays {el['replays']}, "
          f"retrained {el['retrained_iterations']}, replayed {replayed}", flush=True)
    return {"back_s": back, "stage_iterations_redone": retrained + replayed,
            "replay_s": el["replay_s"], "replays": el["replays"], "ms": res["ms"],
            "log_mib": el["log_mib_per_worker"], "retrained": el["retrained_iterations"],
            "replayed": replayed}


SIM_ROWS = (2, 4, 0)  # simulate_real.ROWS: g4dn 3x8, g4dn 6x4, P3 4x8 (1 GPU a node)


def simulated() -> list[str]:
    from dataclasses import replace

    from benchmarks.simulate_real import ROWS, load
    from planner.simulation.compare import simulate
    from planner.simulation.policies import Params
    from planner.simulation.presets import PRESETS, UNIT_S, preset_job, preset_model
    sh = PRESETS["gpt3-2.7b"]
    out = ["| trace, grid | recycle | recycle, logs off (rollbacks) | swift-replay | "
           "recycle / logs off | recycle's replays, rollbacks |",
           "| --- | ---: | ---: | ---: | ---: | --- |"]
    for i in SIM_ROWS:
        name, fname, D, G, S, start_h = ROWS[i]
        model = preset_model("gpt3-2.7b", D)
        job = preset_job(model, D, S, 16, sh.seq, sh.d_model, 1)
        tr = load(fname, D, S, G, start_h)
        base = Params(oobleck_reconfig_s=sh.reconfig_s)
        res = simulate(job, tr, tr.end, UNIT_S, base, ["recycle", "swift-replay"], model=model)
        off = simulate(job, tr, tr.end, UNIT_S, replace(base, replay=False), ["recycle"],
                       model=model)
        kept = {o.policy: o.microbatches / res.ideal for o in res.outcomes}
        k_off = off.outcomes[0].microbatches / off.ideal
        st = res.stats["recycle"]
        out.append(f"| {name}, {D}x{S} | {kept['recycle']:.1%} | {k_off:.1%} | "
                   f"{kept['swift-replay']:.1%} | {kept['recycle'] / k_off:.3f}x | "
                   f"{st.get('replays', '?')}, "
                   f"{st.get('snapshot_restores', 0) - st.get('replays', 0)} |")
        print(out[-1], flush=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--ks", default="5,10,20")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/swift.md"))
    args = ap.parse_args(argv)
    load0, t0 = os.getloadavg()[0], time.time()
    with tempfile.TemporaryDirectory(prefix="swift-") as tmp:
        steady = steady_state(args.rounds, args.iterations, tmp)
        rec = {(k, m): recovery(k, m, tmp) for k in map(int, args.ks.split(","))
               for m in ("replay", "rollback")}
    sim = simulated()
    text = report(steady, rec, args, load0, t0) + "\n".join(SIM_HEAD + sim + SIM_TAIL) + "\n"
    print(text)
    Path(args.out).write_text(text)


SIM_HEAD = ["", "## The simulator fed these costs", "",
            "The real spot traces of simulate_real.md (gpt3-2.7b, M=16, its defaults): `recycle` "
            "and `swift-replay` pay the 1% of throughput the logs cost at the upper end of the "
            "measure above (`Params.swift_log_overhead`); a replay stalls the job for the lost "
            "stage's F+I+W per micro-batch trained since its snapshot, over the workers that "
            "take it (the runtime's replay, above, costs about that: one stage's share of the "
            "iterations since the snapshot). Logs off: a stage lost whole rolls the job back "
            "to its snapshot (`Params(replay=False)`, `recycle train --log-memory off`). Kept: "
            "samples over the user's grid's failure-free samples.", ""]


SIM_TAIL = ["", "On these traces (3 to 16 replicas a stage) a stage is rarely lost whole: the "
            "replays spare a few iterations each, less than the 1% the logs are charged, so "
            "`recycle` with logs keeps 0.99x of itself without them. The logs pay where a "
            "stage is lost whole often or K is long (the recovery table above: 0.5-0.8x of "
            "the rollback's time back on two replicas), and on GPUs, where the copies run "
            "beside the kernels (not measured here: docs/gpu.md's replay section checks the "
            "path, not its cost). `--log-memory off` is that trade."]


def _steady_rows(steady: dict) -> list[str]:
    rows = ["| configuration | logs off: ms / iteration | on (default budget, 10% of the "
            "host) | ratio to off (median of rounds) | rounds | log MiB a worker | losses "
            "identical |", "| --- | ---: | ---: | ---: | --- | ---: | --- |"]
    for name, got in steady.items():
        on = statistics.median(r["ms"] for r in got["on"])
        off = statistics.median(r["ms"] for r in got["off"])
        ratios = [a["ms"] / b["ms"] for a, b in zip(got["on"], got["off"])]
        mib = max(r["elastic"]["log_mib_per_worker"] for r in got["on"])
        same = all(a["losses"] == b["losses"] for a, b in zip(got["on"], got["off"]))
        rows.append(f"| {name} | {off:.1f} | {on:.1f} | {on / off:.3f} | "
                    f"{', '.join(f'{x:.3f}' for x in ratios)} | {mib:.2f} | {same} |")
    return rows


def report(steady: dict, rec: dict, args, load0: float, t0: float) -> str:
    out = ["# SWIFT's logging and replay, measured", "",
           f"`PYTHONPATH=. python benchmarks/swift.py --rounds {args.rounds} "
           f"--iterations {args.iterations} --ks {args.ks}` on {platform.node()} "
           f"({os.cpu_count()} CPUs, load {load0:.1f} at the start, "
           f"{time.time() - t0:.0f} s in all); GPT models, CPU workers, snapshots every 5 "
           f"in the steady state.", "",
           "## Steady state: what logging costs", "",
           "Side by side, interleaved (each mode first in turn), no failure; ms per "
           "iteration is the median over the iterations after the first "
           f"{WARMUP}.", "", *_steady_rows(steady), "",
           "## Recovery from a stage lost whole", "",
           f"Grid {D}x{S}, M={M}, d_model {MODEL['d_model']}, {MODEL['n_layers']} blocks, "
           f"seq {MODEL['seq_len']}. Both workers of stage 1 SIGKILLed mid-iteration 2K-1 (K-1 iterations after the "
           "newest snapshot). *Back* is the time from the kill to the end of iteration "
           "2K+1 (the last stage may have finished 2K-1 before the kill; 2K needs the lost "
           "stage's forward, 2K+1 is one clean iteration more): detection, the restore, "
           "then the replay of one stage or the re-training of every stage, then two "
           "iterations. *Redone* counts stage-iterations trained "
           "twice: a rollback re-trains every stage, a replay only the lost one.", "",
           "| K | recovery | back (s) | redone stage-iterations | replay s | retrained | "
           "replayed | log MiB a worker |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (k, m), r in sorted(rec.items()):
        out.append(f"| {k} | {m} | {r['back_s']:.2f} | {r['stage_iterations_redone']} | "
                   f"{r['replay_s']:.3f} | {r['retrained']} | {r['replayed']} | "
                   f"{r['log_mib']:.2f} |")
    out += ["", "| K | back: replay / rollback |", "| --- | --- |"]
    for k in sorted({k for k, _ in rec}):
        out.append(f"| {k} | {rec[(k, 'replay')]['back_s'] / rec[(k, 'rollback')]['back_s']:.2f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
