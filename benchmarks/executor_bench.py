"""`python -m benchmarks.bench_executor`: ReCycle's runtime against torch.distributed.pipelining.

One run, one model, one machine:
  1. profile the model (executor.compute.measure.profile) for an S-stage split; the p2p delay is the
     one-way gloo latency measured by the Schedule1F1B ranks (ping-pong on loopback);
  2. torch baselines on S processes: Schedule1F1B, and the zero-bubble schedules that
     need 2 stages per rank (ZBV, interleaved ZB) on the same model split in 2S chunks;
  3. ReCycle's launcher (executor.launch.launcher.Coordinator) on D=1 and on D=2 with 0, 1 and 2
     failed workers (failed from the start, so every measured iteration is steady state
     under that plan); planned period = the plan's metrics.period (us, from the profiled
     spec), realised = mean interval between a worker's consecutive optimizer steps
     after `warmup` iterations, the largest over live workers (the period's definition).
Workers run as benchmarks.timed_worker (executor.worker plus timers, nothing changed in
executor/): iteration ends come from the worker's own clock ("wall" on its "done" message)
and "busy" is the time it spent in F/I/W and the optimizer step, which gives the compute
slowdown against the profile (shared cores) apart from scheduling, comm and Python gaps.
"""
from __future__ import annotations

import os
import platform
import shlex
import time
from typing import Optional, Sequence

import torch
from rich.console import Console

from benchmarks import timed_worker
from benchmarks.executor_report import notes, write_report
from benchmarks.pp_baseline import run_torch
from executor.protocol import Done
from executor.launch.launcher import Coordinator
from executor.inputs.launch_spec import Faults, LaunchSpec, sections
from executor.compute.model import ModelConfig
from executor.inputs.workload_name import DEFAULT_MODEL, check_workload
from executor.compute.measure.profile import profile
from planner.solvers.backends import solve
from planner.job import JobSpec
from planner.control.membership import Membership
from planner.plan import Mode

Worker = tuple[int, int]


class TimedCoordinator(Coordinator):
    """The launcher's coordinator, plus: workers failed from the start (never spawned) and
    the wall time of every worker's optimizer step per iteration."""

    def __init__(self, *args, failed_from_start: Sequence[Worker] = (), **kw):
        super().__init__(*args, **kw)
        self.plans.members = Membership.start(
            self.D, self.S, [tuple(w) for w in failed_from_start]).with_speeds(self.job.speed)
        self.processes.target = timed_worker.child  # the instrumented process
        self.walls: dict[Worker, dict[int, tuple[float, dict]]] = {}  # it -> (wall, timers)
        self.gauges: dict[Worker, dict] = {}  # the newest gauges (snapshot bytes) per worker

    def handle(self, m) -> None:
        if isinstance(m, Done) and not m.sync and m.extra:  # timed_worker's figures
            self.walls.setdefault(m.worker, {})[m.it] = (m.extra["wall"], m.extra["timers"])
            self.gauges[m.worker] = m.extra.get("gauges", {})
        super().handle(m)


def steady_ms(walls: dict[int, tuple], iters: int, warmup: int, key: Optional[str] = None) -> Optional[float]:
    """Mean ms per iteration from the end of iteration `warmup` to the end of the last,
    of the wall clock (key None) or of one of timed_worker's timers."""
    if warmup not in walls or iters - 1 not in walls or iters - 1 <= warmup:
        return None
    get = (lambda it: walls[it][0]) if key is None else (lambda it: walls[it][1][key])
    return 1e3 * (get(iters - 1) - get(warmup)) / (iters - 1 - warmup)


def breakdown(walls: dict[int, tuple], iters: int, warmup: int) -> dict:
    """Where one worker's iteration went (ms per iteration)."""
    t = {k: steady_ms(walls, iters, warmup, k) for k in timed_worker.TIMERS}
    period = steady_ms(walls, iters, warmup)
    out = {"compute": t["fiw"] + t["opt"], "comm_wait": t["recv"] + t["flush"] + t["allreduce"],
           "snapshot": t["stepper"] - t["opt"],  # the stepper's pre-step copy for rollback
           "step_bookkeeping": t["step"] - t["stepper"] - t["allreduce"],
           "data_send_control": t["data"] + t["send"] + t["control"] + t["gate"] + t["msg"]}
    out["other"] = period - sum(out.values())  # Python dispatch and whatever is not timed
    return dict(out, timers=t)


