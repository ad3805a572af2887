"""Two torchrun "nodes" on loopback sharing one rendezvous, a SIGKILLed worker, exact.

`recycle train --external` hosts the coordinator; two `torchrun --nnodes 2 --node-rank i`
launches (static rendezvous on one master port) start `-m executor.torchrun`, node i
holding replica i (`--nproc-per-node S`). `--kill 1:1@1` SIGKILLs worker 1:1 mid-iteration
1; node 1's elastic agent stops its other worker and restarts both (incarnation 2), they
load their stages' state from node 0's workers and rejoin. Losses and parameters must be
the one-process reference's.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from executor.compute.model import ModelConfig
from executor.compute.reference import Summary, compare, train_reference

pytestmark = pytest.mark.hard_timeout(170)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, micro_batch_size=2)
D, S, M, ITERS = 2, 2, 2, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_nodes_on_loopback_survive_a_sigkill_exactly(tmp_path):
    master_port = free_port()
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    summary = tmp_path / "summary.json"
    coord_cmd = [sys.executable, "-m", "recycle.cli", "train", "--external",
                 "--store-port", "0", "-d", str(D), "-s", str(S), "-m", str(M),
                 "--iterations", str(ITERS), "--kill", "1:1@1", "--timeout", "4",
                 # torchrun restarts node 1 (it stops 1:0 too): training waits before
                 # iteration 3 until both are back
                 "--rejoin", "1:1@3", "--rejoin", "1:0@3",
                 "--summary", str(summary), "--run-dir", str(tmp_path / "run"),
                 "--vocab", "32", "--seq-len", "8", "--d-model", "16", "--heads", "2",
                 "--layers", "2", "--micro-batch-size", "2"]
    procs, logs = [], []
    try:
        clog = open(tmp_path / "coordinator.log", "w")
        logs.append(clog)
        coord = subprocess.Popen(coord_cmd, cwd=ROOT, env=env, stdout=clog,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(coord)
        store_port, t0 = None, time.monotonic()  # the port the coordinator bound
        while store_port is None and coord.poll() is None and time.monotonic() - t0 < 60:
            found = re.search(r"RECYCLE_STORE=<this host>:(\d+)",
                              (tmp_path / "coordinator.log").read_text())
            if found:
                store_port = int(found[1])
            else:
                time.sleep(0.1)
        assert store_port, (tmp_path / "coordinator.log").read_text()
        env["RECYCLE_STORE"] = f"127.0.0.1:{store_port}"
        for node in range(2):
            log = open(tmp_path / f"node{node}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                 "--nproc-per-node", str(S), "--node-rank", str(node),
                 "--master-addr", "127.0.0.1", "--master-port", str(master_port),
                 "--max-restarts", "1", "--monitor-interval", "0.2", "-m", "executor.torchrun"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
        rc = coord.wait(timeout=140)
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
        got = Summary.load(str(summary))
        diffs = compare(got, train_reference(CFG, D, M, ITERS, S), 1e-5)
        assert not diffs, "\n".join(diffs) + out
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for f in logs:
            f.close()


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
