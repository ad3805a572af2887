"""Peer-memory snapshots (executor/runtime/peer_snapshots/): real processes, real sockets.

A real 2x2 run with --snapshot-every 2 leaves each stage's snapshots on the holder the
plan names, equal to the one-process reference's state (parameters and optimizer state)
after those iterations, the newest bit for bit what its writer reported. Across two
processes: a snapshot arrives whole (every tensor, dtype and container as offered); a
holder SIGKILLed in the middle of a fetch, or one that hangs, is an error within the
fetch's timeout, never a hang; a dead holder never takes the sender down.
"""
import copy
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from executor.compute.config import TrainingSettings
from executor.compute.model import DEFAULT_WORKLOAD, ModelConfig
from executor.compute.one_process.reference import checksum, train_reference
from executor.inputs.launch_spec import sections
from executor.inputs.worker_settings import WorkerSettings
from executor.runtime.transport.endpoints import connect_store
from executor.runtime.peer_snapshots import (PeerSnapshots, SnapshotError, common_iteration,
                                             fetch, held_by, inventory, where_held)
from executor.protocol import Done
from executor.runtime.transport.rendezvous import Mailbox, publish_plan
from planner.control.snapshot_holders import plan_holders
from planner.job import JobSpec
from planner.solvers.backends import solve

pytestmark = pytest.mark.hard_timeout(120)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, micro_batch_size=2)
M, ITERS, K = 2, 6, 2
TOL = 1e-5


def _close(a, b, where=""):
    """Same tree (containers, keys, scalars exactly; tensors within TOL, same dtype)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert float((a.double() - b.double()).abs().max()) <= TOL if a.numel() else True, where
        return
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), (where, a, b)
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _close(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{k}]")
    else:
        assert a == b, (where, a, b)


def _logs(tmp_path):
    return "".join(open(tmp_path / f).read() for f in sorted(os.listdir(tmp_path))
                   if f.startswith("worker-"))


@pytest.mark.parametrize("clip", [0.0, 1.1])  # 1.1 clips iterations 3 and 5 (norms 1.21, 1.36)
def test_a_real_2x2_run_leaves_reference_exact_snapshots_on_the_planned_holders(tmp_path, clip):
    """With a clip the late stage steps optimistically and may redo its step when the
    global norm is in: the snapshot must be of the final step (the agent settles first)."""
    from executor.worker import child
    training = TrainingSettings(clip=clip)
    timeout = 10.0
    store = connect_store("127.0.0.1", 0, timeout_s=timeout, is_master=True)
    job = JobSpec.uniform(2, 2, M)
    store.set("config", WorkerSettings(CFG, training, job, ITERS, "t", local_workers=4,
                                       **sections(timeout=timeout, snapshot_every=K)).to_json())
    plan = solve(job, []).model_copy(update={"version": 0})
    publish_plan(store, plan)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["executor.worker"])
    addr = f"127.0.0.1:{store.port}"
    procs = {(r, s): ctx.Process(target=child, args=(addr, r, s, str(tmp_path / f"worker-{r}-{s}.log")))
             for r in range(2) for s in range(2)}
    mailbox = Mailbox(store)
    try:
        for p in procs.values():
            p.start()
        final, t0 = {}, time.monotonic()
        while len(final) < 4 and time.monotonic() - t0 < 60:
            for m in mailbox.drain():
                if isinstance(m, Done) and m.it == ITERS - 1 and not m.sync:
                    final[m.worker] = m.checksum
            mailbox.wait(0.05)
        assert len(final) == 4, _logs(tmp_path)
        # every worker now waits for the next plan: its host is up, its snapshots held
        holders = plan_holders(plan)
        assert holders == {0: "0.1", 1: "1.0"}  # a worker of the other stage, spread
        want = [i for i in range(ITERS) if (i + 1) % K == 0][-2:]  # the newest two: 3, 5
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            inv = inventory(store, [f"{r}.{s}" for r, s in procs])
            if all(inv[holders[s]].get(s) == want for s in (0, 1)):
                break
            time.sleep(0.05)
        assert all(inv[holders[s]].get(s) == want for s in (0, 1)), inv
        assert {w: h for w, h in inv.items() if h} == {holders[0]: {0: want}, holders[1]: {1: want}}
        assert where_held(inv) == {s: {i: [holders[s]] for i in want} for s in (0, 1)}
        assert common_iteration({s: want for s in (0, 1)}, 2) == want[-1]
        # the reference's whole state (parameters and optimizer) after those iterations
        ref: dict = {}

        def keep(it, modules, opts):
            if it in want:
                ref[it] = [copy.deepcopy({"names": [n for n, _ in m.named_parameters()],
                                          "model": m.state_dict(), "optim": o.state_dict()})
                           for m, o in zip(modules, opts)]
        train_reference(CFG, 2, M, ITERS, 2, training=training, after_step=keep)
        for s in (0, 1):
            for it in want:
                got_it, state = fetch(store, holders[s], s, it, timeout_s=5)
                assert got_it == it
                _close(state, ref[it][s], f"stage {s} iteration {it}")
            # the newest is what the stage's workers held at the end, bit for bit
            module = DEFAULT_WORKLOAD.build_stage(CFG, s, 2)
            module.load_state_dict(state["model"])
            assert checksum(module) == final[(0, s)] == final[(1, s)]
        with pytest.raises(SnapshotError, match="no snapshot of stage 0 at iteration 1"):
            fetch(store, holders[0], 0, 1, timeout_s=5)  # only the newest two are kept
        publish_plan(store, plan.model_copy(update={"version": 1, "workers": []}))
        for p in procs.values():
            p.join(timeout)
        assert [p.exitcode for p in procs.values()] == [0] * 4, _logs(tmp_path)
        logs = _logs(tmp_path)
        assert logs.count("snapshots: every=2 offers=3 ") == 4, logs  # every worker kept its copies
        assert "failed=1" not in logs and "Error" not in logs, logs
    finally:
        mailbox.close()
        for p in procs.values():
            if p.exitcode is None and p.pid is not None:
                p.kill()
                p.join()


# ---- across processes ----------------------------------------------------------------------
HOLDER = """
import sys, time
from executor.runtime.transport.endpoints import connect_store
from executor.runtime.peer_snapshots import PeerSnapshots
store = connect_store("127.0.0.1", int(sys.argv[1]), timeout_s=10)
snaps = PeerSnapshots(store, sys.argv[2], 1, 2, timeout_s=10)
print("up", flush=True)
time.sleep(120)
"""


def _holder(port: int, name: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(port), name], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "up"
    return p


def _state(seed: int, mb: int):
    g = torch.Generator().manual_seed(seed)
    n = mb * (1 << 18)  # float32: mb MB
    return {"model": {"w": torch.randn(n, generator=g), "b": torch.arange(7, dtype=torch.int64),
                      "h": torch.randn(3, 5, generator=g).to(torch.bfloat16)},
            "optim": {"state": {0: {"step": torch.tensor(4.0), "exp_avg": torch.randn(2, 3, generator=g)},
                                1: {}},
                      "param_groups": [{"lr": 0.1 * seed, "betas": (0.9, 0.999), "eps": 1e-8,
                                        "params": [0, 1], "foreach": None, "name": "x"}]}}


def _wait_held(store, holder, stage, it, limit=20.0):
    """Until `holder`'s newest snapshot of `stage` is of iteration `it`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if held_by(store, holder).get(stage, [None])[-1] == it:
            return
        time.sleep(0.02)
    raise AssertionError(f"{holder} never held stage {stage} iteration {it} as its newest")


