"""Two torchrun "nodes" on loopback sharing one rendezvous, SIGKILLed workers, exact.

`recycle train --external` hosts the coordinator; two `torchrun --nnodes 2 --node-rank i`
launches (static rendezvous on one master port) start `-m executor.torchrun`. Losses and
parameters must be the one-process reference's.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from executor.compute.model import ModelConfig
from executor.compute.one_process.reference import Summary, compare, train_reference

pytestmark = pytest.mark.hard_timeout(170)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, micro_batch_size=2)
D, S, M, ITERS = 2, 2, 2, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MODEL_FLAGS = ["--vocab", "32", "--seq-len", "8", "--d-model", "16", "--heads", "2",
               "--layers", "2", "--micro-batch-size", "2"]


def start_coordinator(tmp_path, env, procs, logs, args) -> str:
    """`recycle train --external ARGS` in its own session; its store's address."""
    clog = open(tmp_path / "coordinator.log", "w")
    logs.append(clog)
    coord = subprocess.Popen([sys.executable, "-m", "recycle.cli", "train", "--external",
                              "--store-port", "0", *args, *MODEL_FLAGS], cwd=ROOT, env=env,
                             stdout=clog, stderr=subprocess.STDOUT, start_new_session=True)
    procs.append(coord)
    t0 = time.monotonic()
    while coord.poll() is None and time.monotonic() - t0 < 60:
        found = re.search(r"RECYCLE_STORE=<this host>:(\d+)",
                          (tmp_path / "coordinator.log").read_text())
        if found:
            return f"127.0.0.1:{found[1]}"
        time.sleep(0.1)
    raise AssertionError((tmp_path / "coordinator.log").read_text())


def start_node(tmp_path, env, procs, logs, node: int, nodes: int, master_port: int,
               torchrun_args, worker_args=()) -> subprocess.Popen:
    log = open(tmp_path / f"node{node}.log", "w")
    logs.append(log)
    p = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes),
         "--node-rank", str(node), "--master-addr", "127.0.0.1",
         "--master-port", str(master_port), "--monitor-interval", "0.2", *torchrun_args,
         "-m", "executor.torchrun", *worker_args],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    procs.append(p)
    return p


