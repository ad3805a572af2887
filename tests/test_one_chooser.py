"""Issue 44: the simulator's `recycle` (what the tables headline) and the product's
membership (the local coordinator's and the service's) choose the shape with the same
chooser, given the same inputs, at every event: the same shapes follow from the same
failures. The chooser's calls are recorded as they happen (the real method runs)."""
import pytest

from planner.control.membership import Membership
from planner.job import JobSpec
from planner.plan import home_id
from planner.shapes.choose import ShapeChooser
from planner.simulation.compare import simulate
from planner.simulation.policies import Params
from planner.simulation.trace import Event, Trace

UNIT_S = 1e-3
HORIZON_S = 50.0


@pytest.fixture
def calls(monkeypatch):
    """Each call of ShapeChooser.choose: (current cut, live workers by slot, horizon) ->
    the cut chosen."""
    out: list = []
    real = ShapeChooser.choose

    def recorded(self, current, live, horizon, *a, **kw):
        c = real(self, current, live, horizon, *a, **kw)
        out.append(((tuple(current.bounds), tuple(sorted(live.items())), round(horizon)),
                    tuple(c.shape.bounds)))
        return c
    monkeypatch.setattr(ShapeChooser, "choose", recorded)
    return out


EVENTS = [("fail", (1, 3)), ("fail", (0, 1)), ("fail", (1, 1)), ("recover", (0, 1)),
          ("fail", (0, 2)), ("recover", (1, 1)), ("recover", (1, 3)), ("recover", (0, 2))]


def _simulated(job: JobSpec, calls: list) -> list:
    trace = Trace([Event(100.0 * (i + 1), kind, (w,)) for i, (kind, w) in enumerate(EVENTS)])
    params = Params(detect_s=0, restart_s=60, snapshot_every=3, horizon_s=HORIZON_S)
    simulate(job, trace, 100.0 * (len(EVENTS) + 1), UNIT_S, params, ["recycle"])
    return list(calls)  # (the start is the user's grid, in both: no choice made)


def _membership(job: JobSpec, calls: list) -> list:
    calls.clear()
    m = Membership.start(job.replicas, job.stages, job=job, snapshots=True, pause=True,
                         disk=True, shapes=True, speed_cuts=True,
                         horizon=HORIZON_S / UNIT_S)
    for kind, w in EVENTS:
        m, _ = m.fail(w) if kind == "fail" else m.recover(w)
        m = m.entered(m.version)  # every live worker entered it before the next event
    return list(calls)


def test_the_simulator_and_the_membership_make_the_same_choices(calls):
    # unequal stage costs, so that shapes differ in worth
    job = JobSpec.model_validate({
        "replicas": 2, "stages": 4, "microbatches": 4, "p2p": {"intra": 1, "cross": 2},
        "cost": {"F": [30, 20, 20, 30], "I": [30, 20, 20, 30], "W": [24, 16, 16, 24],
                 "OPT": [5, 5, 5, 5]}})
    sim = _simulated(job, calls)
    run = _membership(job, calls)
    assert len(sim) == len(EVENTS)  # the chooser at every event, in both
    for i, (a, b) in enumerate(zip(run, sim)):
        assert a == b, (EVENTS[i], a, b)
    # and the events changed the shape: the comparison is not of one shape kept throughout
    assert len({chosen for _, chosen in run}) > 1
