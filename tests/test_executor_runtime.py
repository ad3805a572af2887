"""The multi-process runtime against the one-process reference (docs/design.md section 7).

Real worker processes, real gloo worlds, real SIGKILLs: every run must give the losses and
final parameter checksums of executor.compute.one_process.reference.train_reference on the same global
batches, within 1e-5, whatever failed on the way.
"""
import glob
import io
import multiprocessing
import os
import threading
import time
from functools import lru_cache

import pytest
import torch
import torch.distributed as dist
from rich.console import Console

from executor.runtime.worker_loop import WorkerLoop
from executor.runtime.worker_config import WorkerConfig
from executor.protocol import Done
from executor.runtime.transport.endpoints import connect_store
from executor.launch.faults.injector import parse_event, parse_stall
from executor.launch.launcher import train
from executor.inputs.launch_spec import Faults, LaunchSpec
from executor.launch.report.run_record import failed_by_iteration
from executor.compute.model import ModelConfig
from executor.compute.one_process.reference import compare, train_reference
from executor.runtime.transport.rendezvous import Mailbox, StorePlanSource, publish_plan
from planner.solvers.backends import solve
from planner.job import JobSpec

pytestmark = pytest.mark.hard_timeout(120)  # the launcher's deadline is 50 s
CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, micro_batch_size=2)
M = 2
TOL = 1e-5


@lru_cache(maxsize=None)
def reference(D, S, iterations):
    return train_reference(CFG, D, M, iterations, S)


def run(tmp_path, D, S, iterations, **fields):
    """Train a LaunchSpec of CFG on a DxSxM grid (`fields`: its other fields)."""
    out = io.StringIO()
    t0 = time.monotonic()
    fields.setdefault("timeout", 4.0)
    spec = LaunchSpec.build(CFG, JobSpec.uniform(D, S, M), iterations, deadline_s=50,
                            summary_path=str(tmp_path / "summary.json"), run_dir=str(tmp_path),
                            **fields)
    res = train(spec, console=Console(file=out, width=200))
    res.output, res.wall = out.getvalue(), time.monotonic() - t0
    return res


def logs(tmp_path):
    return "".join(open(f).read() for f in sorted(glob.glob(str(tmp_path / "worker-*.log"))))


def assert_exact(res, D, S, iterations, tmp_path):
    assert res.summary is not None, f"halted: {res.halted}\n{res.output}\n{logs(tmp_path)}"
    diffs = compare(res.summary, reference(D, S, iterations), TOL)
    assert not diffs, "\n".join(diffs) + "\n" + res.output


@pytest.mark.parametrize("D,S", [(2, 2), (3, 2)])
def test_no_failure_matches_reference(tmp_path, D, S):
    res = run(tmp_path, D, S, 3)
    assert_exact(res, D, S, 3, tmp_path)
    assert res.versions == 1  # v0, then the final (empty) plan
    assert os.path.exists(tmp_path / "summary.json")


def test_one_worker_sigkilled_mid_iteration(tmp_path):
    res = run(tmp_path, 2, 2, 3, faults=Faults(kills=[(0, 1, 1)]))
    assert_exact(res, 2, 2, 3, tmp_path)
    assert any("SIGKILL worker 0:1 mid-iteration 1" in e for e in res.events)
    assert any("worker 0:1 failed (process exited with code -9)" in e for e in res.events)


def test_fused_backward_synchronous_plans_with_a_kill(tmp_path):
    """`recycle train --no-split --sync`: plans of B actions, same exactness."""
    from planner.plan import Mode
    res = run(tmp_path, 2, 2, 3, faults=Faults(kills=[(1, 0, 1)]), mode=Mode(split_backward=False, staggered=False))
    assert_exact(res, 2, 2, 3, tmp_path)
    assert "fused B, synchronous optimizer) at iteration 1" in logs(tmp_path)


@pytest.mark.parametrize("kills", [[(0, 1, 1), (1, 1, 2)], [(0, 0, 1), (2, 1, 1)]],
                         ids=["same-stage", "different-stages"])
def test_two_workers_killed_3x2(tmp_path, kills):
    res = run(tmp_path, 3, 2, 3, faults=Faults(kills=kills))
    assert_exact(res, 3, 2, 3, tmp_path)
    assert sum("failed (process exited" in e for e in res.events) == 2


def test_kill_then_rejoin_loads_state_from_peer(tmp_path):
    res = run(tmp_path, 2, 2, 4, faults=Faults(kills=[(1, 0, 1)], rejoins=[(1, 0, 2)]))
    assert_exact(res, 2, 2, 4, tmp_path)
    assert any("worker 1:0 is back" in e for e in res.events)
    assert "loaded stage 0 state from worker (0, 0)" in logs(tmp_path)