def plan_numbers(job: JobSpec, failed, solver: str, mode: Mode = Mode()) -> dict:
    plan = solve(job, failed, solver=solver, mode=mode)
    work = sum(a.end - a.start for w in plan.workers for a in w.actions)
    cores = os.cpu_count() or 1
    return {"planned_ms": plan.metrics.period / 1e3, "lower_bound_ms": plan.metrics.lower_bound / 1e3,
            # the plan assumes one core per worker; with fewer cores than live workers no
            # schedule beats (all work) / cores
            "cpu_bound_ms": max(plan.metrics.period, work / cores) / 1e3,
            "live_workers": len(plan.workers),
            "planned_busy_ms": {f"{w.replica}:{w.stage}": sum(a.end - a.start for a in w.actions) / 1e3
                                for w in plan.workers}}


def tokens_per_iteration(cfg: ModelConfig, job: JobSpec) -> int:
    """The global batch in tokens: unchanged by failures (re-routing keeps it)."""
    return job.replicas * job.microbatches * cfg.micro_batch_size * cfg.seq_len


def run_ours(cfg: ModelConfig, job: JobSpec, failed, iters: int, warmup: int, solver: str,
             planned: dict, timeout_s: float = 240.0, mode: Mode = Mode(),
             model: str = DEFAULT_MODEL, kills=()) -> dict:
    failed = [tuple(w) for w in failed]
    t0 = time.monotonic()
    spec = LaunchSpec(cfg, job, iters, Faults(kills=kills), solver=solver, mode=mode,
                      deadline_s=timeout_s, model=model,
                      **sections(timeout=30.0 if not kills else 4.0, checkpoint_every=10 ** 9))
    coord = TimedCoordinator(spec, failed_from_start=failed,
                             console=Console(stderr=True, quiet=True))
    res = coord.run()
    out = {"failed": [list(w) for w in failed], "wall_s": round(time.monotonic() - t0, 1),
           "load_avg": os.getloadavg()[0]}
    if res.summary is None:
        return dict(out, error=res.halted or "did not complete")
    ends = [coord.iteration_end[i] for i in sorted(coord.iteration_end)]
    if len(ends) > warmup + 1:  # the whole run after warm-up, recoveries included
        out["run_tok_s"] = (tokens_per_iteration(cfg, job) * (len(ends) - 1 - warmup)
                            / (ends[-1] - ends[warmup]))
    out["snapshot_mb"] = max(g.get("snapshot_bytes", 0) for g in coord.gauges.values()) / 1e6
    if kills:  # periods are not steady: report the run's throughput and its losses
        return dict(out, losses=res.summary.losses, kills=[list(k) for k in kills])
    per_worker = {f"{r}:{s}": steady_ms(v, iters, warmup) for (r, s), v in sorted(coord.walls.items())}
    if any(v is None for v in per_worker.values()):
        return dict(out, error=f"missing iteration times: {per_worker}")
    parts = {f"{r}:{s}": breakdown(v, iters, warmup) for (r, s), v in sorted(coord.walls.items())}
    busy = {k: v["compute"] for k, v in parts.items()}
    # compute slowdown vs the profile, averaged over workers (cores shared with our own
    # other workers and with other jobs); realised / (planned * slowdown) is what is left
    # for scheduling, communication and Python overhead
    slow = sum(busy[k] / planned["planned_busy_ms"][k] for k in busy) / len(busy)
    slowest = max(per_worker, key=per_worker.get)
    out.update(busy_ms=busy, slowdown=slow, breakdown_ms=parts, slowest=slowest,
               adjusted_ratio=max(per_worker.values()) / (planned["planned_ms"] * slow))
    reps = sorted({int(k.split(':')[0]) for k in per_worker})
    per_replica = {d: max(v for k, v in per_worker.items() if int(k.split(':')[0]) == d) for d in reps}
    out["tok_s"] = tokens_per_iteration(cfg, job) / (max(per_worker.values()) / 1e3)
    return dict(out, realised_ms=max(per_worker.values()), per_worker_ms=per_worker,
                per_replica_ms=per_replica, losses=res.summary.losses, run_dir=res.run_dir)


NAMES = {"1f1b": "torch Schedule1F1B", "zbv": "torch ScheduleZBVZeroBubble (2 chunks/rank)",
         "izb": "torch ScheduleInterleavedZeroBubble (2 chunks/rank)"}