def test_snapshots_cross_processes_whole_and_a_killed_or_hung_holder_is_an_error_in_time():
    store = connect_store("127.0.0.1", 0, timeout_s=10, is_master=True)
    holder, spare = _holder(store.port, "h"), _holder(store.port, "spare")
    logged = []
    me = PeerSnapshots(store, "me", 1, 2, timeout_s=3, log=logged.append)
    me._holders = (0, {0: "h", 1: "spare"})
    try:
        # whole: every tensor bit for bit, dtypes, int keys, tuples, None and strings
        state = _state(1, 48)
        me.offer(0, 0, state)
        _wait_held(store, "h", 0, 0)
        it, got = fetch(store, "h", 0, timeout_s=10)
        assert it == 0 and _same(got, state)
        assert me.local.iterations() == [0] and _same(me.local.state(0), state)
        # latest wins, the holder keeps the newest two, each complete
        for i in (1, 2, 3):
            me.offer(0, i, _state(10 + i, 2))
        _wait_held(store, "h", 0, 3)
        assert held_by(store, "h")[0][-1] == 3 and len(held_by(store, "h")[0]) == 2
        assert _same(fetch(store, "h", 0, 3, timeout_s=10)[1], _state(13, 2))
        # a put below the newest held iteration: the job rolled back, newer ones go
        me.offer(0, 2, _state(22, 2))
        _wait_held(store, "h", 0, 2)
        assert held_by(store, "h")[0][-1] == 2 and 3 not in held_by(store, "h")[0]
        assert _same(fetch(store, "h", 0, 2, timeout_s=10)[1], _state(22, 2))
        # a holder SIGKILLed in the middle of a fetch: 'closed', long before the timeout
        me.offer(0, 3, _state(3, 64))
        _wait_held(store, "h", 0, 3)

        def kill_at_first_piece(got_bytes, total):
            if holder.poll() is None:
                assert got_bytes < total
                os.kill(holder.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(SnapshotError, match=r"closed after \d+ of \d+ bytes|reset"):
            fetch(store, "h", 0, timeout_s=30, progress=kill_at_first_piece)
        assert time.monotonic() - t0 < 10
        holder.wait(10)
        # a dead holder: refused at once; the sender logs its failure and carries on
        with pytest.raises(SnapshotError, match="refused"):
            fetch(store, "h", 0, timeout_s=5)
        assert inventory(store, ["h", "spare"], timeout_s=2) == {"h": None, "spare": {}}
        me.offer(0, 4, _state(4, 1))
        t0 = time.monotonic()
        while me.failed == 0 and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        assert me.failed == 1 and any("to worker h failed" in m for m in logged), logged
        me.offer(1, 4, _state(5, 1))  # the sender thread is still alive: this one arrives
        _wait_held(store, "spare", 1, 4)
        # a hung holder (SIGSTOP): no answer within the timeout
        os.kill(spare.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(SnapshotError, match="no data for 1 s|no answer within 1 s"):
            fetch(store, "spare", 1, timeout_s=1)
        assert time.monotonic() - t0 < 3
    finally:
        for p in (holder, spare):
            if p.poll() is None:
                p.kill()
                p.wait()
        me.close()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# ---- the flag ----------------------------------------------------------------------------
SMALL = ["--vocab", "32", "--seq-len", "8", "--d-model", "16", "--layers", "2",
         "--micro-batch-size", "2", "-d", "2", "-s", "2", "-m", "2"]


def test_train_flag_snapshots_every_iteration_and_refuses_a_negative_k(tmp_path):
    from typer.testing import CliRunner

    from recycle.cli import app
    r = CliRunner().invoke(app, ["train", *SMALL, "--iterations", "3", "--snapshot-every", "1",
                                 "--timeout", "4", "--run-dir", str(tmp_path)])
    logs = _logs(tmp_path)
    assert r.exit_code == 0, r.output + logs
    lines = [ln for ln in logs.splitlines() if "snapshots: every=1 offers=3 " in ln]
    assert len(lines) == 4, logs  # every worker kept a copy of iterations 0, 1, 2
    # each stage's writer sent them; at the end of the run a holder may exit before the
    # last ones arrive (failed), and one offered while another was on its way may have
    # been replaced by a newer one (dropped), so only the first is sure to arrive
    stats = [dict(f.split("=", 1) for f in ln.split("snapshots: ")[1].split()) for ln in lines]
    writers = [d for d in stats if d["sent"] != "0"]
    assert len(writers) == 2, lines
    assert all(sum(int(d[k]) for k in ("sent", "dropped", "failed")) >= 2 for d in writers), lines
    assert all(d["sent"] == d["dropped"] == d["failed"] == "0" for d in stats if d not in writers)
    assert 'snapshot_every = "1"' in (tmp_path / "run.toml").read_text()
    r = CliRunner().invoke(app, ["train", *SMALL, "--snapshot-every", "-1"])
    err = [ln for ln in (r.stderr or r.output).strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(err) == 1, r.output
    assert "--snapshot-every must be auto, off or a number of iterations (0: off), not '-1'" in err[0]


def test_a_copy_is_waited_for_by_two_threads_at_once():
    # the CUDA path: the sender and the training thread call ready() together; one read the
    # event, the other cleared it, and the first then called None.synchronize(). The race
    # is forced here: the second reader's next read of the event waits until it is cleared.
    import threading
    from executor.runtime.peer_snapshots.local import HostCopy

    checked, cleared = threading.Event(), threading.Event()
    reads: dict = {}

    class Event:
        def synchronize(self):
            pass

    class Racy(HostCopy):
        @property
        def event(self):
            name = threading.current_thread().name
            reads[name] = reads.get(name, 0) + 1
            if name == "second":
                if reads[name] == 1:
                    checked.set()
                else:
                    cleared.wait(2)
            return self._event

        @event.setter
        def event(self, value):
            self._event = value
            if value is None:
                cleared.set()

    copy = Racy(0, {}, [], Event())
    errors = []

    def ask():
        try:
            copy.ready()
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            errors.append(exc)
    second = threading.Thread(target=ask, name="second")
    second.start()
    checked.wait(2)
    ask()  # the first, in this thread: it clears the event
    second.join(5)
    assert errors == [] and copy.event is None
