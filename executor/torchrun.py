"""Worker entry point under torchrun: `torchrun ... -m executor.torchrun`.

torchrun starts WORLD_SIZE = D*S processes over the nodes, node i's agent ranks
i*K .. i*K+K-1 with `--nproc-per-node K`. `--placement` (after the module name, the same
on every node) says which worker a rank is, in the words of `recycle simulate --placement`:
  stages   (default) RANK = replica * S + stage: a node holds stages of one replica
  replicas           RANK = stage * D + replica: a node holds replicas of one stage
Each process finds the coordinator's store at RECYCLE_STORE (`recycle train --external`),
takes the next incarnation of its worker and runs the same agent as a local worker.

How torchrun's elastic agent maps onto ReCycle (docs/executor.md, "Several machines"):
  - a worker process that dies makes its node's agent stop the node's other workers
    (SIGTERM) and, while `--max-restarts` remain, start all of them again. For ReCycle
    every stopped process is a failed worker, and every restarted one a new incarnation
    that asks to be admitted, loads its stage's state from a live peer on another node
    and rejoins: a node's restart is a failure and rejoin of its workers, never a halt,
    as long as another node holds every stage. `--nproc-per-node S` (whole replicas per
    node) guarantees that.
  - `--placement replicas` puts every replica of a stage on one node (`--nproc-per-node D`):
    a node lost loses its stage whole. With peer-memory snapshots (`recycle train
    --snapshot-every K`) the run goes on: a worker of another node moves to the lost stage
    and the job rolls back to the snapshot in memory. Without them it halts.
  - the static rendezvous (`--node-rank`, `--master-addr`) restarts one node alone. The
    c10d rendezvous re-forms the whole job on any restart (every agent restarts its
    workers when a node waits): every process would start fresh and no live worker would
    hold the trained state, so use static (or c10d with `--max-restarts 0`).
  - with `--max-restarts 0` a node's agent gives up instead: its workers count as failed
    and the others train on without them.
  - a worker declared failed while it lives on (its node cut off from the coordinator by
    a partition, or stalled) finds itself out of the plan once it hears from the store
    again, and stops: fenced. It exits 5 (EXIT_FENCED) rather than 0 when the run goes on,
    so that its node's agent restarts it (while `--max-restarts` remain) and it rejoins as
    a returning worker; exit 0 would leave its slot empty for the rest of the run.
  - gloo binds the interface towards the coordinator's store (runtime/transport/binding.py)
    where it would otherwise bind loopback (a hostname that resolves to 127.0.x.x, a
    container, a network namespace); GLOO_SOCKET_IFNAME, when set, wins.
"""
from __future__ import annotations

import argparse
import os
import sys

from executor import protocol as P
from executor import worker
from executor.protocol import PLACEMENT

PLACEMENTS = ("stages", "replicas")
PLACEMENT_KEY = PLACEMENT  # the first process's --placement; the others must agree
EXIT_FENCED = 5  # stopped while the run goes on: declared failed, so torchrun restarts it


def rank_slot(rank: int, replicas: int, stages: int, placement: str) -> tuple[int, int]:
    """The (replica, stage) torchrun's RANK stands for under `placement`."""
    if placement == "replicas":
        return rank % replicas, rank // replicas
    return divmod(rank, stages)


def slot_of_rank(rank: int, placement: str):
    """worker.main's slot_of: the slot of `rank`, once the store says every node agrees
    on the placement (two nodes that disagree would start two processes per worker)."""
    def slot(job, store) -> tuple[int, int]:
        agreed = store.compare_set(PLACEMENT_KEY, "", placement).decode()
        if agreed != placement:
            raise SystemExit(f"executor.torchrun: --placement {placement}, but another node "
                             f"started with --placement {agreed}: pass the same on every node")
        return rank_slot(rank, job.replicas, job.stages, placement)
    return slot


def torchrun_env() -> dict:
    """torchrun's variables, or SystemExit(2) with one line if not under torchrun."""
    need = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    missing = [k for k in need if k not in os.environ]
    if missing:
        raise SystemExit(f"executor.torchrun: {', '.join(missing)} not set: start it with "
                         "torchrun (or run `python -m executor.worker --replica R --stage S`)")
    env = {k: int(os.environ[k]) for k in need}
    env["RESTART"] = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    env["NODE"] = int(os.environ.get("GROUP_RANK", "0"))
    return env


