"""Run one chaos schedule: the reference, then `recycle train` with the faults, judged.

Outcomes: exact (losses and per-stage parameter checksums equal the one-process reference
within 1e-5), inexact, hang (wall-time limit hit), crash (non-zero exit), halt (exit 3),
leak (a tagged process outlived the run; it is SIGKILLed). Only exact is a success. A halt
is a failure of the run: snapshots are on and checkpoints written every iteration, and a
schedule that leaves fewer live workers than a shape runs on has every one of them due
back (a pause, schedule.py), so a copy of every stage lives throughout (in peer memory, on
disk, or the start rebuilt from the seed) and a worker is due back whenever too few live.
Every command runs as real processes in a session of its own.

A schedule with a `resume` runs twice: `recycle train` is SIGKILLed (its whole process
group) once iteration `after`'s line is in its log, then `recycle train --resume` of its
checkpoints (written every iteration by default: --checkpoint-every 1) runs to the end on
the resumed grid; if no checkpoint was complete by then, the final grid trains from
scratch (the record says so). It is judged against the reference of the final grid.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from typing import Optional

from recycle.chaos.leaks import kill_group, new_tag, reap_leaks, tagged_env, wait_gone
from recycle.chaos.schedule import MODELS, Schedule

RECYCLE = [sys.executable, "-m", "recycle.cli"]
# A tiny model: a 2-core machine runs up to 6 workers plus a service.
MODEL_ARGS = ["--d-model", "16", "--layers", "2", "--heads", "2", "--seq-len", "8",
              "--micro-batch-size", "2", "--vocab", "32"]
# A module-factory model (schedule.MODELS): three blocks, so 3 stages each hold one.
FACTORY_LAYERS = 3
TOLERANCE = 1e-5
# --timeout: short, so faults cost little. With a service 3 s. A rejoin holds the others at
# its iteration until it is admitted (up to 4 timeouts + 60 s with a service: an outage
# (<= 15 s) plus the fresh heartbeat timeout after the restart), so a donor kill in that
# iteration never empties the stage.
COMM_TIMEOUT_S = {False: 2.0, True: 3.0}
TIME_LIMIT_S = {False: 120.0, True: 240.0}
EXIT_HALT = 3
# A halt is never expected of a drawn schedule (module docstring): its record says why.
HALT_IS_A_FAILURE = ("halt, a failure here: a copy of every stage lived (peer memory or "
                     "disk) and a worker was due back whenever too few were live; last line: ")
ITERATION_LINE = re.compile(rb"^iter\s+(\d+)\s", re.M)
JOB_KILL_GRACE_S = 20.0  # a SIGKILLed run's workers leave within this (test_never_hang)


def model_args(model: Optional[str]) -> list[str]:
    """The model flags: MODEL_ARGS for the built-in GPT, else the module factory."""
    if model is None:
        return list(MODEL_ARGS)
    args = list(MODEL_ARGS)
    args[args.index("--layers") + 1] = str(FACTORY_LAYERS)
    return ["--model", MODELS[model], *args]


def run_schedule(sched: Schedule, out_dir: str, time_limit_s: Optional[float] = None) -> dict:
    """One schedule end to end; returns its record (see cli.py for the table and JSON)."""
    name = f"seed{sched.seed}-run{sched.index}" + ("-service" if sched.service else "")
    run_dir = os.path.join(out_dir, name)
    os.makedirs(run_dir, exist_ok=True)
    limit = time_limit_s or TIME_LIMIT_S[sched.service]
    record = {"name": name, "seed": sched.seed, "run": sched.index, "service": sched.service,
              "grid": sched.grid, "microbatches": sched.microbatches,
              "iterations": sched.iterations, "faults": sched.describe(),
              "schedule": sched.to_dict(), "log": os.path.join(out_dir, name + ".log"),
              "max_diff": None, "recovery": [], "leaks": [], "lingering": [], "error": None,
              "kinds": sorted(sched.kinds()),
              "final_grid": "{}x{} m{}".format(*sched.final_grid())}
    try:
        ref = reference(sched, os.path.join(out_dir, "references"))
    except RuntimeError as exc:
        record.update(outcome="crash", wall_s=0.0, error=str(exc))
        return record
    if sched.service:
        _run_with_service(sched, run_dir, limit, record)
    else:
        _run_local(sched, run_dir, limit, record)
    if record["outcome"] == "done":
        _judge(record, os.path.join(run_dir, "run.json"), ref)
    if record["leaks"]:
        record["train_outcome"], record["outcome"] = record["outcome"], "leak"
    if record["outcome"] == "exact":
        shutil.rmtree(run_dir, ignore_errors=True)
        record["run_dir"] = None
    else:
        record["run_dir"] = run_dir
    return record


# ---- the reference -------------------------------------------------------------------
def reference(sched: Schedule, cache_dir: str) -> dict:
    """The one-process run's summary of the schedule's final grid (the resumed run's, if
    any), cached per (model, grid, M, iterations)."""
    os.makedirs(cache_dir, exist_ok=True)
    D, S, M = sched.final_grid()
    key = f"ref-{sched.model or 'gpt'}-{D}x{S}-m{M}-n{sched.iterations}"
    path = os.path.join(cache_dir, key + ".json")
    if not os.path.exists(path):
        cmd = RECYCLE + ["train", "-d", str(D), "-s", str(S), "-m", str(M),
                         "--iterations", str(sched.iterations),
                         "--reference", "--summary", path + ".tmp", *model_args(sched.model)]
        tag = new_tag()
        try:
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=300, env=tagged_env(tag),
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"reference timed out: {shlex.join(cmd)}") from None
        finally:
            reap_leaks(tag)
        if done.returncode != 0:
            raise RuntimeError(f"reference failed ({done.returncode}): "
                               f"{_last_line(done.stderr)}: {shlex.join(cmd)}")
        os.replace(path + ".tmp", path)
    with open(path) as fh:
        return json.load(fh)


# ---- the run under faults -------------------------------------------------------------
def train_command(sched: Schedule, run_dir: str, service_args: tuple = ()) -> list[str]:
    return RECYCLE + ["train", *sched.to_args(), *service_args,
                      "--summary", os.path.join(run_dir, "run.json"),
                      "--run-dir", os.path.join(run_dir, "workers"),
                      "--timeout", f"{COMM_TIMEOUT_S[sched.service]:g}",
                      *model_args(sched.model)]


def resume_command(sched: Schedule, run_dir: str, checkpoints: Optional[str]) -> list[str]:
    """The second run of a `resume` schedule: `--resume` of the first's checkpoints (the
    model and settings come from them), or with none complete the final grid afresh."""
    tail = ["--summary", os.path.join(run_dir, "run.json"),
            "--run-dir", os.path.join(run_dir, "resumed"),
            "--timeout", f"{COMM_TIMEOUT_S[sched.service]:g}"]
    if checkpoints is None:
        return RECYCLE + ["train", *sched.fresh_args(), *tail, *model_args(sched.model)]
    return RECYCLE + ["train", "--resume", checkpoints, *sched.resume_args(), *tail]


def _run_local(sched: Schedule, run_dir: str, limit: float, record: dict) -> None:
    tag = new_tag()
    cmd = train_command(sched, run_dir)
    record["command"] = shlex.join(cmd)
    try:
        if sched.resume is None:
            _train(cmd, tag, limit, record)
            return
        t0 = time.monotonic()
        _train(cmd, tag, limit, record, kill_after=sched.resume.after)
        first = record.pop("outcome")
        if first not in ("done", "job-killed"):  # failed before the job kill: that is all
            record["outcome"] = first
            return
        if "pgid" in record:
            record["job_kill_lingering"] = [str(p) for p in wait_gone(tag, JOB_KILL_GRACE_S)]
            kill_group(record.pop("pgid"))
            record["leaks"] += reap_leaks(tag)  # a worker that outlived the job kill
        from executor.checkpoint.manifest import newest
        ckpt_root = os.path.join(run_dir, "workers", "checkpoints")
        found = newest(ckpt_root) if os.path.isdir(ckpt_root) else None
        record["resumed_from"] = found
        if found is None:
            record["note"] = (f"job killed after iteration {sched.resume.after} before any "
                              "checkpoint was complete: the final grid trained from scratch")
        cmd2 = resume_command(sched, run_dir, None if found is None else ckpt_root)
        record["first_command"], record["command"] = record["command"], shlex.join(cmd2)
        record["first_wall_s"] = record.get("wall_s")
        left = max(10.0, limit - (time.monotonic() - t0))
        _train(cmd2, tag, left, record)
        record["wall_s"] = round(time.monotonic() - t0, 1)
    finally:
        _cleanup(tag, record)


def _run_with_service(sched: Schedule, run_dir: str, limit: float, record: dict) -> None:
    from planner.job import JobSpec  # pydantic only: cheap, and the service's own spec type
    from recycle.chaos.service import OutageThread, Service

    tag = new_tag()
    service = Service(os.path.join(run_dir, "service.db"),
                      os.path.join(os.path.dirname(record["log"]), record["name"] + "-serve.log"),
                      tag, snapshots=sched.snapshot_every != 0)
    record["service_log"] = service.log_path
    done = threading.Event()
    outage = None
    try:
        service.start()
        spec = JobSpec.uniform(sched.replicas, sched.stages, sched.microbatches)
        # --shape fixed and the module-factory models cannot change shape: so registered
        fixed = sched.shape == "fixed" or sched.model is not None
        job_id, token = service.register(spec.model_dump(mode="json"),
                                         "fixed" if fixed else sched.shape or "auto")
        cmd = train_command(sched, run_dir, ("--service", service.url, "--job-id", job_id))
        record["command"] = "RECYCLE_TOKEN=<worker token> " + shlex.join(cmd)
        record["serve_command"] = "RECYCLE_ADMIN_TOKEN=<admin token> " + shlex.join(service.cmd)
        outage = OutageThread(service, sched.outage, done)
        outage.start()
        _train(cmd, tag, limit, record, {"RECYCLE_TOKEN": token})
    except (RuntimeError, TimeoutError, OSError) as exc:  # the service never came up
        record.update(outcome="crash", wall_s=record.get("wall_s", 0.0),
                      error=f"service: {exc}")
    finally:
        done.set()
        if outage is not None:
            outage.join(90)  # a restart in progress must finish before we stop it
            record["service_outage"] = outage.record()
        service.stop()
        _cleanup(tag, record)


def _train(cmd: list[str], tag: str, limit: float, record: dict,
           env: Optional[dict] = None, kill_after: Optional[int] = None) -> None:
    """Run `cmd` to its end (or `limit`); with `kill_after`, SIGKILL its whole process
    group as soon as its log has that iteration's line (outcome "job-killed")."""
    t0 = time.monotonic()
    with open(record["log"], "ab") as log:
        log.write(f"$ {shlex.join(cmd)}\n".encode())
        log.flush()
        start = log.tell()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env={**tagged_env(tag), **(env or {})},
                                start_new_session=True)
        killed = False
        try:
            if kill_after is None:
                code = proc.wait(limit)
            else:
                code = _wait_for_iteration(proc, record["log"], start, kill_after,
                                           t0 + limit)
                if code is None and time.monotonic() < t0 + limit:
                    kill_group(proc.pid)  # the whole job, mid-run
                    proc.wait()
                    killed = True
                elif code is None:
                    raise subprocess.TimeoutExpired(cmd, limit)
        except subprocess.TimeoutExpired:
            code = None
            kill_group(proc.pid)
            proc.wait()
        except BaseException:  # interrupted: its own session would outlive us
            kill_group(proc.pid)
            raise
    record["wall_s"] = round(time.monotonic() - t0, 1)
    record["pgid"] = proc.pid
    if killed:
        record["outcome"] = "job-killed"
        with open(record["log"], "ab") as log:
            log.write(f"chaos: SIGKILLed the job's process group after iteration "
                      f"{kill_after}'s line\n".encode())
    elif code is None:
        record.update(outcome="hang", error=f"no exit in {limit:g} s; last line: "
                                            f"{_last_line(_tail(record['log']))}")
    elif code == EXIT_HALT:
        record.update(outcome="halt",
                      error=HALT_IS_A_FAILURE + _last_line(_tail(record["log"])))
    elif code != 0:
        record.update(outcome="crash", exit_code=code, error=_last_line(_tail(record["log"])))
    else:
        record["outcome"] = "done"