def _torch_row(kind: str, r: dict, S: int, planned_ms: Optional[float], tokens: int) -> dict:
    row = {"name": NAMES[kind], "procs": S, "failed": "none", "planned_ms": planned_ms}
    row.update({k: v for k, v in r.items() if k in ("error", "losses")})
    if "iter_ms" in r:
        row.update(realised_ms=r["iter_ms"], load_avg=os.getloadavg()[0],
                   tok_s=tokens / (r["iter_ms"] / 1e3))
    return row


def _best(rounds: list[dict]) -> dict:
    """The round with the least realised time (shared machine), every round's time kept."""
    ok = [r for r in rounds if "realised_ms" in r] or rounds
    best = dict(min(ok, key=lambda r: r.get("realised_ms", 0.0)))
    best["rounds_ms"] = [r.get("realised_ms") for r in rounds]
    return best


# The benchmark's shape for the GPT and for an import path (flags not given keep these).
BENCH_SHAPE = dict(d_model=128, n_layers=4, n_heads=4, seq_len=64, vocab=256)


def _tree() -> str:
    """The commit measured (and whether the work tree had changes), for the record."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "log", "-1", "--format=%h %s"], text=True,
                              capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no",
                                "--", ".", ":!benchmarks/results"],  # other tables: not code
                               text=True, capture_output=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head[:100] + (" (with uncommitted changes)" if dirty else "")) or "unknown"


def bench_config(model: str = DEFAULT_MODEL, d_model: Optional[int] = None,
                 n_layers: Optional[int] = None, seq_len: Optional[int] = None,
                 micro_batch_size: int = 8) -> ModelConfig:
    """The model measured: a built-in family's flavour (`llama:debug`) fixes its shape as
    `recycle train --model` does (a flag may repeat it, not contradict it: ValueError);
    otherwise BENCH_SHAPE with the flags given."""
    given = dict(d_model=d_model, n_layers=n_layers, seq_len=seq_len)
    try:
        from executor.models.families import architecture, split_name
    except ImportError:  # a tree without the model families (issue 8, the models part)
        named = None
    else:
        named = split_name(model)
    if named is not None and named[1] is not None:
        arch = architecture(model, **given)
    else:
        arch = {k: given[k] if given.get(k) is not None else v for k, v in BENCH_SHAPE.items()}
    return ModelConfig(micro_batch_size=micro_batch_size, **arch)


def run_executor_bench(out: str = "benchmarks/results/executor.md", *, stages: int = 2,
                       microbatches: int = 4, iterations: int = 12, warmup: int = 3,
                       d_model: Optional[int] = None, n_layers: Optional[int] = None,
                       seq_len: Optional[int] = None,
                       micro_batch_size: int = 8, solver: str = "greedy", rounds: int = 2,
                       model: str = DEFAULT_MODEL, console: Optional[Console] = None) -> dict:
    console = console or Console()
    torch.set_num_threads(1)
    S, M = stages, microbatches
    cfg = bench_config(model, d_model, n_layers, seq_len, micro_batch_size)
    wl = check_workload(model, cfg, S)  # ValueError (one line) if it does not load
    command = "python -m benchmarks.bench_executor " + shlex.join([
        *(["--model", model] if model != DEFAULT_MODEL else []),
        "--out", out, "--stages", str(S), "--microbatches", str(M), "--iterations", str(iterations),
        "--warmup", str(warmup),
        *[a for flag, v in (("--d-model", d_model), ("--layers", n_layers), ("--seq-len", seq_len))
          if v is not None for a in (flag, str(v))],
        "--micro-batch-size", str(micro_batch_size), "--solver", solver,
        "--rounds", str(rounds)])
    res = {"command": command, "model": model, "config": cfg.to_dict(), "stages": S, "microbatches": M,
           "iterations": iterations, "warmup": warmup, "solver": solver, "rounds": rounds,
           "cores": os.cpu_count(), "machine": platform.processor() or platform.machine(),
           "torch": torch.__version__, "load_start": os.getloadavg()[0], "tree": _tree(),
           "rows": []}
    console.print(f"torch.distributed.pipelining 1f1b on {S} processes ...")
    tok1 = M * micro_batch_size * cfg.seq_len  # D=1: tokens per iteration
    t1f1b = [run_torch(cfg, S, M, iterations, warmup, "1f1b", model=model)]
    lat = res["latency_us"] = t1f1b[0].get("latency_us") or 5.0
    console.print(f"profiling (p2p latency {lat:.0f} us) ...")
    # one profile for both grids (the machine is noisy): D=1 differs only in OPT, which
    # for D=2 carries the all-reduce estimate (= the latency: bandwidth is set to infinity,
    # the measured latency already includes moving one activation)
    det: list = []
    job2 = profile(cfg, S, 2, M, latency_us=lat, intra_gbps=1e9, cross_gbps=1e9, details=det,
                   workload=wl)
    res["profile_us"] = [{k: round(r[k]) for k in ("F", "I", "W", "B", "native_backward", "OPT")}
                         for r in det]
    spec = job2.model_dump(mode="json")
    job1 = JobSpec.model_validate(dict(spec, replicas=1, cost=dict(
        spec["cost"], OPT=[max(1, o - round(lat)) for o in spec["cost"]["OPT"]])))
    res["job_d1"], res["job_d2"] = job1.model_dump(mode="json"), spec
    t0 = time.perf_counter()
    for g in range(4):
        wl.microbatch(cfg, 10 ** 6, g)
    res["data_ms_per_microbatch"] = (time.perf_counter() - t0) * 1e3 / 4
    # torch's 1F1B runs autograd's own backward, not our I + W: plan it with B = native
    native = JobSpec.model_validate(dict(res["job_d1"], cost=dict(res["job_d1"]["cost"], I=[
        max(1, round(r["native_backward"] - r["W"])) for r in det])))
    p1f1b = plan_numbers(native, [], "1f1b")["planned_ms"]
    job_fused = native  # D=1 with B = autograd's own backward, as our fused B runs it

    def ours(job: JobSpec, failed: list, mode: Mode = Mode(), kills=()) -> dict:
        name = f"ReCycle D={job.replicas} ({solver}{'' if mode.split_backward else ', fused B'})"
        if kills:
            name += " " + ", ".join(f"SIGKILL {r}:{s} in iteration {i}" for r, s, i in kills)
        console.print(f"{name}, failed {failed or 'none'} ...")
        row = {"name": name, "procs": job.replicas * S - len(failed),
               **plan_numbers(job, failed, solver, mode)}
        row.update(run_ours(cfg, job, failed, iterations, warmup, solver, row, mode=mode,
                            model=model, kills=kills))
        row["failed"] = " ".join(f"{r}:{s}" for r, s in failed)
        return row

    # head to head, interleaved so both see the same load drift: 1F1B, ours, 1F1B, ours...
    # Fused B runs autograd's own backward (no I/W split cost): where the split costs more
    # than the bubbles it fills, that plan is the fair comparison with 1F1B.
    fused = Mode(split_backward=False)
    torch_rows, ours_rows = [_torch_row("1f1b", t1f1b[0], S, p1f1b, tok1)], [ours(job1, [])]
    fused_rows = [ours(job_fused, [], fused)]
    for _ in range(rounds - 1):
        console.print(f"torch.distributed.pipelining 1f1b on {S} processes ...")
        torch_rows.append(_torch_row("1f1b", run_torch(cfg, S, M, iterations, warmup, "1f1b",
                                                       model=model), S, p1f1b, tok1))
        ours_rows.append(ours(job1, []))
        fused_rows.append(ours(job_fused, [], fused))
    rows = res["rows"]
    rows.append(_best(torch_rows))
    for kind in ("zbv", "izb"):
        console.print(f"torch.distributed.pipelining {kind} on {S} processes ...")
        rows.append(_torch_row(kind, run_torch(cfg, S, M, iterations, warmup, kind, model=model),
                               S, None, tok1))
    rows.append(_best(ours_rows))
    rows.append(_best(fused_rows))
    for failed in ([], [(1, 0)], [(0, 1), (1, 0)]):
        rows.append(ours(job2, failed))
    # one real failure mid-run: worker 1:0 SIGKILLed in the middle of the run, no rejoin
    # (the steady state after it is the "failed 1:0" row; this adds detection and re-plan)
    rows.append(ours(job2, [], kills=[(1, 0, warmup + (iterations - warmup) // 2)]))
    res["notes"] = notes(res)
    write_report(out, res)
    console.print(open(out).read())
    return res
