"""The run's worker processes and the store they meet at: local ones forked from a
forkserver that has torch imported, and external (torchrun'd) ones known only by their
heartbeats in the store.

Local workers may run on other (test) hosts: network namespaces of this machine, so that
the links between them are real links that can fail (tests/test_network_faults.py):
  RECYCLE_HOSTS="R:S=NETNS,..."  worker R:S enters network namespace NETNS (as made by
                                 `ip netns add NETNS`) before it opens any connection;
                                 workers not named stay in the coordinator's
  RECYCLE_STORE_ADDR=ADDR        the store listens on ADDR (instead of loopback, or of
                                 every interface with --external) and local workers dial
                                 it; required with RECYCLE_HOSTS (an address every host
                                 reaches, e.g. the bridge the hosts' veths hang off)
Such workers are watched as remote ones are: by their heartbeats as well as by their exit
(a worker cut off from the store is alive but silent). gloo binds the interface towards
the store (runtime/transport/binding.py) unless GLOO_SOCKET_IFNAME is set.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Callable, Iterable, Optional

from rich.console import Console

from executor.inputs.worker_settings import WorkerSettings
from executor.launch.faults.injector import HOSTS_ENV, STORE_ADDR_ENV, worker_hosts
from executor.runtime.transport.binding import bind_gloo_towards, enter_netns
from executor.runtime.transport.endpoints import host_store
from executor.protocol import CONFIG, heartbeat_key, wkey
from executor.runtime.transport.rendezvous import Mailbox
from executor.worker import child as worker_child
from planner.control.timing import Patience, dead_at
from planner.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Worker = tuple[int, int]


def hosted_child(netns: str, target: Callable, store: str, *args) -> None:
    """A local worker's process on a test host: into network namespace `netns` first, then
    gloo bound towards the store (binding.py), then the worker itself (`target`)."""
    enter_netns(netns)
    bind_gloo_towards(store.rsplit(":", 1)[0])
    target(store, *args)


class Processes:
    """Owns the store, its mailbox and the local worker processes."""

    def __init__(self, port: int, settings: WorkerSettings, *, external: bool, timeout: float,
                 run_dir: str, token: Optional[str], console: Console):
        """Opens the run's TCPStore with the workers' settings in it. Loopback unless
        torchrun'd workers on other machines must reach it: the store has no
        authentication, so it never holds a secret (the service token travels apart)."""
        self.run_dir, self.token = run_dir, token
        job = settings.job
        self.hosts = worker_hosts(os.environ.get(HOSTS_ENV, ""), job.replicas, job.stages)
        addr = os.environ.get(STORE_ADDR_ENV, "").strip()
        if self.hosts and not addr:
            raise UserError(f"{HOSTS_ENV} places workers on other hosts: set {STORE_ADDR_ENV} "
                            "to an address of this machine that they reach")
        self.dial = addr or "127.0.0.1"  # where local workers find the store
        self.store = host_store(addr or ("0.0.0.0" if external else "127.0.0.1"), port, timeout)
        if external:  # the port actually bound (--store-port 0 picks a free one)
            console.print(f"coordinator waiting for workers: RECYCLE_STORE=<this host>:"
                          f"{self.store.port} torchrun ... -m executor.torchrun", soft_wrap=True)
        self.run_id = settings.run_id
        self.store.set(CONFIG, settings.to_json())
        self.mailbox = Mailbox(self.store)
        self.procs: dict[Worker, multiprocessing.Process] = {}
        self.reaped: set[int] = set()  # pids whose exit has been handled
        self.silenced: set[int] = set()  # pids declared failed (by silence) while running
        self.target: Callable = worker_child  # the process entry (benchmarks instrument it)

    def spawn(self, w: Worker) -> None:
        """A worker process: forked from a forkserver that has torch imported (real, separate
        processes; the same entry point as `python -m executor.worker`)."""
        if ROOT not in sys.path:
            sys.path.insert(0, ROOT)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["executor.forkserver_guard", "executor.worker"])
        args = (f"{self.dial}:{self.store.port}", w[0], w[1],
                os.path.join(self.run_dir, f"worker-{w[0]}-{w[1]}.log"), self.token, os.getpid())
        target = self.target
        if w in self.hosts:
            target, args = hosted_child, (self.hosts[w], self.target, *args)
        p = ctx.Process(target=target, name=f"recycle-worker-{wkey(w)}", args=args)
        p.start()
        self.procs[w] = p

    def running(self, w: Worker) -> bool:
        """A process of `w` started here and has not exited."""
        p = self.procs.get(w)
        return p is not None and p.exitcode is None

    def exited(self, w: Worker) -> bool:
        """A process of `w` started here and has exited."""
        p = self.procs.get(w)
        return p is not None and p.exitcode is not None

    def pid(self, w: Worker) -> Optional[int]:
        return self.procs[w].pid if self.running(w) else None

    def handled(self, w: Worker) -> bool:
        """`w`'s newest process has exited and its exit was handled (or it never had one)."""
        p = self.procs.get(w)
        return p is None or p.pid in self.reaped

    def declare(self, w: Worker) -> None:
        """`w`'s running process is declared failed: its later exit is no new death."""
        if self.running(w):
            self.silenced.add(self.procs[w].pid)

    def declared(self, w: Worker) -> bool:
        """`w`'s newest process was declared failed before it exited."""
        p = self.procs.get(w)
        return p is not None and p.pid in self.silenced

    def new_exits(self) -> list[tuple[Worker, int]]:
        """(worker, exit code) of every process whose exit was not handled yet: each
        exactly once."""
        out = []
        for w, p in list(self.procs.items()):
            if p.exitcode is not None and p.pid not in self.reaped:
                self.reaped.add(p.pid)
                out.append((w, p.exitcode))
        return out

    def silent(self, live: Iterable[Worker], incarnation: Callable[[Worker], int],
               patience: Patience, suspected: bool) -> list[tuple[Worker, str]]:
        """External workers dead by silence (planner/control/timing.py `dead_at`), with why.
        Only the heartbeat of the incarnation the plan admits counts."""
        out, now = [], time.time()
        for w in live:
            if self.store.check([heartbeat_key(w)]):
                t, _, inc = self.store.get(heartbeat_key(w)).decode().split()
                if int(inc) == incarnation(w) and now > dead_at(float(t), patience, suspected):
                    out.append((w, f"heartbeat stopped {now - float(t):.1f} s ago"))
        return out

    def join(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for p in self.procs.values():
            p.join(max(0.1, end - time.monotonic()))

    def close(self) -> None:
        """The run is over: no process of it outlives the coordinator."""
        self.mailbox.close()
        for p in self.procs.values():
            if p.exitcode is None:
                p.kill()
            p.join()
