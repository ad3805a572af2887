"""The --rejoin/--restart schedule (executor/launch/faults/rejoins.py), pure: which death consumes
which entry, which iteration is held, and which plan admits the returning process."""
from executor.launch.faults.rejoins import RejoinBook


def test_each_death_consumes_the_earliest_entry_and_holds_its_iteration():
    book = RejoinBook([(1, 0, 5), (1, 0, 9), (0, 1, 3, True)], external=False, limit=10.0)
    assert "when the run reaches iteration 5" in book.consume((1, 0), now=0.0, gone=1)
    assert book.hold() == 6  # workers wait before iteration 5
    assert "as soon as its failure is in a plan" in book.consume((0, 1), now=0.0, gone=1)
    assert book.hold() == 4
    assert book.consume((1, 1), now=0.0) is None  # no entry: nothing to hold for
    assert [w for w, _ in book.to_spawn(lambda w, r: r.asap)] == [(0, 1)]
    assert book.drop((0, 1)) and book.hold() == 6
    assert book.drop((1, 0)) and book.hold() == 0
    assert "iteration 9" in book.consume((1, 0), now=0.0, gone=2)  # the second death


def test_a_plan_made_before_the_death_was_known_does_not_admit_the_dead_process():
    # Service chaos (seed 11, run 2): 1:2 and 1:1 die in one iteration; the service's plan
    # for 1:2's failure still names 1:1's incarnation 1, and no process of 1:1 has started
    # since (the newest is 1). Taking that for 1:1's admission dropped its hold, the run
    # went on without it, and a kill of 0:1 left stage 1 empty: a halt.
    book = RejoinBook([(1, 1, 8)], external=False, limit=10.0)
    book.consume((1, 1), now=0.0, gone=1)
    assert not book.admits((1, 1), named=1, newest=1)
    assert book.hold() == 9
    assert not book.admits((1, 1), named=1, newest=2)  # its new process is up, not in yet
    assert book.admits((1, 1), named=2, newest=2)
    assert not book.admits((0, 0), named=2, newest=2)  # nothing awaited for it


def test_a_hold_is_given_up_when_its_process_is_not_admitted_in_time():
    book = RejoinBook([(0, 1, 4)], external=True, limit=5.0)  # torchrun restarts it
    assert "until worker 0:1 is back" in book.consume((0, 1), now=100.0, gone=1)
    assert book.expire(104.0) == [] and book.hold() == 5
    assert "not admitted within 5 s" in book.expire(106.0)[0] and book.hold() == 0
