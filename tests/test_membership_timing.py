"""planner/control/timing.py: the membership timing rules the local coordinator and the
plan service share, as pure functions, and that both sides take their limits from them."""
from hypothesis import given, strategies as st

from api.jobs.runtime import ServiceConfig
from executor.timeouts import SILENT_AFTER_SUSPECT_S, Timeouts
from planner.control.timing import Patience, admission, dead_at, pause_verdict, resync_due

P = Patience(silent=15.0, suspect_grace=2.0, resync_after=5.3, pause_limit=25.0)


def test_silence_is_cut_to_the_grace_once_suspected():
    assert dead_at(100.0, P, suspected=False) == 115.0
    assert dead_at(100.0, P, suspected=True) == 102.0
    # a grace longer than the patience never lengthens it
    assert dead_at(0.0, Patience(1.0, 9.0, 1.0), suspected=True) == 1.0


@given(st.floats(0, 1e6), st.floats(0.01, 100), st.floats(0.01, 100))
def test_a_suspect_never_lives_longer(last, silent, grace):
    p = Patience(silent, grace, 1.0)
    assert dead_at(last, p, True) <= dead_at(last, p, False)


def test_resync_waits_out_the_comm_timeout():
    assert not resync_due(None, 100.0, P)
    assert not resync_due(100.0, 105.0, P)
    assert resync_due(100.0, 105.4, P)


def test_admission():
    assert admission(2, 2, True, True, False) == "stale"  # the plan admits it already
    assert admission(3, 2, False, True, False) == "stale"  # died meanwhile
    assert admission(3, 2, True, False, False) == "wait"  # survivors still in the old world
    assert admission(3, 2, True, False, True) == "admit"  # paused: at once
    assert admission(3, 2, True, True, False) == "admit"


def test_pause_verdict():
    why = "2 live workers cannot serve 3 stages"
    assert pause_verdict(why, None, P, False, False) is None  # not paused
    assert pause_verdict(why, 1.0, P, False, False) == f"{why}, and no worker is due back"
    assert pause_verdict(why, 10.0, P, True, False) is None
    assert pause_verdict(why, 30.0, P, True, False) == f"{why}, and none came back within 30 s"
    assert pause_verdict(why, 1e5, P, True, True) is None  # a trace with nodes to add
    service = Patience(10.0, 2.5, 5.2, pause_limit=None)
    assert pause_verdict(why, 1e5, service, True, False) is None  # waits for an operator


def test_both_sides_take_their_limits_from_one_table():
    local = Timeouts(5.0).patience(service=False)
    assert local == Patience(15.0, SILENT_AFTER_SUSPECT_S, 5.3, 25.0)
    assert Timeouts(5.0).patience(service=True).pause_limit == 80.0
    svc = ServiceConfig(heartbeat_timeout_s=8.0).patience
    assert svc == Patience(8.0, 2.0, 4.2, None)
