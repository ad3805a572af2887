"""One wait (docs/design.md, "One wait"): every loop in executor/ that sleeps or blocks
waiting is in executor/runtime/transport/waiting.py, or is one of the named lives of
threads below. A new hand-written wait (a `while` with its own sleep and patience, as 14
of them were) fails here; use wait_until, first or retried."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

# (file, the loop's condition): thread lifetimes, each named in docs/design.md
THREAD_LIVES = {
    ("executor/runtime/worker_loop.py", "not self._stopped.is_set()"),  # its heartbeats
    ("executor/launch/launcher.py", "True"),  # the coordinator's tick
    ("executor/runtime/transport/rendezvous.py", "True"),  # the mailbox reader
    ("executor/runtime/peer_snapshots/sender.py", "True"),  # the snapshot sender
    ("executor/runtime/peer_snapshots/sender.py", "self._queue is None and (not self._closed)"),
    ("executor/sources/service_source.py", "not (self._stop.is_set() and (not self._report_slot))"),
    ("executor/sources/service_source.py", "not self._stop.is_set()"),  # the plan follower
    ("executor/node/agent.py", "not self.stopping.is_set()"),  # the node's long-poll
    ("executor/node/agent.py", "not self.stopping.wait(self.interval)"),  # its heartbeats
    ("executor/node/agent.py", "self._watch()"),  # its process watch
}
BLOCKING = {"sleep", "wait", "queue_pop"}


def _waiting_loops():
    for path in sorted((ROOT / "executor").rglob("*.py")):
        if path.name == "waiting.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.While):
                continue
            calls = {(c.func.attr if isinstance(c.func, ast.Attribute) else
                      getattr(c.func, "id", "")) for c in ast.walk(node)
                     if isinstance(c, ast.Call)}
            if calls & BLOCKING:
                yield str(path.relative_to(ROOT)), ast.unparse(node.test), node.lineno


def test_every_loop_that_waits_is_waiting_pys_or_a_named_thread_life():
    found = list(_waiting_loops())
    strays = [f"{f}:{line} while {test}" for f, test, line in found
              if (f, test) not in THREAD_LIVES]
    assert not strays, "hand-written waits (use waiting.py):\n" + "\n".join(strays)
    assert {(f, t) for f, t, _ in found} == THREAD_LIVES  # the list stays true


def test_retried_gives_up_after_its_patience_with_the_last_error_and_a_note():
    import time

    import pytest

    from executor.runtime.transport.waiting import retried
    calls = []

    def down():
        calls.append(time.monotonic())
        raise ConnectionError("refused")
    with pytest.raises(ConnectionError) as exc:
        retried(down, "the end of training", patience_s=0.3, retry_on=(ConnectionError,),
                first_s=0.05, max_s=0.1)
    assert 3 <= len(calls) <= 8 and calls[-1] - calls[0] < 0.45
    assert "the end of training: gave up after 0.3 s" in exc.value.__notes__
    answers = iter([ConnectionError("restarting"), ConnectionError("restarting"), "ok"])

    def back():
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a
    assert retried(back, "x", patience_s=5, retry_on=(ConnectionError,), first_s=0.01) == "ok"
    with pytest.raises(ValueError):  # not a retried error: raised at once
        retried(lambda: int("x"), "x", patience_s=5, retry_on=(ConnectionError,))


def test_a_wait_with_progress_lasts_while_it_moves_and_not_longer():
    import threading
    import time

    import pytest

    from executor.runtime.transport.waiting import DEADLINE, WaitEnded, first, wait_until
    count, done = [0], threading.Event()

    def work(steps):
        for _ in range(steps):
            time.sleep(0.05)
            count[0] += 1
    t = threading.Thread(target=lambda: (work(10), done.set()))
    t0 = time.monotonic()
    t.start()
    wait_until(done.is_set, "a long job", limit_s=0.15, progress=lambda: count[0])
    assert time.monotonic() - t0 > 0.4
    t.join()
    with pytest.raises(WaitEnded) as exc:  # moves no more: ends one limit after its last move
        wait_until(lambda: False, "a stuck job", limit_s=0.15, progress=lambda: count[0])
    assert exc.value.reason == DEADLINE
    assert first(lambda: None, "nothing", limit_s=0.05) is None
    assert first(iter([None, None, 7]).__next__, "the third", limit_s=1) == 7
