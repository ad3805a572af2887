"""Worker entry point under torchrun: `torchrun ... -m executor.torchrun`.

torchrun starts WORLD_SIZE = D*S processes over the nodes and numbers them RANK =
replica * S + stage (node i's agent gets ranks i*K .. i*K+K-1 with `--nproc-per-node K`);
each finds the coordinator's store at RECYCLE_STORE (`recycle train --external`), takes
the next incarnation of its worker and runs the same agent as a local worker.

How torchrun's elastic agent maps onto ReCycle (docs/executor.md, "Several machines"):
  - a worker process that dies makes its node's agent stop the node's other workers
    (SIGTERM) and, while `--max-restarts` remain, start all of them again. For ReCycle
    every stopped process is a failed worker, and every restarted one a new incarnation
    that asks to be admitted, loads its stage's state from a live peer on another node
    and rejoins: a node's restart is a failure and rejoin of its workers, never a halt,
    as long as another node holds every stage. `--nproc-per-node S` (whole replicas per
    node) guarantees that.
  - the static rendezvous (`--node-rank`, `--master-addr`) restarts one node alone. The
    c10d rendezvous re-forms the whole job on any restart (every agent restarts its
    workers when a node waits): every process would start fresh and no live worker would
    hold the trained state, so use static (or c10d with `--max-restarts 0`).
  - with `--max-restarts 0` a node's agent gives up instead: its workers count as failed
    and the others train on without them.
"""
from __future__ import annotations

import os
import sys

from executor import worker


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


def main(argv=None) -> int:
    env = torchrun_env()
    # A SIGKILLed torchrun agent runs no cleanup: its workers would train on to the end.
    from planner.procs import die_with_parent, watch_parent
    if os.getppid() != 1:  # torchrun may itself be a container's pid 1
        die_with_parent()
    watch_parent()
    print(f"executor.torchrun: node {env['NODE']} rank {env['RANK']}/{env['WORLD_SIZE']} "
          f"local {env['LOCAL_RANK']}/{env['LOCAL_WORLD_SIZE']} restart {env['RESTART']}",
          flush=True)
    return worker.main(argv, world_size=env["WORLD_SIZE"])


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
