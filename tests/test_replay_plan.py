"""The replay's pure parts: the boundary log (what it keeps, trims and refuses) and the
replay plan every member of a new world computes from the same all-gathered rows."""
import math

import pytest
import torch

from executor.runtime.peer_snapshots.cadence import log_budget
from executor.runtime.replay.boundary_log import BWD, FWD, TIED_GRAD, TIED_VALUE, BoundaryLog
from executor.runtime.replay.replay_plan import (Report, Window, decode, encode, inputs_of,
                                                 plan_replay, windows_of)
from executor.runtime.steps.tied import Tie, tied_inputs


def _t(x: float, n: int = 4) -> torch.Tensor:
    return torch.full((n,), float(x))


def test_the_log_keeps_copies_trims_at_the_second_newest_snapshot_and_forgets_a_rollback():
    log = BoundaryLog(budget=10 ** 6, origin=-1)
    sent = _t(1.0)
    log.keep(1, FWD, 0, 0, sent)
    sent.add_(5)  # the sender's tensor changes later: the log kept what was sent
    assert log.get(1, FWD, 0, 0).tolist() == [1.0] * 4
    for it in range(1, 8):
        log.keep(1, FWD, it, 0, _t(it))
        log.keep(0, BWD, it, 1, (_t(it), _t(-it)))  # a tuple message
    log.snapshot_at(3)  # snapshots -1 and 3: nothing before 0 to drop yet
    assert log.has(1, FWD, 0, 0)
    log.snapshot_at(5)  # snapshots 3 and 5: a replay starts at 4 at the earliest
    assert not log.has(1, FWD, 3, 0) and log.has(1, FWD, 4, 0) and log.has(0, BWD, 4, 1)
    log.keep(1, FWD, 2, 0, _t(2))  # below the floor: not kept
    assert not log.has(1, FWD, 2, 0)
    log.forget_from(6)
    assert log.has(1, FWD, 5, 0) and not log.has(1, FWD, 6, 0)
    log.rolled_back_to(4)
    assert not log.has(1, FWD, 5, 0) and log.snapshots == [3]
    assert log.bytes == sum(4 * 4 * (1 if isinstance(v, torch.Tensor) else 2)
                            for v in log.entries.values())


def test_the_log_refuses_past_its_budget_and_replaces_a_resent_message():
    log = BoundaryLog(budget=3 * 16)  # three 4-float messages
    for g in range(4):
        log.keep(2, FWD, 0, g, _t(g))
    assert [log.has(2, FWD, 0, g) for g in range(4)] == [True, True, True, False]
    assert log.stats.refused == 1 and log.bytes == 48 == log.stats.peak_bytes
    log.keep(2, FWD, 0, 0, _t(9.0))  # the iteration re-sent: replaced, not added
    assert log.get(2, FWD, 0, 0)[0] == 9.0 and log.bytes == 48
    assert log.coverage(2, FWD, 0, 4) == 0b0111
    off = BoundaryLog(budget=0)
    off.keep(1, FWD, 0, 0, _t(1))
    assert not off.on and not off.entries


def test_log_memory_flag_parses_shares_sizes_and_off_and_names_itself_when_wrong():
    assert log_budget("off", 2) == 0 and log_budget("0", 1) == 0
    assert log_budget("2G", 2) == 2 ** 30
    with pytest.raises(ValueError, match="--log-memory"):
        log_budget("lots", 1)


def test_windows_start_at_the_newest_copy_before_the_survivors_and_the_origin_counts():
    held = {1: {4, 9}, 2: {4}}
    w = windows_of([1, 2, 0], held, origin=-1, r=8)
    assert w[1] == Window(1, 4, 7) and list(w[1].iterations) == [5, 6, 7]
    assert w[0] == Window(0, -1, 7)  # nobody holds stage 0: the run's start
    assert windows_of([0], {}, origin=None, r=8) == {}  # resumed: no origin copy


