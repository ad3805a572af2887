"""Every time limit of a run, derived from its one `--timeout` (seconds before a silent peer
counts as failed), in one table: the workers' waits and the coordinator's patience.
Why each multiple is what it is stands beside it."""
from __future__ import annotations

from dataclasses import dataclass

from executor.inputs.run_config import CommSection
from planner.control.timing import Patience

# External workers heartbeat every 0.5 s: once a peer has reported a suspect, a worker
# silent this long is dead (torchrun restarting its node), not slow, so the survivors train
# re-routed instead of waiting out 3 x --timeout for the restart.
SILENT_AFTER_SUSPECT_S = 2.0


@dataclass(frozen=True)
class Timeouts:
    # --timeout ([comm], its one default): a p2p transfer, a collective, a rendezvous, a
    # store key
    comm: float = CommSection.timeout
    # Every call to the plan service (a worker's rejoin, the coordinator's end of training
    # and failure reports, a node agent's events) is retried this long while the service
    # is unreachable: it may be restarting (transport/waiting.py `retried`).
    service_outage: float = 300.0

    # ---- the workers ------------------------------------------------------------------
    @property
    def report_missing(self) -> float:
        """Members still missing from a world's rendezvous are reported after this: not
        sooner, a worker still starting has not heartbeated yet (a service would declare
        it failed after its grace)."""
        return 2 * self.comm

    @property
    def other_stages(self) -> float:
        """Another stage's gradient norm or tied gradients: it comes after that stage's
        backward, which may itself wait out a comm timeout first."""
        return max(3 * self.comm, 5.0)

    @property
    def state_io(self) -> float:
        """One stage's state moved whole: a peer-memory snapshot, a restore's or a change of
        shape's blob, a replay's boundary messages (megabytes to gigabytes over TCP, and the
        sender gathers and serialises it first)."""
        return max(30.0, 4 * self.comm)

    @property
    def coordinator_answer(self) -> float:
        """The coordinator's go-ahead of an injected fault, or its halt after a fatal
        report: it answers within a tick unless it is itself waiting out a comm timeout."""
        return 4 * self.comm

    # ---- the coordinator --------------------------------------------------------------
    @property
    def silent_worker(self) -> float:
        """An external (torchrun'd) worker whose heartbeat is older is dead: heartbeats go
        every 0.5 s, a worker blocked in a collective still beats."""
        return 3 * self.comm

    def rejoin_limit(self, service: bool) -> float:
        """How long a due rejoin (or a paused run) waits for the new process: its start,
        its store connection and a comm timeout; with a service, an outage of it too."""
        return 4 * self.comm + (60.0 if service else 5.0)

    @property
    def workers_exit(self) -> float:
        """Workers told the run ended (or halted) exit within this."""
        return 2 * self.comm

    @property
    def resync_after(self) -> float:
        """A suspect with nobody dead re-publishes after one comm timeout (and a tick): a
        worker still blocked in the old version must be able to reach the new one."""
        return self.comm + 0.3

    def patience(self, service: bool) -> Patience:
        """The coordinator's membership timing (planner/control/timing.py), from this table."""
        return Patience(silent=self.silent_worker, suspect_grace=SILENT_AFTER_SUSPECT_S,
                        resync_after=self.resync_after, pause_limit=self.rejoin_limit(service))
