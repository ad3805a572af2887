"""Membership: who is in which plan version, as a value and pure transitions.

The local coordinator (executor/launch/) and the plan service (api/) are drivers of this
one module: they feed it what they observe (a worker's process exited, a peer suspects a
worker, a newer process of a worker asks in, the straggler detector measured other speeds)
and carry out the decision it returns (publish version v with failed set F, or halt with a
reason, or nothing). No processes, no I/O, no clocks, no planning: a transition is a
function from (value, observation) to (value, decision), so every case the chaos harness
produces is a unit test of milliseconds (tests/test_membership.py).

Rules (docs/design.md, "Membership"):
- A worker's process is known by its incarnation (1 for its first process); a plan admits
  one incarnation per worker, and a report about an older one is stale.
- A death is a failure event at once: the survivors train re-routed until the worker is
  back. Losing every worker of a stage, with no other copy of its state, leaves no plan:
  the run halts naming the stage.
- State lives in tiers (live holders, peer-memory `snapshots`, `disk` checkpoints or the
  run's seed): a stage lost whole is restored when the run keeps snapshots or a disk copy.
- Elastic with `pause`: fewer live workers than a plan can use is no plan yet, but no loss
  either while every stage has a copy in some tier: the membership pauses, and further
  deaths and returns keep it paused until a version serves every stage. It halts only when
  some stage's state survives in no tier (the driver also halts a pause that no worker
  is due back to end). Workers that came back during the pause hold no state (`back`);
  no version admitted them, so `entered` leaves them so.
- A newer process of a failed worker is admitted by a plan that names its incarnation; a
  newer process of a worker the plan still counts as live replaces it (same failed set).
- A suspect with nobody dead is answered by the same failed set as a new version, so that
  every worker rebuilds its communicators; only the version it was reported under counts.
- A node removed (a spot preemption notice, an instance gone) is one change: its workers
  fail together in one version (`fail_many`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Literal, Optional, Union

from planner.control.elastic import reassign, slots_of
from planner.control.roles import dead_of, failed_of
from planner.failures import NoPlanError, Worker
from planner.job import JobSpec
from planner.plan import Move, Plan, Role, home_id, home_of
from planner.shapes.partition import Partition

State = Literal["running", "paused", "halted", "finished"]
Grid = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Publish:
    """Publish version `version` for `failed` (the empty slots), admitting `incarnations`
    (per worker, by home slot), with `roles` (None: identity) and the `moves` they ask for.
    `same_plan`: the failed set and speeds are those in force, so the plan in force may
    be re-stamped."""
    version: int
    failed: tuple[Worker, ...]
    incarnations: Grid
    cause: str
    same_plan: bool = False
    roles: Optional[tuple[Role, ...]] = None
    moves: tuple[Move, ...] = ()
    # A plan of another shape: the job the partition cuts (planned with `failed` as its
    # empty slots, roles naming slots of its grid) and the partition the plan carries.
    shape_job: Optional[JobSpec] = None
    partition: Optional[Partition] = None

    def incarnation_rows(self) -> list[list[int]]:
        return [list(row) for row in self.incarnations]


@dataclass(frozen=True)
class Halt:
    """No plan exists for the membership: the run stops with this one-line reason."""
    reason: str


@dataclass(frozen=True)
class Pause:
    """Too few live workers to serve every stage, but nothing lost: nobody trains until
    enough are back (a later transition publishes); the driver may give up and halt."""
    reason: str


@dataclass(frozen=True)
class Reject:
    """The observation conflicts with the membership (a stale or repeated report): nothing
    changes; the service answers it with a 409 and this reason."""
    reason: str


@dataclass(frozen=True)
class Unchanged:
    """Nothing to publish (e.g. a resync for a version already superseded)."""
    why: str = ""


Decision = Union[Publish, Pause, Halt, Reject, Unchanged]


def _name(w: Worker) -> str:
    return f"worker {w[0]}:{w[1]}"


@dataclass(frozen=True)
class Membership:
    replicas: int
    stages: int
    incarnations: Grid
    failed: frozenset = frozenset()
    version: int = -1  # the newest version published (-1: none yet)
    speeds: Optional[Grid] = None  # the speeds the plan in force was made for (None: nominal)
    state: State = "running"
    reason: Optional[str] = None
    # Elastic (planner/control/elastic.py): with a job, a worker may change stage when the
    # live set changes; `failed` is then the dead workers (by home slot) and `roles` who
    # fills which slot (None: identity). Without a job, a stage with nobody left halts.
    job: Optional[JobSpec] = None
    roles: Optional[tuple[Role, ...]] = None
    snapshots: bool = False  # every stage's state also lives in peer memory
    horizon: float = 0.0  # time units the moves are weighed over (roles.choose_roles)
    # Workers a move of the newest version sends to a stage they hold nothing of yet: until
    # every worker has entered that version (`entered`), they count as holding no state, so
    # a stage whose only other holders die meanwhile is known to need a snapshot.
    moving: frozenset = frozenset()
    # The driver has a paused state: fewer live workers than a plan can use pauses rather
    # than halts while every stage's state has a copy in some tier (the local coordinator
    # waits for its restarts, the service for its workers or an operator).
    pause: bool = False
    # A stage lost whole is also restorable from a disk checkpoint or the run's seed (the
    # executor's disk tier, executor/runtime/stage_state/): without it, only `snapshots`
    # (peer memory) keep a copy of a stage whose every live holder died.
    disk: bool = False
    # Workers that came back while paused: no version admits them yet, so they hold no
    # state; unlike `moving`, no `entered` clears them (the version in force was entered
    # before they came back). Empty while running.
    back: frozenset = frozenset()
    # Shapes (docs/design.md section 12): where fewer live workers are left than stages,
    # the pipeline is cut into fewer stages (planner/shapes/) instead of pausing or halting;
    # once cut, every later version is planned on a shape (it carries a partition, the
    # job's own one included: the workers then know to compare shapes, reshape.py).
    shapes: bool = False
    # ... and at every event, with as many live workers as stages too: the pipeline is cut
    # for speed, and goes back (`--shape speed`; without it, only once too few are left)
    speed_cuts: bool = False
    partition: Optional[Partition] = None  # of the newest version (None: the job's own)
    shape_job: Optional[JobSpec] = None  # the job that partition cuts

    # ---- construction and lookups -----------------------------------------------------
    @classmethod
    def start(cls, replicas: int, stages: int, failed: Iterable[Worker] = (),
              incarnations: Optional[Iterable[Iterable[int]]] = None, version: int = -1,
              state: State = "running", reason: Optional[str] = None,
              job: Optional[JobSpec] = None, roles: Optional[Iterable[Role]] = None,
              snapshots: bool = False, horizon: float = 0.0,
              pause: bool = False, shapes: bool = False, disk: bool = False,
              speed_cuts: bool = False) -> "Membership":
        grid = (tuple(tuple(row) for row in incarnations) if incarnations is not None
                else tuple((1,) * stages for _ in range(replicas)))
        return cls(replicas, stages, grid, frozenset(tuple(w) for w in failed), version,
                   state=state, reason=reason, job=job,
                   roles=None if roles is None else tuple(roles), snapshots=snapshots,
                   horizon=horizon, pause=pause, shapes=shapes, disk=disk,
                   speed_cuts=speed_cuts)

    @classmethod
    def following(cls, plan: Plan, **kw) -> "Membership":
        """The membership a published plan says (a driver that follows another's plans,
        or one restarted from them): its version, incarnations and roles, and its dead
        workers: with roles, every worker whose id fills no slot; without, the failed set."""
        # a plan of another shape runs the job its partition cuts: workers keep their
        # home slots in the user's grid (`job`, which such a follower must be given)
        grid = kw["job"] if plan.partition is not None else plan.job
        replicas, stages = grid.replicas, grid.stages
        if plan.roles is None:
            dead = [tuple(w) for w in plan.failed]
        else:
            dead = dead_of(plan.roles, replicas, stages)
        kw.setdefault("failed", dead)
        m = cls.start(replicas, stages, incarnations=plan.incarnations,
                      version=plan.version, roles=plan.roles, **kw)
        if plan.partition is not None:
            m = replace(m, partition=plan.partition, shape_job=plan.job)
        # its moves count as in flight until its workers are seen to enter it (`entered`)
        m = replace(m, moving=frozenset(home_of(mv.worker) for mv in plan.moves or ()))
        if m.state == "paused":  # live workers no slot of the plan names came back meanwhile
            named = (set(dead_of(plan.roles, replicas, stages)) if plan.roles is not None
                     else {tuple(w) for w in plan.failed})
            m = replace(m, back=frozenset(named - m.failed))
        return m

    def incarnation(self, w: Worker) -> int:
        return self.incarnations[w[0]][w[1]]

    def live(self) -> list[Worker]:
        return [(r, s) for r in range(self.replicas) for s in range(self.stages)
                if (r, s) not in self.failed]

    def in_grid(self, w: Worker) -> bool:
        return 0 <= w[0] < self.replicas and 0 <= w[1] < self.stages

    def empty_slots(self) -> tuple[Worker, ...]:
        """The slots no live worker fills: the failed set plans are made for."""
        if self.roles is None:
            return tuple(sorted(self.failed))
        grid = self.shape_job or self.job
        R, S = (grid.replicas, grid.stages) if grid is not None else (self.replicas, self.stages)
        return tuple(failed_of(list(self.roles), R, S))

    def dead_stage(self, failed: Iterable[Worker]) -> Optional[int]:
        count = [0] * self.stages
        for _, s in failed:
            count[s] += 1
        return next((s for s, c in enumerate(count) if c >= self.replicas), None)

    # ---- transitions --------------------------------------------------------------------
    def first(self) -> tuple["Membership", Decision]:
        """The run's first version (every worker at the incarnation it has)."""
        if self.job is not None and self.failed:  # workers down from the start
            # too few to start is a halt, not a pause: no worker has entered a version yet
            m, d = replace(self, pause=False)._reassigned(self.failed, (), self.incarnations,
                                                          "start")
            return replace(m, pause=self.pause), d
        return self._publish(self.failed, self.incarnations, "start")

    def fail(self, w: Worker, incarnation: Optional[int] = None,
             cause: str = "failure") -> tuple["Membership", Decision]:
        """Worker `w`'s process is gone (its exit seen, its heartbeat stopped, a newer
        process replaced it): a plan without it, or a halt if its stage has nobody left."""
        bad = self._check(w)
        if bad:
            return self, bad
        have = self.incarnation(w)
        if w in self.failed:
            return self, Reject(f"{_name(w)} has already failed")
        if incarnation is not None and incarnation < have:
            return self, Reject(f"{_name(w)} incarnation {incarnation} is superseded by "
                                f"{have}; its failure is stale")
        return self._without(self.failed | {w}, cause)

    def fail_many(self, workers: Iterable[tuple[Worker, Optional[int]]],
                  cause: str = "remove") -> tuple["Membership", Decision]:
        """Several workers' processes are gone at once (a node removed: a spot preemption
        notice, an instance gone), each with the incarnation named (None: whichever is in
        force): one version without all of them, or a halt. A worker already failed, or
        named by a superseded incarnation, is left out (its own report came first); with
        none left, nothing changes."""
        given = list(dict.fromkeys((tuple(w), k) for w, k in workers))
        for w, _ in given:
            bad = self._check(w)
            if bad:
                return self, bad
        gone = [w for w, k in given
                if w not in self.failed and (k is None or k >= self.incarnation(w))]
        if not gone:
            return self, Reject(f"{', '.join(_name(w) for w, _ in given) or 'no worker'}: "
                                "failed already or superseded; nothing to remove")
        return self._without(self.failed | set(gone), cause)

    def _without(self, failed: frozenset, cause: str) -> tuple["Membership", Decision]:
        """The next version for the failed set `failed` (roles reassigned when elastic), or
        a halt when some stage is left with nobody."""
        if self.job is not None:
            return self._reassigned(failed, (), self.incarnations, cause)
        dead = self.dead_stage(failed)
        if dead is not None:
            halted = replace(self, failed=failed, state="halted", reason=str(NoPlanError(dead)))
            return halted, Halt(halted.reason)
        return self._publish(failed, self.incarnations, cause)

    def recover(self, w: Worker, incarnation: Optional[int] = None,
                cause: str = "recovery") -> tuple["Membership", Decision]:
        """A process of `w` is ready to train: a failed worker comes back (its incarnation
        given, or the next one), or a newer process replaces a live one."""
        bad = self._check(w)
        if bad:
            return self, bad
        have, k = self.incarnation(w), incarnation
        if w in self.failed:
            if k is not None and k < have:
                return self, Reject(f"{_name(w)} incarnation {k} is older than {have}")
            # without an incarnation: the next one, so plans still tell processes apart
            grid = self._with_incarnation(w, have + 1 if k is None else k)
            if self.job is not None:
                return self._reassigned(self.failed - {w}, (w,), grid, cause)
            return self._publish(self.failed - {w}, grid, cause)
        if k is None:
            return self, Reject(f"{_name(w)} is live; nothing to recover (a restarted "
                                "process replaces it by sending its incarnation)")
        if k <= have:
            return self, Reject(f"{_name(w)} incarnation {k} is not newer than {have}")
        if self.state == "paused" and self.job is not None:
            # no version to re-stamp: the new process holds nothing, as a return does
            return self._reassigned(self.failed, (w,), self._with_incarnation(w, k),
                                    "replacement")
        return self._publish(self.failed, self._with_incarnation(w, k), "replacement",
                             same_plan=True)

    def resync(self, version: int) -> tuple["Membership", Decision]:
        """A suspect was reported under `version` and nobody died since: the same failed set
        as a new version (every worker rebuilds its communicators)."""
        if self.state != "running":
            return self, Unchanged(f"job {self.state}")
        if version != self.version:
            return self, Unchanged(f"v{version} already superseded by v{self.version}")
        return self._publish(self.failed, self.incarnations, "resync", same_plan=True)

    def measured(self, speeds: Optional[Iterable[Iterable[float]]],
                 cause: str = "speed") -> tuple["Membership", Decision]:
        """The speeds to plan for changed (a slow worker, or one nominal again)."""
        new = self.with_speeds(speeds)
        if self.state != "running":
            return self, Unchanged(f"job {self.state}")
        if new.speeds == self.speeds:
            return self, Unchanged("speeds in force")
        if self.partition is not None:  # shaped plans are made for nominal speeds
            return new, Unchanged("the pipeline runs another shape: plans there are made "
                                  "for nominal speeds")
        return new._publish(self.failed, self.incarnations, cause)

    def improved(self, cause: str = "improved") -> tuple["Membership", Decision]:
        """A better plan for the membership in force (a solver finished): a new version."""
        if self.state != "running":
            return self, Unchanged(f"job {self.state}")
        return self._publish(self.failed, self.incarnations, cause)

    def with_speeds(self, speeds: Optional[Iterable[Iterable[float]]]) -> "Membership":
        """The same membership, planned for `speeds` (None: nominal)."""
        return replace(self, speeds=None if speeds is None else tuple(tuple(r) for r in speeds))

    def with_snapshots(self, on: bool) -> "Membership":
        """The same membership, knowing whether the run keeps peer-memory snapshots: a
        run started with `--snapshot-every auto` is taken to keep them until its workers
        have chosen K, and auto may choose off (the memory budget, cadence.py). The next
        transition plans with it: no restore from a snapshot nobody holds, the one-copy
        stages counted as a halt risk."""
        return self if self.snapshots == bool(on) else replace(self, snapshots=bool(on))

    def finish(self) -> tuple["Membership", Decision]:
        if self.state == "halted":
            return self, Reject(self.reason or "job halted")
        return replace(self, state="finished"), Unchanged("finished")

    # ---- helpers ------------------------------------------------------------------------
    def _check(self, w: Worker) -> Optional[Reject]:
        if not self.in_grid(w):
            return Reject(f"{_name(w)} is outside the {self.replicas}x{self.stages} grid")
        if self.state == "halted":
            return Reject(f"job is halted ({self.reason})")
        if self.state == "finished":
            return Reject("job is finished: training completed")
        return None

    def _with_incarnation(self, w: Worker, k: int) -> Grid:
        rows = [list(row) for row in self.incarnations]
        rows[w[0]][w[1]] = k
        return tuple(tuple(row) for row in rows)

    def _reassigned(self, failed: frozenset, fresh: tuple, grid: Grid,
                    cause: str) -> tuple["Membership", Decision]:
        """Elastic: the roles for the new live set (elastic.reassign, or a shape), else a
        pause or a halt (`_held`)."""
        failed = frozenset(failed)
        stateless = tuple(fresh) + tuple(sorted(w for w in self.moving | self.back
                                                if w not in failed and w not in fresh))
        live = self.replicas * self.stages - len(failed)
        why = f"{live} live worker{'s' if live != 1 else ''} cannot serve {self.stages} stages"
        # the shape worth most over the horizon, the job's own included (the chooser the
        # simulator's `recycle` calls: with `speed_cuts`, at every event)
        shaped = self.shapes and (self.speed_cuts or live < self.stages
                                  or self.partition is not None)
        out = self._reshaped(failed, stateless, grid, cause) if shaped else None
        if isinstance(out, tuple):
            return out
        if isinstance(out, str):
            why = out  # no shape fits them: pause for returns, as a fixed shape does
        elif live >= self.stages:  # the job's own shape stays: its roles
            out, no = reassign(self.job, failed, self.roles, stateless, self.horizon,
                               self.snapshots, restorable=self.restorable)
            if out is not None:
                new = replace(self, roles=out.roles, state="running", reason=None,
                              back=frozenset(),
                              moving=frozenset(home_of(m.worker) for m in out.moves))
                return new._publish(failed, grid, cause, moves=out.moves)
            why = no
        return self._held(failed, fresh, stateless, grid, why)

    @property
    def restorable(self) -> bool:
        """Is a stage whose every live holder died restorable from another tier?"""
        return self.snapshots or self.disk

    def _held(self, failed: frozenset, fresh: tuple, stateless: tuple, grid: Grid,
              why: str) -> tuple["Membership", Decision]:
        """No version serves this live set: a pause while every stage's state has a copy
        in some tier and the driver can wait (`pause`), else a halt naming why: the stage
        with no copy left, or the live set no plan can use."""
        lost = self.lost_stage(failed, stateless)
        if lost is not None:
            why = (f"stage {lost} has no live replica and no snapshot in peer memory "
                   "(`recycle train --snapshot-every K` keeps them): restore from checkpoint")
        elif self.pause:
            paused = replace(self, failed=failed, incarnations=grid, state="paused",
                             reason=why, moving=self.moving - failed,
                             back=frozenset((self.back | set(fresh)) - failed))
            return paused, Pause(why)
        halted = replace(self, failed=failed, incarnations=grid, state="halted", reason=why)
        return halted, Halt(why)

    def lost_stage(self, failed: Iterable[Worker], stateless: Iterable[Worker] = ()
                   ) -> Optional[int]:
        """The first stage (of the shape in force) no live worker holds and no other tier
        keeps a copy of (`restorable`); None when every stage has a copy somewhere."""
        if self.restorable:
            return None
        failed = {tuple(w) for w in failed}
        stateless = {tuple(w) for w in stateless}
        live = slots_of(self.replicas, self.stages, failed | stateless, self.roles)
        held = {slot[1] for slot in live.values()}
        stages = self.shape_job.stages if self.shape_job is not None else self.stages
        return next((s for s in range(stages) if s not in held), None)

    def _reshaped(self, failed: frozenset, stateless: tuple, grid: Grid,
                  cause: str) -> Union[tuple["Membership", Decision], str, None]:
        """The shape (planner/shapes/choose.py), slots and moves for the live set, from
        the shape in force; the reason when no shape fits the live workers; None when the
        job's own shape, in force, stays (its roles are elastic.reassign's)."""
        from planner.shapes.planning import shaped_plan_parts
        current = (self.partition, self.shape_job) if self.partition is not None else None
        live: dict = slots_of(self.replicas, self.stages, set(failed) | set(stateless),
                              self.roles)
        for w in stateless:
            if tuple(w) not in failed:
                live[home_id(*w)] = None
        lost = self.lost_stage(failed, stateless)  # a stage of the shape in force, no copy
        if lost is not None:
            return (f"stage {lost} has no live replica and no snapshot in peer memory "
                    "(`recycle train --snapshot-every K` keeps them): restore from "
                    "checkpoint")
        out = shaped_plan_parts(self.job, current, live, self.horizon, self.snapshots)
        if isinstance(out, str):
            return out
        choice, part = out
        if current is None and not choice.changed:
            return None
        new = replace(self, roles=tuple(choice.roles), state="running", reason=None,
                      partition=part, shape_job=choice.shape.job, back=frozenset(),
                      moving=frozenset(home_of(m.worker) for m in choice.moves))
        return new._publish(failed, grid, cause, moves=tuple(choice.moves))

    def entered(self, version: int) -> "Membership":
        """Every live worker entered `version`: its moves are done (the movers hold their
        stages now). Workers back during a pause (`back`) entered no version: they stay
        without state."""
        return replace(self, moving=frozenset()) if version == self.version else self

    def _publish(self, failed: frozenset, grid: Grid, cause: str, same_plan: bool = False,
                 moves: tuple = ()) -> tuple["Membership", Publish]:
        new = replace(self, failed=frozenset(failed), incarnations=grid, version=self.version + 1)
        return new, Publish(new.version, new.empty_slots(), grid, cause, same_plan,
                            new.roles, tuple(moves), new.shape_job, new.partition)