def wait_until(check, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while not check() and time.monotonic() < end:
        time.sleep(0.1)
    return check()


def stop(procs, logs) -> None:
    """SIGKILL every process group still running (workers are in their agent's group)."""
    for p in procs:
        if p.poll() is None:  # (a reaped leader's pid may be another's group by now)
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    for f in logs:
        f.close()


def test_two_torchrun_nodes_on_loopback_survive_a_sigkill_exactly(tmp_path):
    """Node i holds replica i (`--nproc-per-node S`, the default `--placement stages`).
    `--kill 1:1@1` SIGKILLs worker 1:1 mid-iteration 1; node 1's elastic agent stops its
    other worker and restarts both (incarnation 2), they load their stages' state from
    node 0's workers and rejoin."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    summary = tmp_path / "summary.json"
    procs, logs = [], []
    try:
        env["RECYCLE_STORE"] = start_coordinator(tmp_path, env, procs, logs, [
            "-d", str(D), "-s", str(S), "-m", str(M), "--iterations", str(ITERS),
            "--kill", "1:1@1", "--timeout", "4",
            # torchrun restarts node 1 (it stops 1:0 too): training waits before
            # iteration 3 until both are back
            "--rejoin", "1:1@3", "--rejoin", "1:0@3",
            "--summary", str(summary), "--run-dir", str(tmp_path / "run")])
        master_port = free_port()
        for node in range(2):
            start_node(tmp_path, env, procs, logs, node, 2, master_port,
                       ["--nproc-per-node", str(S), "--max-restarts", "1"])
        rc = procs[0].wait(timeout=140)
        for p in procs[1:]:
            p.wait(timeout=20)
        out = (tmp_path / "coordinator.log").read_text()
        nodes = "".join((tmp_path / f"node{i}.log").read_text() for i in range(2))
        assert rc == 0, out + nodes
        assert [p.returncode for p in procs[1:]] == [0, 0], nodes
        assert "SIGKILL worker 1:1 mid-iteration 1" in out
        # the death is a failure event at once (it used to show only as a new incarnation
        # asking in, the survivors waiting ~4 s for torchrun's restart): iteration 1 re-runs
        # re-routed, and the kill has a recovery time
        assert "worker 1:1 failed (SIGKILLed by the coordinator)" in out, out
        got = Summary.load(str(summary))
        rerouted = [p for p in got.plans if [1, 1] in p["failed"]]
        assert rerouted and rerouted[0]["first_iteration"] == 1, got.plans
        assert "kill" in [r["kind"] for r in got.recovery], got.recovery
        assert "worker 1:1 is back (incarnation 2)" in out, out
        assert "worker 1:0 is back (incarnation 2)" in out, out  # stopped by its agent
        node0 = (tmp_path / "node0.log").read_text()
        assert "restart 1" in nodes and "restart 1" not in node0, nodes  # torchrun's counter:
        # node 1 restarted once; node 0 never (its workers also exit cleanly at the end)
        last = tmp_path / "run" / "checkpoints" / f"iter{ITERS - 1:06d}"
        assert (last / "recycle.json").exists() and (last / "stage1" / ".metadata").exists()
        diffs = compare(got, train_reference(CFG, D, M, ITERS, S), 1e-5)
        assert not diffs, "\n".join(diffs) + out
    finally:
        stop(procs, logs)


def children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as fh:
                if d.isdigit() and int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
        except (OSError, ValueError):
            pass
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.hard_timeout(120)
def test_workers_die_with_a_sigkilled_torchrun_agent(tmp_path):
    # A SIGKILLed agent runs no cleanup: its workers used to train on to the end.
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs, logs = [], []
    try:
        clog = open(tmp_path / "coordinator.log", "w")
        logs.append(clog)
        procs.append(subprocess.Popen(  # long enough to outlive the test
            [sys.executable, "-m", "recycle.cli", "train", "--external", "--store-port", "0",
             "-d", "1", "-s", "2", "-m", "2", "--iterations", "100000", "--timeout", "4",
             "--checkpoint-every", "100000", "--run-dir", str(tmp_path / "run"),
             "--vocab", "32", "--seq-len", "8", "--d-model", "16", "--heads", "2",
             "--layers", "2", "--micro-batch-size", "2"],
            cwd=ROOT, env=env, stdout=clog, stderr=subprocess.STDOUT, start_new_session=True))
        text, t0 = "", time.monotonic()
        while "RECYCLE_STORE" not in text and time.monotonic() - t0 < 60:
            time.sleep(0.1)
            text = (tmp_path / "coordinator.log").read_text()
        port = re.search(r"RECYCLE_STORE=<this host>:(\d+)", text)
        assert port, text
        env["RECYCLE_STORE"] = f"127.0.0.1:{port[1]}"
        log = open(tmp_path / "node.log", "w")
        logs.append(log)
        agent = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
             "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
             "--master-port", str(free_port()), "--max-restarts", "0", "-m", "executor.torchrun"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(agent)
        while "iter    0" not in text and time.monotonic() - t0 < 90:  # workers training
            time.sleep(0.1)
            text = (tmp_path / "coordinator.log").read_text()
        assert "iter    0" in text, text + (tmp_path / "node.log").read_text()
        workers = children(agent.pid)
        assert len(workers) == 2, workers
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        end = time.monotonic() + 5.0
        while any(alive(w) for w in workers) and time.monotonic() < end:
            time.sleep(0.05)
        assert not any(alive(w) for w in workers), "workers outlived their torchrun agent"
    finally:
        for p in procs:  # the whole session: orphaned workers are in their agent's group
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
        for f in logs:
            f.close()


# losing the master node too is the same path with the store elsewhere: slow tier
@pytest.mark.parametrize("lost", [1, pytest.param(0, marks=pytest.mark.slow)],
                         ids=["stage1-node", "stage0-master-node"])
def test_a_lost_torchrun_node_holding_a_whole_stage_is_replayed_from_peer_memory(tmp_path, lost):
    """2x2 with one node per stage (`-m executor.torchrun --placement replicas`, so RANK =
    stage*D + replica: node 0 holds 0:0 and 1:0, node 1 holds 0:1 and 1:1), snapshots
    every 2 iterations. Once stage L's snapshot has reached its holder (`snap/done/L` in
    the run's store), the test SIGKILLs a worker of node L, as a crash; the node's agent,
    with `--max-restarts 0`, stops the other (SIGTERM) and gives up: stage L is lost
    whole, as when its machine goes, and never comes back, while the other stage's
    workers live. One of them moves to stage L, loads its snapshot and replays the
    iterations since from the other stage's boundary logs (that stage keeps its work:
    no rollback), and the run ends with exit 0, exact. Node 0 is
    also torchrun's master (it hosts the rendezvous store): ReCycle's workers do not need
    it.

    Why not `--kill 0:L@3`: the whole stage dies at once, so the kill must not come before
    a snapshot of the stage is complete at its holder; at iteration 3, on a loaded machine,
    the first snapshot was still on its way once in 20 runs and the run halted (exit 3,
    "no iteration has a copy of every stage": right, as no copy was complete).
    The node = replica layout (`--placement stages`) cannot lose a stage and keep the
    other: an agent would stop the surviving stage's worker with its dead neighbour.

    Exit codes: the coordinator 0 (the run finished); the lost node's torchrun 1 (a worker
    failed and no restart was left: torchrun raises ChildFailedError). The other node's
    workers exit 0 and its agent enters torchrun's exit barrier, which waits for every
    agent. Lost the master (L = 0), the barrier's store is gone: the survivor exits 0 at
    once. Lost node 1, the barrier waits for node 1's agent, which will not come, for
    torchrun's own 300 s (not settable from its command line) before exiting 0: the test
    sees the barrier's log line with node 0's workers gone, and stops that agent."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from executor.runtime.peer_snapshots import DONE_KEY

    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               LOGLEVEL="INFO")  # torchrun's agents say when they wait in the exit barrier
    # enough iterations that the kill lands long before the end
    summary, iters, kept = tmp_path / "summary.json", 40, 1 - lost
    procs, logs = [], []
    try:
        env["RECYCLE_STORE"] = start_coordinator(tmp_path, env, procs, logs, [
            "-d", str(D), "-s", str(S), "-m", str(M), "--iterations", str(iters),
            "--timeout", "4", "--snapshot-every", "2",
            "--summary", str(summary), "--run-dir", str(tmp_path / "run")])
        master_port = free_port()
        nodes = [start_node(tmp_path, env, procs, logs, i, 2, master_port,
                            ["--nproc-per-node", str(D), "--max-restarts", "0"],
                            ["--placement", "replicas"]) for i in range(2)]
        host, port = env["RECYCLE_STORE"].rsplit(":", 1)
        store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))
        done = DONE_KEY.format(lost)
        assert wait_until(lambda: store.check([done]), 120), \
            (tmp_path / "coordinator.log").read_text()
        snapshot_at = int(store.get(done))
        victims = children(nodes[lost].pid)
        assert len(victims) == D, victims
        os.kill(victims[0], signal.SIGKILL)
        rc = procs[0].wait(timeout=140)
        out = (tmp_path / "coordinator.log").read_text()
        node_log = [tmp_path / f"node{i}.log" for i in range(2)]
        both = "".join(p.read_text() for p in node_log)
        assert rc == 0, out + both
        assert nodes[lost].wait(timeout=20) == 1, both
        assert "ChildFailedError" in node_log[lost].read_text(), both
        if lost == 0:
            assert nodes[kept].wait(timeout=30) == 0, both
        else:
            assert wait_until(lambda: "Waiting 300 seconds for other agents"
                              in node_log[kept].read_text(), 20), both
            assert nodes[kept].poll() is None and not children(nodes[kept].pid), both
        kept_log = node_log[kept].read_text()
        for r in range(D):  # --placement replicas: node s holds stage s of every replica
            assert f"[worker {r}:{kept}] started" in kept_log, kept_log
        # one worker trained on in stage `kept`, the other moved to stage `lost`
        assert re.search(rf"\[worker \d:{kept}\] training complete", kept_log), kept_log
        assert re.search(rf"\[worker \d:{kept} in \d:{lost}\] training complete",
                         kept_log), kept_log
        assert f"worker 0:{lost} failed" in out and f"worker 1:{lost} failed" in out, out
        assert f"moves from stage {kept} to stage {lost} (no live holder: state from" in out, out
        # replayed from the snapshot complete at the kill, or a newer one completed after it
        back = re.search(rf"replayed stage {lost} iterations \d+\.\.\d+ from the boundary "
                         r"logs .* state of iteration (\d+) from", kept_log)
        assert back and int(back[1]) >= snapshot_at and int(back[1]) % 2 == 1, kept_log
        assert "rolled back to iteration" not in kept_log, kept_log
        got = Summary.load(str(summary))
        el = got.elastic
        assert (el["moves"], el["joins"], el["snapshot_restores"]) == (1, 0, 1), got.plans
        assert el["replays"] == 1 and el["retrained_iterations"] <= 1, el
        last = got.plans[-1]  # never rejoined: the mover's slot and the dead one's stay out
        assert len(last["microbatches"]) == 2 and last["moves"][0]["source"] == "snapshot"
        diffs = compare(got, train_reference(CFG, D, M, iters, S), 1e-5)
        assert not diffs, "\n".join(diffs) + out
    finally:
        stop(procs, logs)