def store_address(rest: list) -> str | None:
    """The coordinator's store as the worker will read it: --store, else RECYCLE_STORE."""
    for i, a in enumerate(rest):
        if a == "--store" and i + 1 < len(rest):
            return rest[i + 1]
        if a.startswith("--store="):
            return a.split("=", 1)[1]
    return os.environ.get("RECYCLE_STORE")


def run_over(address: str, wait_s: float) -> bool:
    """Has the run ended (complete, or halted), as the coordinator's store says? Its
    newest plan answers at once; through a plan service (whose plans end a worker before
    the coordinator marks the store `finished`), the mark is awaited up to `wait_s`. A
    store that is gone is a run over (the coordinator closes it last)."""
    import json

    from executor.runtime.transport.endpoints import connect_store
    from executor.runtime.transport.rendezvous import read_int
    from planner.plan import Plan
    from executor.runtime.transport.waiting import WaitEnded, wait_until
    try:
        host, port = address.rsplit(":", 1)
        store = connect_store(host, int(port), timeout_s=max(1.0, wait_s))
        service = json.loads(store.get(P.CONFIG)).get("service")

        def over() -> bool:
            if store.check([P.HALTED]) or store.check([P.FINISHED]):
                return True
            newest = read_int(store, P.PLAN_VERSION) - 1
            return newest >= 0 and not Plan.from_json(
                store.get(P.plan_key(newest)).decode()).workers
        wait_until(over, "the end of the run", limit_s=wait_s if service else 0.0,
                   poll_s=0.1, max_poll_s=0.1)
        return True
    except WaitEnded:
        return False
    except Exception:  # noqa: BLE001 (closed, refused, timed out: the coordinator is done)
        return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="executor.torchrun")
    ap.add_argument("--placement", choices=PLACEMENTS, default="stages",
                    help="stages: RANK = replica*S + stage (a node holds stages of one "
                         "replica); replicas: RANK = stage*D + replica (a node holds "
                         "replicas of one stage)")
    args, rest = ap.parse_known_args(argv)
    env = torchrun_env()
    # A SIGKILLed torchrun agent runs no cleanup: its workers would train on to the end.
    from executor.runtime.transport.binding import bind_gloo_towards
    from planner.procs import die_with_parent, watch_parent
    if os.getppid() != 1:  # torchrun may itself be a container's pid 1
        die_with_parent()
    watch_parent()
    print(f"executor.torchrun: node {env['NODE']} rank {env['RANK']}/{env['WORLD_SIZE']} "
          f"local {env['LOCAL_RANK']}/{env['LOCAL_WORLD_SIZE']} restart {env['RESTART']}",
          flush=True)
    store = store_address(rest)
    if store and (ifname := bind_gloo_towards(store.rsplit(":", 1)[0])):
        print(f"executor.torchrun: gloo binds {ifname}, the interface towards the store at "
              f"{store} (set GLOO_SOCKET_IFNAME to choose another)", flush=True)
    code = worker.main(rest, world_size=env["WORLD_SIZE"],
                       slot_of=slot_of_rank(env["RANK"], args.placement))
    # A worker stops with 0 when training is complete, and also when it finds itself
    # fenced out of a run that goes on: then it must come back (a returning worker).
    if code == 0 and store and not run_over(store, wait_s=5.0):
        print(f"executor.torchrun: rank {env['RANK']} was fenced out of the run (declared "
              f"failed while it lived on) and the run goes on: exit {EXIT_FENCED}, so that "
              "torchrun restarts it as a returning worker", flush=True)
        return EXIT_FENCED
    return code


def run() -> None:
    try:
        code = main()
    except SystemExit as exc:  # one line and exit 2 for a launch that cannot work
        if not isinstance(exc.code, str):
            raise
        print(exc.code, file=sys.stderr)
        code = 2
    worker.leave(code)


if __name__ == "__main__":
    run()
