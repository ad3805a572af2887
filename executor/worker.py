"""Worker process entry point: `python -m executor.worker`.

Started by the launcher (one process per (replica, stage)) or by torchrun on several
machines; either way it needs only the coordinator's store address and its identity:
  --store HOST:PORT   or env RECYCLE_STORE   (the coordinator's TCPStore)
  --replica R --stage S   or env RANK (rank = replica * S + stage, docs/design.md section 2)
Everything else (model config, the --model name, job spec, iterations, paths, and with
--service the service's URL, job id and token) is read from the store.
Multi-machine: under torchrun use `-m executor.torchrun` (executor/torchrun.py: the
commands, and how torchrun's restarts map onto failures and rejoins).
"""
from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

import torch

from executor.checkpoint import Manifest
from executor.compute.host_allocator import keep_freed_memory
from executor import protocol as P
from executor.runtime.worker_loop import WorkerLoop
from executor.runtime.transport.endpoints import connect_store, local_workers_hint, pick_device
from executor.launch.faults.injector import fault_iterations
from executor.data.token_file import with_data
from executor.inputs.worker_settings import WorkerSettings
from executor.inputs.workload_name import load_workload
from executor.runtime.transport.rendezvous import StorePlanSource
from executor.runtime.worker_config import WorkerConfig
from executor.timeouts import Timeouts


def main(argv=None, world_size: int | None = None, slot_of=None) -> int:
    """`slot_of(job, store)`: this process's (replica, stage) when started by torchrun
    (executor/torchrun.py maps its RANK); else --replica/--stage, or RANK = replica*S + stage."""
    ap = argparse.ArgumentParser(prog="executor.worker")
    ap.add_argument("--store", default=os.environ.get("RECYCLE_STORE"))
    ap.add_argument("--replica", type=int)
    ap.add_argument("--stage", type=int)
    args = ap.parse_args(argv)
    if not args.store:
        ap.error("no store address: pass --store HOST:PORT or set RECYCLE_STORE")
    torch.set_num_threads(int(os.environ.get("RECYCLE_THREADS", "1")))
    keep_freed_memory()  # buffers reused each micro-batch stay mapped (host_allocator.py)
    host, port = args.store.rsplit(":", 1)
    store = connect_store(host, int(port), timeout_s=60)
    conf = WorkerSettings.from_json(store.get(P.CONFIG))
    job = conf.job
    if world_size is not None and world_size != job.replicas * job.stages:
        raise SystemExit(f"executor.worker: WORLD_SIZE {world_size} but the job has "
                         f"{job.replicas}x{job.stages} = {job.replicas * job.stages} workers")
    if args.replica is None and slot_of is not None:
        args.replica, args.stage = slot_of(job, store)
    elif args.replica is None:
        if "RANK" not in os.environ:
            raise SystemExit("executor.worker: pass --replica and --stage, or run under torchrun")
        args.replica, args.stage = divmod(int(os.environ["RANK"]), job.stages)
    me = (args.replica, args.stage)
    timeout = conf.comm.timeout
    store.set_timeout(timedelta(seconds=timeout))
    incarnation = int(store.add(P.incarnation_key(me), 1))
    origin_parts, start = (), 0
    resume = conf.checkpoint.resume
    if resume:  # a restarted process (incarnation > 1) loads from a live peer
        man = Manifest.load(resume)
        start = man.iteration + 1
        origin_parts = tuple(man.part_dirs(resume))
    # The plan source gets its own connection: the heartbeat thread uses it concurrently.
    conn = connect_store(host, int(port), timeout_s=timeout)
    if conf.service:  # plans, heartbeats, suspects and rejoin over HTTP
        from executor.sources.service_source import ServiceWorkerSource
        token = os.environ.get("RECYCLE_TOKEN")  # never in the store: it is unauthenticated
        if not token:
            raise SystemExit("executor.worker: the job uses a plan service; set RECYCLE_TOKEN "
                             "to its worker token")
        source = ServiceWorkerSource(conn, me, incarnation, dict(conf.service, token=token),
                                     conf.run_id)
    else:
        source = StorePlanSource(conn, me, incarnation)
    local_rank = int(os.environ.get("LOCAL_RANK", args.replica * job.stages + args.stage))
    try:
        device = pick_device(local_rank, conf.comm.device)
        if device.type == "cuda":  # events, streams and pinned copies of this process go to
            torch.cuda.set_device(device)  # its own GPU, not GPU 0
    except ValueError as exc:  # this host lacks the device the run asks for
        print(f"executor.worker: {exc}", file=sys.stderr)
        return 2
    try:  # the run's --model, importable here too (same code on every machine)
        workload = with_data(load_workload(conf.workload), conf.training.data)
    except ValueError as exc:
        print(f"executor.worker: {exc}", file=sys.stderr)
        return 2
    local = local_workers_hint() or conf.local_workers
    worker = WorkerConfig(
        conf.model, job, conf.iterations, training=conf.training, workload=workload,
        timeouts=Timeouts(timeout), device=device, local_workers=local,
        start_iteration=start, origin_parts=origin_parts, load_origin=incarnation == 1,
        checkpoint=conf.checkpoint, run_id=conf.run_id,
        fault_iterations=frozenset(fault_iterations(conf.kills, conf.stalls, me)),
        slows=tuple((i, f) for r, s, i, f in conf.slows if (r, s) == me))
    return WorkerLoop(worker, me, source, store, incarnation).run()


def child(store: str, replica: int, stage: int, log_path: str,
          token: str | None = None, coordinator: int | None = None) -> None:
    """multiprocessing target (the launcher's forkserver has torch imported already, so a
    worker starts in milliseconds instead of seconds): output goes to the worker's log.
    It dies with the coordinator (pid `coordinator`), and with its parent, the forkserver.
    The forkserver only exits once every process it forked has (they hold its liveness
    pipe), so a worker that waited on the forkserver alone outlived a SIGKILLed
    coordinator whenever it was not in a collective that failed it."""
    from planner.procs import die_with, die_with_parent
    die_with_parent()
    if coordinator is not None:
        die_with(coordinator)
    if token:
        os.environ["RECYCLE_TOKEN"] = token
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    code = main(["--store", store, "--replica", str(replica), "--stage", str(stage)])
    sys.stdout.flush()
    os._exit(code)


def leave(code: int) -> None:
    """Exit without the interpreter's teardown: a world's groups may still be closing on a
    background thread (runtime/transport/comm.py), and destroying them under a finalising interpreter aborts
    the process (SIGABRT, 'terminate called without an active exception'), which torchrun
    takes for a failure and restarts the node's workers. Checkpoint parts are written by
    then (the agent joins its saver before returning)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        print(exc.code, file=sys.stderr)
        code = 2
    leave(code)