def _wait_for_iteration(proc: subprocess.Popen, log_path: str, start: int, iteration: int,
                        deadline: float) -> Optional[int]:
    """Poll until the log (from byte `start`) has a line of `iteration` or later: None then
    (or at the deadline); the exit code if the process ends first."""
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return code
        try:
            with open(log_path, "rb") as fh:
                fh.seek(start)
                text = fh.read()
        except OSError:
            text = b""
        if any(int(m) >= iteration for m in ITERATION_LINE.findall(text)):
            return None
        time.sleep(0.05)
    return proc.poll()


def _cleanup(tag: str, record: dict) -> None:
    """Processes still there a moment after the command exited are noted (lingering);
    then the run's process group goes, and whatever still carries the tag is a leak."""
    if record.get("outcome") == "done":
        record["lingering"] = [str(p) for p in wait_gone(tag, 2.0)]
    if "pgid" in record:
        kill_group(record.pop("pgid"))
    time.sleep(0.2)
    record["leaks"] = reap_leaks(tag)


# ---- judging --------------------------------------------------------------------------
def _judge(record: dict, summary_path: str, ref: dict) -> None:
    try:
        with open(summary_path) as fh:
            got = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        record.update(outcome="crash", error=f"exit 0 but no summary: {exc}")
        return
    record["recovery"] = got.get("recovery") or []  # absent until the runtime reports it
    record["elastic"] = got.get("elastic") or {}  # moves and snapshot restores
    diff, agree = max_diff(got, ref)
    record["max_diff"] = diff
    record["outcome"] = "exact" if agree else "inexact"


def max_diff(got: dict, ref: dict) -> tuple[Optional[float], bool]:
    """Largest absolute difference over losses and parameter checksums, and whether all
    agree within TOLERANCE (relative above magnitude 1: a checksum sums many parameters)."""
    pairs = list(zip(got.get("losses", []), ref["losses"])) + \
        list(zip(got.get("param_checksums", []), ref["param_checksums"]))
    same_len = (len(got.get("losses", [])) == len(ref["losses"]) and
                len(got.get("param_checksums", [])) == len(ref["param_checksums"]))
    diffs = [abs(a - b) for a, b in pairs]
    agree = same_len and all(abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b)) for a, b in pairs)
    return (max(diffs) if diffs else None), agree


def _tail(path: str, size: int = 8192) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""
