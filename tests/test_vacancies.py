"""Which dead workers' ids a new node's workers take (planner/control/vacancies.py): pure,
the service answers what it chooses (docs/api.md, "Node events")."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.control.vacancies import NoVacancy, node_workers, vacant_ids


def test_ids_whose_home_slot_is_empty_come_first_then_the_shortest_stage():
    # 3x3: 0.1 and 1.2 and 2.2 dead; slot (2, 2) is filled by another worker (roles)
    dead = [(0, 1), (1, 2), (2, 2)]
    empty = [(0, 1), (1, 2), (0, 2)]  # stage 2 has one live worker, stage 1 two
    assert vacant_ids(3, 3, dead, count=1, empty=empty) == ([(1, 2)], None)  # stage 2: 1 live
    assert vacant_ids(3, 3, dead, count=2, empty=empty) == ([(0, 1), (1, 2)], None)
    assert vacant_ids(3, 3, dead, count=3, empty=empty) == ([(0, 1), (1, 2), (2, 2)], None)


def test_ids_given_to_an_earlier_add_are_given_again_only_when_nothing_else_is_left():
    dead = [(0, 0), (0, 1), (1, 1)]
    first, _ = vacant_ids(2, 2, dead, count=1, empty=dead)
    granted = {w: 1 for w in first}
    second, _ = vacant_ids(2, 2, dead, count=2, empty=dead, granted=granted)
    assert not set(first) & set(second)
    # all given: the oldest grant goes first
    granted = {(0, 0): 5, (0, 1): 2, (1, 1): 9}
    assert vacant_ids(2, 2, dead, count=1, empty=dead, granted=granted) == ([(0, 1)], None)


def test_a_whole_vacant_node_for_a_node_agent():
    # 2x4 at 2 per node: node 0 = 0:0 0:1, node 1 = 0:2 0:3, node 2 = 1:0 1:1, node 3 = 1:2 1:3
    assert node_workers(2, 4, 3, 2) == [(1, 2), (1, 3)]
    dead = [(0, 1), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert vacant_ids(2, 4, dead, per_node=2) == ([(1, 0), (1, 1)], 2)
    assert vacant_ids(2, 4, dead, per_node=2, granted={(1, 0): 1}) == ([(1, 2), (1, 3)], 3)
    # the last node of a 3x3 grid at 2 per node holds one worker
    assert vacant_ids(3, 3, [(2, 2)], per_node=2) == ([(2, 2)], 4)
    with pytest.raises(NoVacancy, match="no node of 2 workers is vacant"):
        vacant_ids(3, 3, [(2, 2)], per_node=2, count=2)


@pytest.mark.parametrize("kw,msg", [
    ({"count": 3}, "3 new workers but 2 vacant ids in the 2x2 grid"),
    ({"count": 0}, "at least one"),
    ({"per_node": 2}, "no node of 2 workers is vacant in the 2x2 grid (2 dead workers)"),
])
def test_not_enough_vacant_ids_is_one_line(kw, msg):
    with pytest.raises(NoVacancy) as e:
        vacant_ids(2, 2, [(0, 1), (1, 0)], **kw)
    assert msg in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_ids_given_are_dead_distinct_and_as_many_as_asked(D, S, data):
    cells = [(r, s) for r in range(D) for s in range(S)]
    dead = data.draw(st.sets(st.sampled_from(cells)))
    granted = {w: data.draw(st.integers(1, 9)) for w in data.draw(st.sets(st.sampled_from(cells)))
               if w in dead}
    count = data.draw(st.integers(1, D * S))
    try:
        ids, node = vacant_ids(D, S, dead, count=count, granted=granted, empty=dead)
    except NoVacancy:
        assert count > len(dead)
        return
    assert node is None and len(ids) == count == len(set(ids)) and set(ids) <= dead
    fresh = dead - set(granted)
    assert set(ids) >= fresh or set(ids) <= fresh  # ungranted ids first
