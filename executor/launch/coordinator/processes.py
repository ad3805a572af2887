"""The run's worker processes and the store they meet at: local ones forked from a
forkserver that has torch imported, and external (torchrun'd) ones known only by their
heartbeats in the store."""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Callable, Iterable, Optional

from rich.console import Console

from executor.inputs.worker_settings import WorkerSettings
from executor.runtime.transport.comm import host_store
from executor.protocol import CONFIG, heartbeat_key, wkey
from executor.runtime.transport.rendezvous import Mailbox
from executor.worker import child as worker_child
from planner.control.timing import Patience, dead_at

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Worker = tuple[int, int]


class Processes:
    """Owns the store, its mailbox and the local worker processes."""

    def __init__(self, port: int, settings: WorkerSettings, *, external: bool, timeout: float,
                 run_dir: str, token: Optional[str], console: Console):
        """Opens the run's TCPStore with the workers' settings in it. Loopback unless
        torchrun'd workers on other machines must reach it: the store has no
        authentication, so it never holds a secret (the service token travels apart)."""
        self.run_dir, self.token = run_dir, token
        self.store = host_store("0.0.0.0" if external else "127.0.0.1", port, timeout)
        if external:  # the port actually bound (--store-port 0 picks a free one)
            console.print(f"coordinator waiting for workers: RECYCLE_STORE=<this host>:"
                          f"{self.store.port} torchrun ... -m executor.torchrun", soft_wrap=True)
        self.run_id = settings.run_id
        self.store.set(CONFIG, settings.to_json())
        self.mailbox = Mailbox(self.store)
        self.procs: dict[Worker, multiprocessing.Process] = {}
        self.reaped: set[int] = set()  # pids whose exit has been handled
        self.target: Callable = worker_child  # the process entry (benchmarks instrument it)

    def spawn(self, w: Worker) -> None:
        """A worker process: forked from a forkserver that has torch imported (real, separate
        processes; the same entry point as `python -m executor.worker`)."""
        if ROOT not in sys.path:
            sys.path.insert(0, ROOT)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["executor.forkserver_guard", "executor.worker"])
        p = ctx.Process(target=self.target, name=f"recycle-worker-{wkey(w)}", args=(
            f"127.0.0.1:{self.store.port}", w[0], w[1],
            os.path.join(self.run_dir, f"worker-{w[0]}-{w[1]}.log"), self.token, os.getpid()))
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
