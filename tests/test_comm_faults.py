"""A peer SIGKILLed while others are inside an all-reduce or a p2p transfer with it.

Real processes, real gloo worlds (executor/runtime/transport/comm.py World), real signals. The survivors
must get a CommError (never hang), leave the world, build the next version's world
without the dead peer and all-reduce correctly in it. Each case runs twice: with gloo's
blocking waits, and with the polled waits that NCCL uses (a dead NCCL peer can leave a
kernel waiting forever, so waits poll for completion, a deadline and a newer plan that
drops a member; the communicators are then aborted; here the plan source publishes that
plan half a second after the kill, as the coordinator does when it sees the exit). The
last case is the NCCL hazard
itself on CPU: a peer that hangs (SIGSTOP, no closed socket) while the plan source
already declared it failed: the polled wait must leave at once, not after the timeout.
"""
import contextlib
import json
import multiprocessing
import os
import signal
import time

import pytest
import torch

from executor.runtime.transport.comm import CommError, World
from executor.runtime.transport.endpoints import connect_store
from executor.runtime.transport.waiting import NEWER_PLAN
from planner.solvers.backends import solve
from planner.job import JobSpec

pytestmark = pytest.mark.hard_timeout(90)
TIMEOUT = 20.0  # far above what any case may take: leaving early is the point
BIG = 8 << 20  # floats: 32 MiB, more than the socket buffers hold, so a send blocks


def member(port, me, live, op, poll, victim, newer_plan):
    """One stage-0 worker of world v0 over `live` (victim = the one that gets killed)."""
    torch.set_num_threads(1)
    store = connect_store("127.0.0.1", port, TIMEOUT)

    def newer():  # the plan source: a plan without the victim, once the test publishes it
        if store.check(["newer"]):
            return newer_plan
        return None

    w = World(store, 0, me, live, TIMEOUT, newer=newer, poll_waits=poll,
              incarnations={x: 1 for x in live})
    if me == victim:
        store.set("victim/ready", str(os.getpid()))
        time.sleep(3600)  # never takes part: the test kills or stops it here
    store.set(f"posted/{me[0]}", "1")
    t0 = time.monotonic()
    err = None
    try:
        if op == "allreduce":
            w.allreduce_stage(torch.ones(4))
        elif op == "recv":
            w.recv((4,), victim, 0, 0, 0)
        else:  # send: far more than fits in flight, so the send waits for the victim
            w.send(torch.ones(BIG), victim, 0, 0, 0)
            w.flush()
    except CommError as exc:
        # a wait that left for the newer plan says so (waiting.py); other comm errors by type
        err = "newer plan" if getattr(exc, "reason", None) == NEWER_PLAN else type(exc).__name__
    took = time.monotonic() - t0
    w.close()
    # Survived: the next version's world, without the victim, works.
    w1 = World(store, 1, me, [(0, 0), (1, 0)], TIMEOUT, poll_waits=poll)
    total = w1.allreduce_stage(torch.full((4,), float(me[0] + 1)))
    w1.close()
    store.set(f"result/{me[0]}", json.dumps({"err": err, "took": took,
                                             "sum": total.tolist()}))


def run_case(op, poll, sig):
    store = connect_store("127.0.0.1", 0, TIMEOUT, is_master=True)
    victim = (2, 0)
    newer_plan = solve(JobSpec.uniform(3, 1, 2), [victim]).stamped(1, [[1], [1], [1]])
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["executor.runtime.transport.comm"])  # torch imported once, not per process
    me_list = [(0, 0), (1, 0), (2, 0)] if op == "allreduce" else [(0, 0), (2, 0)]
    procs = [ctx.Process(target=member, args=(store.port, me, me_list, op, poll, victim,
                                              newer_plan)) for me in me_list]
    if op != "allreduce":  # replica 1 has no part in a p2p case: it only meets in v1
        procs.append(ctx.Process(target=_bystander, args=(store.port, victim)))
    try:
        for p in procs:
            p.start()
        store.wait(["victim/ready"] + [f"posted/{r}" for r, _ in me_list if (r, 0) != victim])
        time.sleep(0.3)  # the survivors are inside the operation now
        pid = int(store.get("victim/ready"))
        t_kill = time.monotonic()
        os.kill(pid, sig)
        if poll:  # the plan source declares it failed (the coordinator sees a process exit
            time.sleep(0.5)  # within 20 ms; a SIGSTOPped one by its heartbeat)
            store.set("newer", "1")
        results = {}
        for r in (0, 1):
            store.wait([f"result/{r}"], timedelta_s(TIMEOUT))
            results[r] = json.loads(store.get(f"result/{r}"))
        elapsed = time.monotonic() - t_kill
        return results, elapsed
    finally:
        for p in procs:
            if p.is_alive():
                # a forkserver child is its server's to reap: it may be gone by now (a CI
                # run hit ProcessLookupError here with a member exiting after its result)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.join()