def test_a_stages_inputs_are_its_neighbours_messages_and_its_ties_shares_or_values():
    mbs = [0, 1]
    assert inputs_of(1, 3, 2) == [(FWD, mbs), (BWD, mbs)]
    assert inputs_of(0, 3, 2) == [(BWD, mbs)] and inputs_of(2, 3, 2) == [(FWD, mbs)]
    ties = [Tie(((0, "embed.weight"), (2, "head.weight")))]  # owner stage 0, mirror 2
    assert tied_inputs(ties, 0) == ([2], []) and tied_inputs(ties, 2) == ([], [0])
    assert tied_inputs(ties, 1) == ([], [])
    assert inputs_of(0, 3, 2, tied_inputs(ties, 0)) == [(BWD, mbs), (TIED_GRAD, [2])]
    assert inputs_of(2, 3, 2, tied_inputs(ties, 2)) == [(FWD, mbs), (TIED_VALUE, [0])]


def _log_with(entries, norms=None, M=4):
    log = BoundaryLog(budget=10 ** 6)
    for key in entries:
        log.keep(*key, _t(0))
    for it, sums in (norms or {}).items():
        log.note_norms(it, sums)
    return log


@pytest.mark.parametrize("M", [4, 70])  # 70: masks over two all-gathered words
def test_reports_round_trip_through_ints(M):
    wins = {1: Window(1, 4, 6)}
    inputs = {1: inputs_of(1, 3, M)}
    log = _log_with([(1, FWD, 5, 0), (1, FWD, 5, M - 1), (1, BWD, 6, 2)],
                    norms={5: (0.25, 1 / 3, math.pi), 6: (1.0, 2.0, 3.0)})
    row = encode(log, wins, inputs, 3, M, clip=True)
    assert all(isinstance(x, int) and -2 ** 63 <= x < 2 ** 63 for x in row)
    rep = decode(row, wins, inputs, 3, M, clip=True)
    assert rep.masks[(1, FWD, 5)] == 1 | 1 << (M - 1) and rep.masks[(1, BWD, 6)] == 1 << 2
    assert rep.norms == {5: (0.25, 1 / 3, math.pi), 6: (1.0, 2.0, 3.0)}  # bit for bit


def _full(u, its, M, dirs):
    return {(u, d, it): (1 << M) - 1 for it in its for d in dirs}


def test_a_covered_loss_is_planned_spread_over_the_stage_and_moved_in_one_order():
    S, M = 3, 4
    wins = {1: Window(1, 4, 6)}
    a, b = (0, 0), (1, 0)  # stage 0 workers: the activations into stage 1
    c = (0, 2)  # stage 2: the gradients into stage 1
    r1, r2 = (0, 1), (1, 1)  # stage 1's new members
    members = {a: Report({(1, FWD, it): 0b0011 for it in (5, 6)}),
               b: Report({(1, FWD, it): 0b1111 for it in (5, 6)}),
               c: Report(_full(1, (5, 6), M, [BWD])), r1: Report(), r2: Report()}
    stages = {w: w[1] for w in members}
    rp, why = plan_replay([1], wins, {1: inputs_of(1, S, M)}, members, stages, M, clip=False)
    assert why == "" and rp.replayers[1] == (r1, r2) and rp.iterations == 2
    assert rp.mine(1, r1, M) == [0, 1] and rp.mine(1, r2, M) == [2, 3]
    assert rp.sources[(1, FWD, 5, 0)] == a and rp.sources[(1, FWD, 5, 3)] == b
    moves = rp.transfers(M)
    assert [(s, d) for s, d, _ in moves] == sorted((s, d) for s, d, _ in moves)
    assert {(s, d) for s, d, _ in moves} == {(a, r1), (b, r2), (c, r1), (c, r2)}
    assert sum(len(k) for _, _, k in moves) == 2 * M * 2


