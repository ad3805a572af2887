"""A stage's state sent whole (World.send_blob/recv_blob: a restore's, a change of shape's,
a replay's) is waited for up to Timeouts.state_io, not the comm timeout: its sender first
gathers and serialises it. A receiver that gave up at the comm timeout failed the version,
and so every re-publication of it (found with a 2 s timeout and a profiler on the entry:
the run never got past its change of shape). Two gloo members in threads of this
process, real sockets."""
import threading
import time

import pytest
import torch

from executor.runtime.transport.comm import CommError, World
from executor.runtime.transport.endpoints import connect_store, host_store
from executor.timeouts import Timeouts

COMM_S = 1.0


def _members(sender_delay_s: float, state_s: float | None) -> dict:
    store = host_store("127.0.0.1", 0, 10)
    live = [(0, 0), (1, 0)]
    out: dict = {}

    def member(me):
        conn = connect_store("127.0.0.1", store.port, 10)
        w = World(conn, 0, me, live, COMM_S, state_timeout_s=state_s)
        try:
            if me == (0, 0):
                time.sleep(sender_delay_s)  # gathering and serialising the state
                w.send_blob({"w": torch.arange(4.0)}, (1, 0))
                out[me] = "sent"
            else:
                out[me] = w.recv_blob((0, 0))["w"].tolist()
        except CommError as exc:
            out[me] = f"CommError: {exc}"
        finally:
            w.close()

    threads = [threading.Thread(target=member, args=(me,), daemon=True) for me in live]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_a_state_blob_slower_than_the_comm_timeout_still_arrives():
    got = _members(sender_delay_s=2.5 * COMM_S, state_s=Timeouts(COMM_S).state_io)
    assert got == {(0, 0): "sent", (1, 0): [0.0, 1.0, 2.0, 3.0]}, got


def test_without_a_state_limit_the_comm_timeout_still_bounds_it():
    got = _members(sender_delay_s=2.5 * COMM_S, state_s=None)
    assert "Timed out" in str(got.get((1, 0))), got


def test_the_state_limit_is_at_least_the_comm_timeout():
    for comm in (0.5, 5.0, 60.0):
        assert Timeouts(comm).state_io >= comm
