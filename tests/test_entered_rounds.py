"""A move counts as done once every live worker says it entered the version in force
(api/jobs/runtime.py JobRuntime.note_entered): the workers still to enter are listed once
per membership rather than scanned on every heartbeat; the moment the movers hold their
stages is the same as the plain rule's, whatever order the heartbeats come in."""
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from api.jobs.runtime import JobRuntime
from planner.control.membership import Membership
from planner.job import JobSpec
from planner.solvers.backends import solve


def _runtime(D: int, S: int, dead, moving) -> JobRuntime:
    spec = JobSpec.uniform(D, S, 2)
    m = Membership.start(D, S, failed=dead, job=spec, version=3)
    m = Membership(**{**m.__dict__, "moving": frozenset(moving)})
    plan = solve(JobSpec.uniform(1, 1, 1), [], "greedy")  # not read by note_entered
    return JobRuntime(id="j", spec=spec, token_hash="", max_failures=1, created=0.0,
                      plan=plan, plan_bytes=b"", members=m)


def _plain_done(job: JobRuntime) -> bool:
    m = job.members
    return all(job.entered.get((r, s), -1) >= m.version for r in range(m.replicas)
               for s in range(m.stages) if (r, s) not in m.failed)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_moves_are_done_exactly_when_every_live_worker_entered(D, S, data):
    cells = [(r, s) for r in range(D) for s in range(S)]
    dead = data.draw(st.lists(st.sampled_from(cells), unique=True, max_size=len(cells) - 1))
    live = [c for c in cells if c not in dead]
    job = _runtime(D, S, dead, [live[0]])
    beats = data.draw(st.lists(st.tuples(st.sampled_from(cells), st.integers(1, 4)),
                               max_size=3 * len(cells)))
    for w, version in beats:
        was_moving = bool(job.members.moving)
        job.note_entered(w, version)
        if was_moving:
            assert (not job.members.moving) == _plain_done(job), (w, version)


def test_a_round_of_heartbeats_at_4096_workers_is_linear():
    # in slot order, the plain scan checks every worker already in before it stops at the
    # first one not yet in: n^2/2 = 8.4M checks a round (0.8 s on an idle core); the
    # list, 4,096 discards (2 ms)
    job = _runtime(256, 16, [], [(0, 0)])
    t0 = time.perf_counter()
    for r in range(256):
        for s in range(16):
            job.note_entered((r, s), 3)
    assert not job.members.moving
    assert time.perf_counter() - t0 < 0.25