def test_what_is_missing_is_named_and_the_job_rolls_back():
    S, M = 3, 4
    wins = {1: Window(1, 4, 5)}
    inputs = {1: inputs_of(1, S, M)}
    members = {(0, 0): Report({(1, FWD, 5): 0b1011}), (0, 2): Report(_full(1, [5], M, [BWD])),
               (0, 1): Report()}
    stages = {w: w[1] for w in members}
    rp, why = plan_replay([1], wins, inputs, members, stages, M, clip=False)
    assert rp is None and why == ("no live worker logged the activation of micro-batch 2, "
                                  "iteration 5 into stage 1")
    members[(0, 0)] = Report({(1, FWD, 5): 0b1111})
    assert plan_replay([1], wins, inputs, members, stages, M, clip=True)[1] == \
        "no live worker kept the gradient norms of iteration 5"
    tied = {1: inputs_of(1, S, M, ([2], []))}  # stage 1 owns a weight stage 2 mirrors
    assert plan_replay([1], wins, tied, members, stages, M, clip=False)[1] == \
        "no live worker logged the tied-weight gradient share from stage 2, iteration 5 " \
        "into stage 1"
    members[(0, 2)].masks[(1, TIED_GRAD, 5)] = 1 << 2
    rp, why = plan_replay([1], wins, tied, members, stages, M, clip=False)
    assert why == "" and rp.sources[(1, TIED_GRAD, 5, 2)] == (0, 2)
    assert rp.receivers((1, TIED_GRAD, 5, 2), M) == ((0, 1),)  # every replayer of stage 1
    assert plan_replay([1, 2], {1: wins[1], 2: Window(2, 4, 5)},
                       {**inputs, 2: inputs_of(2, S, M)}, members, stages, M,
                       clip=False)[1] == "stages 1 and 2 were lost together"
    assert plan_replay([1], {}, {}, members, stages, M, clip=False)[1] == \
        "no live copy of stage 1's state"


def test_a_loss_right_after_its_snapshot_replays_nothing_and_still_keeps_the_survivors():
    rp, why = plan_replay([2], {2: Window(2, 7, 7)}, {2: inputs_of(2, 3, 4)}, {(0, 2): Report()},
                          {(0, 2): 2}, 4, clip=True)
    assert why == "" and rp.iterations == 0 and rp.transfers(4) == []


def test_a_survivor_waits_for_a_long_replay_while_it_progresses_and_not_longer():
    """The survivors' wait (replayer._await_replays): a replay longer than the per-step
    limit is waited for while its micro-batch counter moves; one that stops is given up."""
    import threading
    import time
    from datetime import timedelta
    from types import SimpleNamespace

    import torch.distributed as dist

    from executor.protocol import replay_key, replay_progress_key
    from executor.runtime.replay.replay_plan import ReplayPlan
    from executor.runtime.replay.replayer import _await_replays
    from executor.runtime.transport.waiting import WaitEnded

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
    agent = SimpleNamespace(store=store, conf=SimpleNamespace(
        timeouts=SimpleNamespace(other_stages=0.3)), newer_plan=lambda: None)
    plan = SimpleNamespace(version=7)
    rp = ReplayPlan({1: Window(1, 4, 5)}, {1: ((0, 1),)}, {}, {})

    def replay(steps: int, done: bool):
        for _ in range(steps):  # 1.2 s in all, a micro-batch every 0.1 s
            time.sleep(0.1)
            store.add(replay_progress_key(7, 1), 1)
        if done:
            store.set(replay_key(7, 1, 5), "1")

    t = threading.Thread(target=replay, args=(12, True))
    t0 = time.monotonic()
    t.start()
    _await_replays(agent, plan, rp)
    assert time.monotonic() - t0 > 1.0  # past the 0.3 s limit, four times over
    t.join()
    plan.version = 8  # a replay that stops after two micro-batches
    t = threading.Thread(target=lambda: (time.sleep(0.1), store.add(replay_progress_key(8, 1), 2)))
    t.start()
    with pytest.raises(WaitEnded, match="the replay of stage 1, iteration 5"):
        _await_replays(agent, plan, rp)
    t.join()
