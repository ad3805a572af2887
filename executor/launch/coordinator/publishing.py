"""Plan versions of a run: decided by planner/control/membership.py and published here through
the store (local), or taken from the plan service, which decides them (--service)."""
from __future__ import annotations

import time
from typing import Callable, Optional

from executor.launch.report.run_record import RunRecord
from executor.runtime.transport.rendezvous import publish_plan
from planner.control.decision_plan import plan_for, planned_on
from planner.control.membership import Halt, Membership, Pause, Publish
from planner.job import JobSpec
from planner.plan import Mode, Plan
from planner.solvers.backends import solve
from planner.speeds import with_speeds

Worker = tuple[int, int]


class Halted(Exception):
    """The membership leaves no plan (planner/control/membership.py Halt): the run stops."""


class Plans:
    """Owns who is in which version (the Membership), the plan in force, and the pause."""

    def __init__(self, store, job: JobSpec, members: Membership, *, solver: str, mode: Mode,
                 record: RunRecord, event: Callable[[str], None]):
        self.store, self.job, self.solver, self.mode = store, job, solver, mode
        self.record, self.event = record, event
        # the failed set, the incarnation each worker's newest plan admits, the speeds
        # planned for: decided there; here carried out (local) or followed (--service)
        self.members = members
        self.version, self.plan = -1, None
        self.paused_since: Optional[float] = None  # fewer live workers than stages
        self.suspect_since: Optional[float] = None  # a peer's comm op failed under `version`

    @property
    def failed(self) -> frozenset:
        return self.members.failed

    def live(self) -> list[Worker]:
        return [w for w in self.plan.live_workers() if w not in self.failed]

    def first(self) -> None:
        self.decide(*self.members.first())

    def final(self) -> None:
        """A last version with no workers: every worker exits."""
        self._install(self.plan.model_copy(update={"version": self.version + 1, "workers": []}))

    def decide(self, members: Membership, decision) -> None:
        """Carry out a membership decision (local mode): plan and publish, or pause, or halt."""
        self.members = members
        if isinstance(decision, Halt):
            raise Halted(decision.reason)
        if isinstance(decision, Pause):  # nobody trains until enough workers are back
            if self.paused_since is None:
                self.paused_since = time.monotonic()
                self.record.paused()
                self.event(f"training paused: {decision.reason}; waiting for workers to "
                           "come back (every stage's state has a copy in peer memory, on "
                           "disk or at the start)")
            return
        if not isinstance(decision, Publish):
            return
        if self.paused_since is not None:
            waited = time.monotonic() - self.paused_since
            self.record.resumed(waited)
            self.paused_since = None
            self.event(f"training resumes after {waited:.1f} s paused")
        # a plan of another shape is planned on the job its partition cuts (measured
        # speeds are of the job's own grid: a shaped plan is made for nominal ones)
        spec = planned_on(decision, with_speeds(self.job, members.speeds))
        plan = plan_for(decision, self.plan, spec.spec_hash(),
                        lambda failed: solve(spec, failed, solver=self.solver, mode=self.mode))
        if plan.partition is not None and (self.plan is None
                                           or self.plan.partition != plan.partition):
            self.event(f"plan v{decision.version}: the pipeline changes shape to "
                       f"{plan.job.stages} stages of {plan.partition.unit}s "
                       f"{plan.partition.bounds} for {len(plan.workers)} live workers")
        if decision.roles is not None:
            self.moved(plan)
        self.suspect_since = None
        self._install(plan)

    def suspected(self, version: int) -> None:
        """A worker's comm op failed under `version`: from now (the first report) a resync
        is due unless somebody dies (launcher tick, planner/control/timing.py)."""
        if version == self.version and self.suspect_since is None:
            self.suspect_since = time.monotonic()

    def snapshots_chosen(self, every: int) -> None:
        """The run's K is known (`--snapshot-every auto` chose it, cadence.py; the
        membership took them as on until then). Off (the copies exceed the memory budget):
        the membership plans without them from now on: a stage lost whole is restored from
        a disk checkpoint or the seed where it counts that tier, else the run halts naming
        the stage, and a stage left with one live holder is a halt risk again."""
        if every != 0 or not self.members.snapshots:
            return
        self.members = self.members.with_snapshots(False)
        self.event("the membership plans without peer-memory snapshots from now on: " + (
            "a stage that loses every worker restores from a disk checkpoint or the seed"
            if self.members.disk else "a stage that loses every worker halts the run"))

    def follow(self, plan: Plan) -> bool:
        """Service mode: take the service's newest plan; True if it is a new version."""
        if plan.version == self.version:
            return False
        self.version, self.plan = plan.version, plan
        self.record.published(plan)
        # who is dead and who fills which slot, as the plan says (with roles, a dead worker
        # is one whose id fills no slot; planner/control/membership.py `following`)
        self.members = Membership.following(plan, job=self.job)
        self.event(f"service published plan v{plan.version} (failed {sorted(self.failed) or '-'})")
        self.moved(plan)
        return True

    def _install(self, plan: Plan) -> None:
        self.version, self.plan = plan.version, plan
        publish_plan(self.store, plan)
        self.record.published(plan)

    def moved(self, plan: Plan) -> None:
        # a plan with a partition numbers its stages in its own cut: a worker that held
        # stage 0 of two and takes stage 0 of one moved, though the numbers agree
        cut = plan.partition is not None
        for m in plan.moves or ():
            held = "" if m.from_stage is None else (
                f" (it held stage {m.from_stage} of the shape before)" if cut else "")
            what = (f"takes stage {m.to_stage} of {plan.job.stages}{held}" if cut else
                    f"moves {'in' if m.from_stage is None else f'from stage {m.from_stage}'} "
                    f"to stage {m.to_stage}")
            self.event(f"plan v{plan.version}: worker {m.worker} {what} "
                       f"({_STATE_FROM[m.source]})")


# Move.source: "peer", a live holder of the stage sends it; "snapshot", none lives: the
# stage restores from the newest copy any tier holds (stage_state/entry_plan.py plan_restore), which
# the members agree on when they enter the plan -- the coordinator does not know it yet.
_STATE_FROM = {"peer": "state from a live peer",
               "snapshot": "no live holder: state from the newest copy in peer memory, "
                           "on disk or the start"}