def test_placement_maps_torchruns_ranks_and_every_node_must_agree():
    from datetime import timedelta

    from torch.distributed import TCPStore

    from executor.torchrun import rank_slot, slot_of_rank
    from planner.job import JobSpec

    D3, S2 = 3, 2  # node k of `--nproc-per-node K` runs ranks k*K .. k*K+K-1
    assert [rank_slot(r, D3, S2, "stages") for r in range(6)] == \
        [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]  # whole replicas per node
    assert [rank_slot(r, D3, S2, "replicas") for r in range(6)] == \
        [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]  # whole stages per node
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    job = JobSpec.uniform(D3, S2, 2)
    assert slot_of_rank(4, "replicas")(job, store) == (1, 1)
    assert slot_of_rank(5, "replicas")(job, store) == (2, 1)  # the same placement: fine
    with pytest.raises(SystemExit, match="--placement stages, but another node started "
                                         "with --placement replicas"):
        slot_of_rank(0, "stages")(job, store)  # would be worker 0:0 twice


def test_a_lost_torchrun_node_leaves_one_worker_that_trains_the_whole_model_exact(tmp_path):
    """1x2, one node per stage; node 0 (torchrun's master, stage 0) is lost for good once
    stage 0's snapshot has reached its holder (the worker of node 1). One live worker is
    left for two stages: the coordinator cuts the model into one stage (--shape auto, the
    default), and the survivor takes stage 0's units from the snapshot it holds and trains
    the whole model alone to the end, exact. (Before: a pause for a restart that never
    came, then a halt.)"""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from executor.runtime.peer_snapshots import DONE_KEY

    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    summary, iters, d = tmp_path / "summary.json", 30, 1
    procs, logs = [], []
    try:
        env["RECYCLE_STORE"] = start_coordinator(tmp_path, env, procs, logs, [
            "-d", str(d), "-s", str(S), "-m", str(M), "--iterations", str(iters),
            "--timeout", "4", "--snapshot-every", "2",
            "--summary", str(summary), "--run-dir", str(tmp_path / "run")])
        master_port = free_port()
        nodes = [start_node(tmp_path, env, procs, logs, i, 2, master_port,
                            ["--nproc-per-node", "1", "--max-restarts", "0"],
                            ["--placement", "replicas"]) for i in range(2)]
        host, port = env["RECYCLE_STORE"].rsplit(":", 1)
        store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))
        assert wait_until(lambda: store.check([DONE_KEY.format(0)]), 120), \
            (tmp_path / "coordinator.log").read_text()
        victims = children(nodes[0].pid)
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        rc = procs[0].wait(timeout=140)
        out = (tmp_path / "coordinator.log").read_text()
        both = "".join((tmp_path / f"node{i}.log").read_text() for i in range(2))
        assert rc == 0, out + both
        assert "the pipeline changes shape to 1 stages" in out, out
        assert nodes[1].wait(timeout=30) == 0, both
        got = Summary.load(str(summary))
        assert got.elastic["pauses"] == 0 and got.plans[-1]["partition"]["grid"][1] == 1, got.plans
        diffs = compare(got, train_reference(CFG, d, M, iters, S), 1e-5)
        assert not diffs, "\n".join(diffs) + out
    finally:
        stop(procs, logs)
