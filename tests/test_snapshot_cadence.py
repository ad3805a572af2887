"""--snapshot-every auto (executor/runtime/peer_snapshots/cadence.py): K from a snapshot's
measured cost, agreed once through a real TCPStore, so every worker snapshots the same
iterations; and the flag's values."""
import threading

import pytest
from torch.distributed import TCPStore

from executor.runtime.peer_snapshots.cadence import (AUTO, CALIBRATION, COPIES_HELD, TARGET,
                                                     Cadence,
                                                     budget_bytes, choose, every_text,
                                                     host_memory, parse_budget, parse_every)


def test_flag_values():
    assert [parse_every(v) for v in ("auto", "AUTO", "off", "0", "7", 3)] == [AUTO, AUTO, 0, 0, 7, 3]
    assert [every_text(k) for k in (AUTO, 0, 5)] == ["auto", "off", "5"]
    for bad in ("-1", "often", "2.5", ""):
        with pytest.raises(ValueError, match="--snapshot-every must be auto, off or a number"):
            parse_every(bad)
    assert parse_budget("25%") == ("share", 0.25)
    assert parse_budget("8G") == ("bytes", 8 * 2 ** 30)
    assert parse_budget("512MiB") == ("bytes", 512 * 2 ** 20)
    for bad in ("0%", "150%", "x%", "lots", "-3G", "0"):
        with pytest.raises(ValueError, match="--snapshot-memory"):
            parse_budget(bad)
    assert budget_bytes("50%", 4) == int(0.5 * host_memory() / 4)


def test_choose_the_smallest_k_within_two_percent_or_off_over_budget():
    costs = [{"copy_s": 0.002, "send_s": 0.004, "bytes": 2 ** 20},
             {"copy_s": 0.001, "send_s": 0.0, "bytes": 2 ** 19}]
    # the dearer stage: 10 ms a snapshot (copy, send, receive), 100 ms an iteration -> 1%
    # (TARGET) of 10 iterations
    assert TARGET == 0.01
    assert choose(costs, 0.100, budget=2 ** 40).every == 10
    assert choose(costs, 0.101, budget=2 ** 40).every == 10
    assert choose(costs, 0.099, budget=2 ** 40).every == 11
    assert choose(costs, 10.0, budget=2 ** 40).every == 1  # cheap: every iteration
    off = choose(costs, 0.1, budget=COPIES_HELD * 2 ** 20 - 1)
    assert off.every == 0 and "--snapshot-memory" in off.why
    assert choose(costs, 0.1, budget=COPIES_HELD * 2 ** 20).every == 10


def _store():
    return TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)


def test_workers_agree_on_one_k_and_snapshot_the_same_iterations():
    store = _store()
    a = Cadence(AUTO, stages=2, store=TCPStore("127.0.0.1", store.port, 1, False))
    b = Cadence(AUTO, stages=2, store=TCPStore("127.0.0.1", store.port, 1, False))
    # the first iteration is snapshotted for the measurement, then none until K is chosen
    assert a.due(0) and b.due(0)
    a.measured(0, copy_s=0.001, send_s=0.009, nbytes=2 ** 20, writer=True)
    b.measured(1, copy_s=0.050, send_s=0.0, nbytes=2 ** 20, writer=False)  # not a writer
    assert not any(c.due(i) for i in range(1, CALIBRATION) for c in (a, b))
    # a decides from what is published (its own stage's 10 ms) and its iteration time;
    # b, though its own copy was dearer, takes a's choice: one K for the run
    da = a.due(CALIBRATION)
    db = b.due(CALIBRATION)
    assert a.choice == b.choice and a.choice.every >= 1 and "auto" in a.choice.why
    k = a.choice.every
    assert da == db == ((CALIBRATION + 1) % k == 0)
    picks = [i for i in range(CALIBRATION + 1, 60) if a.due(i)]
    assert picks == [i for i in range(CALIBRATION + 1, 60) if b.due(i)]
    assert all((i + 1) % k == 0 for i in picks)


def test_a_process_that_joins_late_takes_the_chosen_k():
    store = _store()
    first = Cadence(AUTO, stages=1, store=store)
    first.due(0)
    first.measured(0, 0.001, 0.001, 1000, writer=True)
    for i in range(1, CALIBRATION + 1):
        first.due(i)
    late = Cadence(AUTO, stages=1, store=TCPStore("127.0.0.1", store.port, 1, False))
    late.due(CALIBRATION + 5)
    assert late.choice == first.choice


def test_fixed_and_off_never_ask_the_store():
    fixed = Cadence(3, stages=2, store=None)
    assert [i for i in range(9) if fixed.due(i)] == [2, 5, 8]
    with pytest.raises(ValueError):
        from executor.runtime.peer_snapshots import PeerSnapshots
        PeerSnapshots(None, "w", 0, 2)


def test_the_iteration_time_ignores_a_rollback_and_only_the_calibration_is_timed():
    store = _store()
    c = Cadence(AUTO, stages=1, store=store)
    c.due(0)
    c.measured(0, 0.001, 0.001, 1000, writer=True)
    c.due(1)
    c.due(2)
    c._step_end[1] = c._step_end[2] + 5.0  # iteration 1 re-stepped after a rollback
    for i in range(3, CALIBRATION + 1):
        c.due(i)
    assert c.choice is not None and c.choice.every >= 1  # no negative or absurd gap
    n = len(c._step_end)
    for i in range(CALIBRATION + 1, CALIBRATION + 50):
        c.due(i)
    assert len(c._step_end) == n  # nothing grows once K is chosen