def test_rejoin_keeps_the_worker_out_until_its_iteration(tmp_path):
    """--kill 0:1@2 --rejoin 0:1@5: the death is a failure plan at once, iterations 2..4
    train re-routed (0:1's micro-batches on 1:1), and the worker is back for 5 on, every
    time (it used to be restarted at once and re-routed 0 to 3 iterations by timing)."""
    res = run(tmp_path, 2, 2, 7, faults=Faults(kills=[(0, 1, 2)], rejoins=[(0, 1, 5)]),
              timeout=3.0)
    assert_exact(res, 2, 2, 7, tmp_path)
    failed = failed_by_iteration(res.summary.plans, 7)
    assert failed == [[]] * 2 + [[[0, 1]]] * 3 + [[]] * 2, res.summary.plans
    for p in res.summary.plans:  # whatever the speeds, 1:1 alone serves stage 1 then
        if p["failed"]:
            assert p["microbatches"]["1:1"] == 2 * M and "0:1" not in p["microbatches"]
    assert "loaded stage 1 state from worker (1, 1) at iteration 4" in logs(tmp_path)


def test_restart_brings_the_worker_back_as_soon_as_it_is_up(tmp_path):
    """--restart: the death is still a failure plan first; the new process starts at once
    and is admitted before the iteration named (which waits for it)."""
    res = run(tmp_path, 2, 2, 6, faults=Faults(kills=[(0, 1, 1)], restarts=[(0, 1, 4)]),
              timeout=3.0)
    assert_exact(res, 2, 2, 6, tmp_path)
    failed = failed_by_iteration(res.summary.plans, 6)
    assert failed[0] == [] and failed[4:] == [[], []], res.summary.plans  # back by 4
    assert [[0, 1]] in [p["failed"] for p in res.summary.plans]  # entered by every survivor
    assert any("restarting worker 0:1" in e for e in res.events), res.events


@pytest.mark.parametrize("seconds", [3.0, 7.0], ids=["one-timeout", "several-versions"])
def test_stalled_worker_comes_back_and_training_stays_exact(tmp_path, seconds):
    """SIGSTOP, later SIGCONT: nobody dies. Its peers time out and report it; the
    coordinator re-publishes after one comm timeout (the longer stall also outlives a
    re-published world that waits for it); the late worker catches up with the newest plan."""
    res = run(tmp_path, 2, 2, 4, faults=Faults(stalls=[(0, 1, 1, seconds)]), timeout=2.0)
    assert_exact(res, 2, 2, 4, tmp_path)
    assert any("SIGSTOP worker 0:1 mid-iteration 1" in e for e in res.events)
    assert any("SIGCONT worker 0:1" in e for e in res.events)
    assert any("no worker died: re-publishing" in e for e in res.events)
    assert not any("failed (" in e for e in res.events), res.events
    assert "plan v0: iteration 1 aborted" in logs(tmp_path)


def _config(job, timeout):
    from executor.inputs.worker_settings import WorkerSettings
    from executor.compute.config import TrainingSettings
    from executor.inputs.run_config import CommSection
    return WorkerSettings(CFG, TrainingSettings(), job, 1, "t", comm=CommSection(timeout=timeout),
                          local_workers=job.replicas * job.stages).to_json()


def test_world_rendezvous_follows_a_newer_plan(tmp_path):
    """Worker A waits for B in the world of v0; B only ever sees v1. A must notice v1 and
    leave while waiting (gloo's own rendezvous would hold it for the whole timeout, the
    pattern behind workers chasing each other through versions), and both meet in v1."""
    from executor.worker import child
    timeout = 15.0
    store = connect_store("127.0.0.1", 0, timeout_s=timeout, is_master=True)
    job = JobSpec.uniform(1, 2, M)
    store.set("config", _config(job, timeout))
    plan = solve(job, [])
    publish_plan(store, plan.model_copy(update={"version": 0}))
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["executor.worker"])
    addr = f"127.0.0.1:{store.port}"
    procs = [ctx.Process(target=child, args=(addr, 0, s, str(tmp_path / f"worker-0-{s}.log")))
             for s in (0, 1)]
    mailbox = Mailbox(store)
    try:
        procs[0].start()
        t0 = time.monotonic()
        while "started" not in logs(tmp_path) and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        time.sleep(1.0)  # A is waiting in the world of v0 now
        publish_plan(store, plan.model_copy(update={"version": 1}))
        t_new = time.monotonic()
        procs[1].start()
        done = set()
        while len(done) < 2 and time.monotonic() - t_new < 2 * timeout:
            for m in mailbox.drain():
                if isinstance(m, Done) and m.it == 0 and not m.sync:
                    done.add((m.s, m.v))
            mailbox.wait(0.05)
        took = time.monotonic() - t_new
        assert done == {(0, 1), (1, 1)}, logs(tmp_path)
        assert took < timeout / 2, f"{took:.1f} s to meet in v1\n{logs(tmp_path)}"
        publish_plan(store, plan.model_copy(update={"version": 2, "workers": []}))
        for p in procs:
            p.join(timeout)
        assert [p.exitcode for p in procs] == [0, 0], logs(tmp_path)
        assert "superseded" in open(tmp_path / "worker-0-0.log").read()
    finally:
        mailbox.close()
        for p in procs:
            if p.exitcode is None and p.pid is not None:
                p.kill()
                p.join()


