"""The run's worker processes: local ones forked from a forkserver that has torch
imported, and external (torchrun'd) ones known only by their heartbeats in the store."""
from __future__ import annotations

import multiprocessing
import os
import sys
import time

from executor.inputs.worker_settings import WorkerSettings
from executor.runtime.comm import host_store
from executor.protocol import CONFIG, heartbeat_key, wkey
from executor.runtime.rendezvous import Mailbox
from executor.worker import child as worker_child

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Worker = tuple[int, int]
# External workers heartbeat every 0.5 s: once a peer has reported a suspect, a worker
# silent this long is dead (torchrun restarting its node), not slow, so the survivors train
# re-routed instead of waiting out 3 x --timeout for the restart.
SILENT_AFTER_SUSPECT_S = 2.0


class Processes:
    """Mixed into the Coordinator (launcher.py): its store, run dir and members."""

    def open_store(self, port: int, settings: WorkerSettings) -> None:
        """The run's TCPStore, with the workers' settings in it. Loopback unless torchrun'd
        workers on other machines must reach it: the store has no authentication, so it
        never holds a secret (the service token travels apart)."""
        self.store = host_store("0.0.0.0" if self.external else "127.0.0.1", port,
                                self.timeout)
        if self.external:  # the port actually bound (--store-port 0 picks a free one)
            self.console.print(f"coordinator waiting for workers: RECYCLE_STORE=<this host>:"
                               f"{self.store.port} torchrun ... -m executor.torchrun",
                               soft_wrap=True)
        self.run_id = settings.run_id
        self.store.set(CONFIG, settings.to_json())
        self.mailbox = Mailbox(self.store)

    def spawn(self, w: Worker) -> None:
        """A worker process: forked from a forkserver that has torch imported (real, separate
        processes; the same entry point as `python -m executor.worker`)."""
        if ROOT not in sys.path:
            sys.path.insert(0, ROOT)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["executor.forkserver_guard", "executor.worker"])
        p = ctx.Process(target=worker_child, name=f"recycle-worker-{wkey(w)}", args=(
            f"127.0.0.1:{self.store.port}", w[0], w[1],
            os.path.join(self.run_dir, f"worker-{w[0]}-{w[1]}.log"),
            self.service.token if self.service else None, os.getpid()))
        p.start()
        self.procs[w] = p

    def check_heartbeats(self) -> None:
        """External workers: a heartbeat older than 3 x --timeout is a death; once a peer
        has reported a suspect, one older than SILENT_AFTER_SUSPECT_S is."""
        limit = self.timeouts.silent_worker
        if self.suspect_since is not None:
            limit = min(limit, SILENT_AFTER_SUSPECT_S)
        for w in self.live():
            if self.store.check([heartbeat_key(w)]):
                t, _, inc = self.store.get(heartbeat_key(w)).decode().split()
                if int(inc) == self.members.incarnation(w) and time.time() - float(t) > limit:
                    self.died(w, f"heartbeat stopped {time.time() - float(t):.1f} s ago")
