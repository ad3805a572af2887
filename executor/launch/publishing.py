"""Plan versions of a run: decided by planner/control/membership.py and published here through
the store (local), or taken from the plan service, which decides them (--service)."""
from __future__ import annotations

import time

from executor import protocol as P
from executor.runtime.rendezvous import publish_plan, read_int
from planner.control.decision_plan import plan_for
from planner.control.membership import Halt, Membership, Pause, Publish
from planner.solvers.backends import solve
from planner.plan import home_id
from planner.speeds import with_speeds

Worker = tuple[int, int]


class Halted(Exception):
    """The membership leaves no plan (planner/control/membership.py Halt): the run stops."""


class Publishing:
    """Mixed into the Coordinator (launcher.py): its store, job, members and record."""

    def publish(self, final: bool = False) -> None:
        if self.service is not None:
            if final:  # first the service (so exiting workers are not declared failed)
                self.service.finish(self.console)
                return self.store.set(P.FINISHED, "1")
            return self.follow()
        if final:
            plan = self.plan.model_copy(update={"version": self.version + 1, "workers": []})
        else:
            return self.decide(*self.members.first())
        self.version, self.plan = plan.version, plan
        publish_plan(self.store, plan)
        self.record.published(plan)

    def decide(self, members: Membership, decision) -> None:
        """Carry out a membership decision (local mode): plan and publish, or halt."""
        self.members = members
        if isinstance(decision, Halt):
            raise Halted(decision.reason)
        if isinstance(decision, Pause):  # nobody trains until enough workers are back
            if self.paused_since is None:
                self.paused_since = time.monotonic()
                self.record.pauses += 1
                self.event(f"training paused: {decision.reason}; waiting for workers to "
                           "come back (every stage's state stays in peer memory)")
            return
        if not isinstance(decision, Publish):
            return
        if self.paused_since is not None:
            waited = time.monotonic() - self.paused_since
            self.record.paused_s += waited
            self.paused_since = None
            self.event(f"training resumes after {waited:.1f} s paused")
        spec = with_speeds(self.job, members.speeds)
        plan = plan_for(decision, self.plan, spec.spec_hash(),
                        lambda failed: solve(spec, failed, solver=self.solver, mode=self.mode))
        if decision.roles is not None:
            self.moved(plan)
        self.version, self.plan, self.suspect_since = plan.version, plan, None
        publish_plan(self.store, plan)
        self.record.published(plan)

    @property
    def failed(self) -> frozenset:
        return self.members.failed

    def follow(self) -> None:
        """Service mode: take the newest plan the service published."""
        plan = self.service.plan
        if plan.version == self.version:
            return
        self.version, self.plan = plan.version, plan
        self.record.published(plan)
        # who is dead and who fills which slot, as the plan says (with roles, a dead worker
        # is one whose id fills no slot; planner/control/membership.py `following`)
        self.members = Membership.following(plan, job=self.job)
        for w, inc in list(self.reported.items()):  # in a plan now: failed, or back
            if w in self.failed or plan.incarnation(*w) > inc:
                del self.reported[w]
        for w in self.failed:
            self.done.pop(w, None)
        for w in list(self.rejoins.pending):  # the service admitted the restarted process
            if plan.slot_of(home_id(*w)) is not None and self.rejoins.admits(
                    w, plan.incarnation(*w), read_int(self.store, P.incarnation_key(w))):
                self.admitted(w)
        for w in self.failed:  # declared failed while its process lives on (a stall)
            if self.rejoins.await_failed(w, plan.incarnation(*w)):
                self.update_hold()
        self.event(f"service published plan v{plan.version} (failed {sorted(self.failed) or '-'})")
        self.moved(plan)

    def moved(self, plan) -> None:
        for m in plan.moves or ():
            self.event(f"plan v{plan.version}: worker {m.worker} moves "
                       f"{'in' if m.from_stage is None else f'from stage {m.from_stage}'} "
                       f"to stage {m.to_stage} (state from a {m.source})")

    def live(self) -> list[Worker]:
        return [w for w in self.plan.live_workers() if w not in self.failed]