def test_stale_and_foreign_plans_are_refused(capsys):
    """Fencing: a plan older than one already seen, or for another job, is never acted on."""
    store = connect_store("127.0.0.1", 0, timeout_s=5, is_master=True)
    job = JobSpec.uniform(2, 2, M)
    v1, v2 = (solve(job, []).model_copy(update={"version": v}) for v in (1, 2))
    source = StorePlanSource(store, (0, 0), 1)
    publish_plan(store, v2)
    agent = WorkerLoop(WorkerConfig(CFG, job, 3), (0, 0), source, store)
    got = agent.fence.next_plan(0.5)
    assert got.version == 2 and agent.fence.admit(got)
    agent.state.version = 2
    publish_plan(store, v1)  # a late, stale publication must not win
    assert source.wait_for_plan(2, 0.2) is None
    assert not agent.fence.admit(v1)
    other = solve(JobSpec.uniform(2, 2, M + 1), []).model_copy(update={"version": 3})
    assert not agent.fence.admit(other)
    out = capsys.readouterr().out
    assert "refusing plan v1: older than v2 already seen" in out
    assert "refusing plan v3: it is for job" in out
    del store
    assert not dist.is_initialized()


def test_gate_reads_plan_hold_and_commit_in_one_round_trip_and_sees_a_halt():
    """The per-iteration gate: one multi_get of counters that exist from the start (a
    missing key would make it wait for the store timeout), a newer plan fetched only when
    there is one, and a halt seen at the next iteration (it arms a hold)."""
    from executor.runtime.transport.rendezvous import set_counter
    from executor.sources.plan_source import TrainingHalted
    store = connect_store("127.0.0.1", 0, timeout_s=5, is_master=True)
    job = JobSpec.uniform(2, 2, M)
    source = StorePlanSource(store, (0, 0), 1)
    t0 = time.monotonic()
    assert source.gate(-1, 0) == (None, False, -1)
    assert time.monotonic() - t0 < 1.0
    publish_plan(store, solve(job, []).model_copy(update={"version": 0}))
    set_counter(store, "committed", 3)
    newer, held, committed = source.gate(-1, 3)
    assert newer.version == 0 and not held and committed == 2
    assert source.gate(0, 3) == (None, False, 2)
    set_counter(store, "hold", 5)  # hold iteration 4 and later
    assert source.gate(0, 3)[1] is False and source.gate(0, 4)[1] is True
    agent = WorkerLoop(WorkerConfig(CFG, job, 10), (0, 0), source, store)
    agent.state.version = 0
    store.set("halted", "every replica of stage 1 is gone")
    set_counter(store, "hold", 1)  # what Coordinator.halt does
    with pytest.raises(TrainingHalted, match="stage 1 is gone"):
        agent.fence.gate(1)
    del store


def test_parse_event():
    assert parse_event("1:0@2") == (1, 0, 2)
    with pytest.raises(ValueError):
        parse_event("1:0")
    assert parse_stall("0:1@2:3.5") == (0, 1, 2, 3.5)
    with pytest.raises(ValueError):
        parse_stall("0:1@2")


def test_mailbox_wakes_at_once_keeps_order_and_drops_a_replaced_process():
    """The coordinator's mailbox: a message wakes its wait at once (no polling), a
    worker's messages come in order, a process replaced by a newer one is not heard any
    more, and close() ends the reader blocked in the store."""
    store = connect_store("127.0.0.1", 0, timeout_s=5, is_master=True)
    mailbox = Mailbox(store)
    try:
        worker = connect_store("127.0.0.1", store.port, timeout_s=5)
        worker.add("inc/0:1", 1)
        first = StorePlanSource(worker, (0, 1), 1)
        t0 = time.monotonic()
        threading.Timer(0.2, lambda: first.send(Done(it=0))).start()
        mailbox.wait(10.0)
        assert 0.15 < time.monotonic() - t0 < 2.0
        first.send(Done(it=1))

        def drained(n):
            got, end = [], time.monotonic() + 5
            while len(got) < n and time.monotonic() < end:
                got += [(m.inc, m.it) for m in mailbox.drain()]
                mailbox.wait(0.05)
            return got
        assert drained(2) == [(1, 0), (1, 1)]
        mailbox.forget((0, 1))  # what the coordinator does when a worker's process dies
        worker.add("inc/0:1", 1)  # a second process of worker 0:1 starts
        second = StorePlanSource(connect_store("127.0.0.1", store.port, timeout_s=5), (0, 1), 2)
        first.send(Done(it=2))  # late, from the replaced process
        second.send(Done(it=3))
        assert drained(1) == [(2, 3)]
    finally:
        mailbox.close()  # a reader left blocked in the store would abort the process at exit
    assert not mailbox.reader.is_alive()
