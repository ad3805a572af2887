"""Entering a version, decided purely (executor/runtime/stage_state/entry_plan.py): the
same all-gathered rows give every member the same decision and its own steps, which
sync.py runs. Every case without a process."""
from hypothesis import given, settings, strategies as st

from executor.runtime.stage_state.entry_plan import (EntryKind, EntryOp, EntryStep,
                                                     plan_entry)

OPS = lambda d: [s.op for s in d.steps]  # noqa: E731


def test_every_stage_held_resumes_at_one_past_the_lowest_settled_holder():
    rows = {(0, 0): (5, False), (1, 0): (4, False), (0, 1): (5, False), (1, 1): (-1, True)}
    ahead = plan_entry(rows, (0, 0), 5, 2)
    assert ahead.kind is EntryKind.RESUME and ahead.iteration == 5 and ahead.top == 5
    assert ahead.steps == (EntryStep(EntryOp.ROLLBACK, 5), EntryStep(EntryOp.KEEP_BEFORE, 5))
    behind = plan_entry(rows, (1, 0), 4, 2)  # settled at 4 = r - 1: it settles, nothing back
    assert OPS(behind) == [EntryOp.SETTLE, EntryOp.KEEP_BEFORE]
    donor = plan_entry(rows, (0, 1), 5, 2)  # the lowest holder of stage 1 sends to 1:1
    assert donor.steps[-1] == EntryStep(EntryOp.SEND_STATE, peers=((1, 1),))
    assert donor.steps[0] == EntryStep(EntryOp.ROLLBACK, 5)
    taker = plan_entry(rows, (1, 1), -1, 2)
    assert taker.steps == (EntryStep(EntryOp.KEEP_BEFORE, 5),
                           EntryStep(EntryOp.RECV_STATE, peer=(0, 1)))


def test_a_step_it_cannot_settle_is_rolled_back_though_its_row_says_settled_before():
    rows = {(0, 0): (3, False), (0, 1): (3, False)}  # 0:0 stepped 4, stuck on a dead norm
    assert plan_entry(rows, (0, 0), 4, 2).steps[0] == EntryStep(EntryOp.ROLLBACK, 4)


def test_no_holder_at_all_restores_and_a_stage_without_one_is_lost():
    rows = {(0, 0): (-1, True), (0, 1): (-1, True)}
    d = plan_entry(rows, (0, 1), 7, 2)
    assert d.kind is EntryKind.RESTORE and d.steps == () and d.top == -1
    rows = {(0, 0): (6, False), (1, 0): (7, False), (0, 1): (-1, True), (1, 1): (-1, True),
            (0, 2): (7, False)}
    d = plan_entry(rows, (0, 2), 7, 3)
    assert d.kind is EntryKind.LOST and d.lost == (1,) and d.iteration == 7 and d.top == 7
    assert OPS(d) == [EntryOp.ROLLBACK, EntryOp.KEEP_BEFORE]  # a survivor resumes
    assert plan_entry(rows, (1, 1), -1, 3).steps == ()  # the lost stage's: replay decides


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.data())
def test_members_agree_and_each_held_stage_has_exactly_its_takers_served(D, S, data):
    workers = [(r, s) for r in range(D) for s in range(S)]
    rows = {w: (data.draw(st.integers(-1, 9)), data.draw(st.booleans())) for w in workers}
    ds = {w: plan_entry(rows, w, rows[w][0] + data.draw(st.integers(0, 1)), S) for w in workers}
    assert len({(d.kind, d.iteration, d.top, d.lost) for d in ds.values()}) == 1
    d0 = next(iter(ds.values()))
    if d0.kind is EntryKind.RESTORE:
        return
    sent = {t for d in ds.values() for s in d.steps if s.op is EntryOp.SEND_STATE
            for t in s.peers}
    got = {w for w, d in ds.items() if any(s.op is EntryOp.RECV_STATE for s in d.steps)}
    takers = {w for w in workers if rows[w][1] and w[1] not in d0.lost}
    assert sent == got == takers
    for w, d in ds.items():  # who receives gets it from a holder of its own stage
        for s in d.steps:
            if s.op is EntryOp.RECV_STATE:
                assert s.peer[1] == w[1] and not rows[s.peer][1]
