"""Entering a version, decided purely (executor/runtime/stage_state/entry_plan.py): the
same all-gathered rows give every member the same decision and its own steps, which
sync.py runs. Every case without a process."""
import pytest
from hypothesis import given, settings, strategies as st

from executor.runtime.stage_state.entry_plan import (EntryKind, EntryOp, EntryStep, Has,
                                                     ReshapeSource, ShapeMismatch, ShapeRow,
                                                     live_source, old_shape, plan_entry,
                                                     reshape_steps, restore_source)

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


# RESHAPE: a plan of another shape, decided from one gather of ShapeRows

def _row(stage, settled, fresh=False, shape=7, stages=2):
    return ShapeRow(shape, stages, stage, settled, fresh, (0, 2))


OLD = [{"a", "b"}, {"c", "d"}]  # two old stages' parameter names
NEW = [{"a"}, {"b", "c"}, {"d"}]  # three new ones


def test_a_reshape_from_live_holders_rolls_back_the_ahead_and_moves_pieces_by_name():
    rows = {(0, 0): _row(0, 5), (0, 1): _row(0, 4), (0, 2): _row(1, 5)}
    src = live_source(rows, 2)
    assert src == ReshapeSource(4, {0: (0, 0), 1: (0, 2)}, "live workers") and src.live
    def go(w, done):
        return reshape_steps(src, w, rows[w], done, -1, list(rows), OLD, NEW)
    tail = [EntryStep(EntryOp.BUILD_STAGE), EntryStep(EntryOp.LOAD_PIECES),
            EntryStep(EntryOp.RESTART_AFTER, 4), EntryStep(EntryOp.AGREE),
            EntryStep(EntryOp.TAKE_SHAPE, 4)]
    assert list(go((0, 0), 5)) == [EntryStep(EntryOp.ROLLBACK, 5),
                                   EntryStep(EntryOp.KEEP_PIECES, stage=0),
                                   EntryStep(EntryOp.SEND_PIECES, peer=(0, 1), stage=0)] + tail
    assert list(go((0, 1), 4)) == [EntryStep(EntryOp.SETTLE),
                                   EntryStep(EntryOp.RECV_PIECES, peer=(0, 0)),
                                   EntryStep(EntryOp.RECV_PIECES, peer=(0, 2))] + tail
    assert list(go((0, 2), 5))[:3] == [EntryStep(EntryOp.ROLLBACK, 5),
                                       EntryStep(EntryOp.SEND_PIECES, peer=(0, 1), stage=1),
                                       EntryStep(EntryOp.KEEP_PIECES, stage=1)]


def test_nothing_moves_by_name_when_no_member_holds_another_shape():
    assert old_shape({(0, 0): _row(0, -1, fresh=True)}, 9) is None
    assert old_shape({(0, 0): _row(0, 3), (0, 1): _row(1, 3)}, 7) is None  # already new
    assert old_shape({(0, 0): _row(0, 3), (0, 1): _row(1, 3)}, 9).stages == 2
    with pytest.raises(ShapeMismatch):
        old_shape({(0, 0): _row(0, 3), (0, 1): _row(1, 3, shape=8)}, 9)


def test_a_stage_lost_before_a_reshape_goes_back_to_a_copy_of_every_stage():
    rows = {(0, 0): _row(0, 6), (0, 1): _row(-1, -1, fresh=True), (0, 2): _row(0, 6)}
    assert live_source(rows, 2) is None  # old stage 1 has no live holder
    # a disk checkpoint every member reads: each builds its new stage from it by name
    members = {w: Has(0 if w != (0, 1) else -1, {0: (6,)}, -1, (4,)) for w in rows}
    src = restore_source(members, 2)
    assert src.iteration == 4 and src.providers is None and not src.live
    steps = reshape_steps(src, (0, 0), rows[(0, 0)], 6, -1, list(rows), OLD, NEW)
    assert [s.op for s in steps] == [EntryOp.BUILD_STAGE, EntryOp.LOAD_PARTS,
                                     EntryOp.RESTART_AFTER, EntryOp.AGREE,
                                     EntryOp.TAKE_SHAPE, EntryOp.TELL_ROLLBACK]
    assert EntryOp.TELL_ROLLBACK not in {s.op for s in reshape_steps(
        src, (0, 2), rows[(0, 2)], 6, -1, list(rows), OLD, NEW)}
    # snapshots of every old stage, newer than the disk: their holders provide them
    members[(0, 2)] = Has(0, {0: (6,), 1: (6,)}, -1, (4,))
    src = restore_source(members, 2)
    assert src == ReshapeSource(6, {0: (0, 0), 1: (0, 2)}, "peer-memory snapshots")
    assert restore_source({(0, 0): Has(0, {0: (6,)}), (0, 1): Has(-1, {})}, 2) is None


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.data())
def test_every_piece_received_is_sent_once_and_every_new_stage_gets_all_it_runs(So, Sn, data):
    layers = 6
    def cut(S):
        return [set(range(s * layers // S, (s + 1) * layers // S)) for s in range(S)]
    old, new = cut(So), cut(Sn)
    workers = [(r, s) for r in range(data.draw(st.integers(1, 2))) for s in range(Sn)]
    providers = {s: data.draw(st.sampled_from(workers)) for s in range(So)}
    src = ReshapeSource(3, providers, "live workers")
    steps = {w: reshape_steps(src, w, _row(0, 3, fresh=True), 3, -1, workers, old, new)
             for w in workers}
    sent = [(w, s.peer, s.stage) for w, ss in steps.items() for s in ss
            if s.op is EntryOp.SEND_PIECES]
    recv = [(s.peer, w) for w, ss in steps.items() for s in ss if s.op is EntryOp.RECV_PIECES]
    assert sorted((p, t) for p, t, _ in sent) == sorted(recv)
    for w, ss in steps.items():
        covered = set().union(*[old[s.stage] for s in ss if s.op is EntryOp.KEEP_PIECES],
                              *[old[stage] for p, t, stage in sent if t == w])
        assert new[w[1]] <= covered