def _bystander(port, victim):
    torch.set_num_threads(1)
    store = connect_store("127.0.0.1", port, TIMEOUT)
    w1 = World(store, 1, (1, 0), [(0, 0), (1, 0)], TIMEOUT)
    total = w1.allreduce_stage(torch.full((4,), 2.0))
    w1.close()
    store.set("result/1", json.dumps({"err": "n/a", "took": 0.0, "sum": total.tolist()}))


def timedelta_s(s):
    from datetime import timedelta
    return timedelta(seconds=s)


@pytest.mark.parametrize("poll", [False, True], ids=["gloo-wait", "polled-wait"])
@pytest.mark.parametrize("op", ["allreduce", "recv", "send"])
def test_sigkill_during_an_operation_is_survived(op, poll):
    results, elapsed = run_case(op, poll, signal.SIGKILL)
    # gloo: the closed connection; polled (NCCL's way): that, or the plan without the victim
    errors = ("CommError", "newer plan") if poll else ("CommError",)
    assert results[0]["err"] in errors, results
    assert results[0]["took"] < TIMEOUT / 4, results  # not the timeout
    if op == "allreduce":
        assert results[1]["err"] in errors, results
    assert results[0]["sum"] == results[1]["sum"] == [3.0] * 4  # 1 + 2: v1 without the victim
    assert elapsed < TIMEOUT / 2


@pytest.mark.parametrize("op", ["allreduce", "recv"])
def test_hung_peer_declared_failed_is_left_at_once_by_a_polled_wait(op):
    results, elapsed = run_case(op, True, signal.SIGSTOP)
    assert results[0]["err"] == "newer plan", results
    assert results[0]["took"] < 0.3 + 0.5 + 2.0, results  # the newer plan, not the timeout
    assert results[0]["sum"] == results[1]["sum"] == [3.0] * 4


@pytest.mark.gpu
@pytest.mark.hard_timeout(240)
def test_cuda_training_with_a_kill_matches_the_reference(tmp_path):
    """On a GPU machine: the workers compute on CUDA (NCCL where each local worker has its
    own GPU, gloo with CPU copies where they share one), a SIGKILL mid-iteration, and the
    result still equals the CPU reference (CUDA kernels round differently: 1e-4)."""
    from executor.inputs.launch_spec import Faults
    from test_executor_runtime import CFG, M, logs, run
    from executor.compute.one_process.reference import compare, train_reference
    res = run(tmp_path, 2, 2, 3, faults=Faults(kills=[(1, 1, 1)]), device="cuda")
    assert res.summary is not None, f"{res.halted}\n{res.output}\n{logs(tmp_path)}"
    assert not compare(res.summary, train_reference(CFG, 2, M, 3, 2), 1e-4)
    assert "on cuda:" in logs(tmp_path) and "on cpu" not in logs(tmp_path)


def test_a_backends_error_is_told_in_words_without_its_cpp_source():
    from executor.runtime.transport.waiting import said
    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534]"
                        " Connection closed by peer [127.0.0.1]:41922\nmore")
    assert said(gloo) == "Connection closed by peer [127.0.0.1]:41922"
    assert said(RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                             "Timed out waiting 3000ms for recv operation to complete")) == \
        "Timed out waiting 3000ms for recv operation to complete"
    assert said(RuntimeError("x" * 500)) == "x" * 200 and said(RuntimeError()) == "RuntimeError"
    assert said(ValueError("[1, 2] is not a source")) == "[1, 2] is not a source"
