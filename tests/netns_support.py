"""The network-fault cases on test hosts (netns_lab.py): each starts a local run of a 2x2
grid with one worker a host, injects its fault, and returns what happened (`Outcome`):
tests/test_network_faults.py asserts on them, benchmarks/network_faults.py times them."""
from __future__ import annotations

import functools
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from netns_lab import ITER_LINE, Lab, LocalRun  # noqa: F401 (Lab: the cases' callers')

# ---- the cases (tests/test_network_faults.py asserts on them, benchmarks/network_faults.py
# times them) -----------------------------------------------------------------------------
D, S, M = 2, 2, 2
TIMEOUT = 3.0  # --timeout: every detection below is a few of these
TORCHRUN_TIMEOUT = 6.0  # through torchrun: its restarts must come back within the hold
FOUR_HOSTS = {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3}  # one worker a host


@dataclass
class Outcome:
    """What one case did: times are seconds after the fault was injected."""
    case: str
    fault: float  # time.monotonic() of the injection
    fault_wall: float
    run: "LocalRun"
    detect_s: Optional[float] = None  # the coordinator's event naming the fault
    detect_line: str = ""
    recover_s: Optional[float] = None  # every survivor has entered the plan routing around it
    back_s: Optional[float] = None  # the cut-off worker is back (a returning worker)
    diffs: list = field(default_factory=list)  # against the one-process reference
    result: object = None
    notes: list = field(default_factory=list)
    nodes: list = field(default_factory=list)  # torchrun: the node agents' exit codes

    @property
    def exact(self) -> bool:
        return self.result is not None and getattr(self.result, "summary", None) is not None \
            and not self.diffs

    @property
    def events(self) -> list:
        return self.run.coordinator.events


@functools.lru_cache(maxsize=None)
def reference(iterations: int):
    from executor.compute.one_process.reference import train_reference
    return train_reference(model_config(), D, M, iterations, S)


def model_config():
    from executor.compute.model import ModelConfig
    return ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2,
                       micro_batch_size=2)


def _spec(iterations: int, **extra) -> dict:
    from planner.job import JobSpec
    return dict(cfg=model_config(), job=JobSpec.uniform(D, S, M), iterations=iterations,
                **{"timeout": TIMEOUT, **extra})


def _finish(out: Outcome, iterations: int, timeout_s: float) -> Outcome:
    from executor.compute.one_process.reference import compare
    out.result = out.run.wait(timeout_s)
    if out.result.summary is not None:
        out.diffs = compare(out.result.summary, reference(iterations), 1e-5)
    out.recover_s = _recovered(out)
    return out


def _recovered(out: Outcome) -> Optional[float]:
    """Seconds from the fault until every worker of the first plan that trained after the
    detection had entered it (the run record's entries: each worker's entry, wall time)."""
    if out.detect_s is None or out.result is None or out.result.summary is None:
        return None
    entered: dict = {}
    for at, w, inc, v, first in out.run.coordinator.record.entries:
        entered.setdefault(v, {})[tuple(w)] = at
    detected_wall = out.fault_wall + out.detect_s
    for plan in out.result.summary.plans:
        v = plan["version"]
        members = {tuple(int(x) for x in k.split(":")) for k in plan["microbatches"]}
        times = entered.get(v, {})
        if members and members <= set(times) and min(times.values()) >= detected_wall - 0.5:
            return max(times[w] for w in members) - out.fault_wall
    return None


def _iteration_periods(run: "LocalRun") -> list[tuple[float, int]]:
    """(when the coordinator printed it, iteration) of every progress line."""
    out = []
    for t, line in run.out.lines:
        m = ITER_LINE.search(line)
        if m:
            out.append((t, int(m[1])))
    return out


def _start(lab: Lab, run_dir: str, placement: dict, iterations: int, **extra) -> "LocalRun":
    return LocalRun(lab, run_dir, placement, **_spec(iterations, deadline_s=170, **extra))


def _inject(run: "LocalRun", after: int, fault, case: str) -> Outcome:
    """Inject `fault` once iteration `after` (or a later one) is in."""
    run.wait_iteration(after, 90)
    fault()
    return Outcome(case, time.monotonic(), time.time(), run)


def _detected(out: Outcome, needle: str, timeout_s: float) -> None:
    t = out.run.wait_for(needle, timeout_s, out.fault)
    out.detect_s = t - out.fault
    out.detect_line = out.run.out.line_at(needle, out.fault)


def forge_stale(lab: Lab, run: "LocalRun", w, inc: int, version: int) -> None:
    """What a fenced process could still send, sent as it: a fatal error (the run would
    halt) and iteration 0's losses, all 99 (the losses would be wrong)."""
    from executor import protocol as P
    from executor.runtime.transport.endpoints import connect_store
    store = connect_store(lab.gateway, run.coordinator.store.port, timeout_s=10)
    for m in (P.Done(it=0, losses={g: 99.0 for g in range(D * M)}),
              P.Fatal(reason="a stale report of a fenced process")):
        m.r, m.s, m.inc, m.v = w[0], w[1], inc, version
        store.queue_push(P.MAILBOX, m.to_json())


def partition_case(lab: Lab, run_dir: str, iterations: int = 10) -> Outcome:
    """(a) + (b): worker 1:1's host drops every packet once iteration 0 is in; it is
    declared failed by its silent heartbeat, the test sends stale messages as it, the others
    train on; the partition heals once they trained under the new plan, the fenced process
    stops and `--restart 1:1@6` brings it back (incarnation 2) before iteration 6."""
    from executor.inputs.launch_spec import Faults
    run = _start(lab, run_dir, FOUR_HOSTS, iterations,
                 faults=Faults(restarts=[(1, 1, iterations - 4)]))
    try:
        out = _inject(run, 0, lambda: lab.partition(3), "partition")
        _detected(out, "worker 1:1 failed", 60)
        forge_stale(lab, run, (1, 1), 1, 0)
        run.wait_for("ignoring worker 1:1", 30, out.fault)
        run.wait_for("failed [(1, 1)]", 60, out.fault)  # trained on without it
        lab.heal(3)
        out.notes.append(f"healed {time.monotonic() - out.fault:.1f} s after the fault")
        out.back_s = run.wait_for("worker 1:1 is back (incarnation", 60, out.fault) - out.fault
        return _finish(out, iterations, 120)
    finally:
        run.close()


def cut_case(lab: Lab, run_dir: str, iterations: int = 10) -> Outcome:
    """(c): hosts of 0:0 (stage 0) and 0:1 (stage 1) drop each other's packets; both stay
    connected to the store and to the other hosts."""
    run = _start(lab, run_dir, FOUR_HOSTS, iterations)
    try:
        out = _inject(run, 0, lambda: lab.cut(0, 1), "cut between stages")
        _detected(out, "(link down to", 90)
        return _finish(out, iterations, 120)
    finally:
        run.close()


def slow_case(lab: Lab, run_dir: str, iterations: int = 16, rate: str = "400kbit") -> Outcome:
    """(d): worker 1:1's link at `rate` both ways from iteration 2 on: measured (the
    kernel's busy time of its connections, link_meter.py), it is planned around as a
    straggler."""
    run = _start(lab, run_dir, FOUR_HOSTS, iterations)
    try:
        out = _inject(run, 2, lambda: lab.slow(3, rate), f"slow link ({rate})")
        _detected(out, "measured speeds changed", 90)
        _finish(out, iterations, 150)
        _speed_notes(out)
        return out
    finally:
        run.close()


def loss_case(lab: Lab, run_dir: str, iterations: int = 12, percent: int = 5) -> Outcome:
    """(e): every host drops `percent`% of its packets, in and out, from iteration 2 on."""
    def fault():
        for i in range(len(lab.hosts)):
            lab.loss(i, percent)
    run = _start(lab, run_dir, FOUR_HOSTS, iterations)
    try:
        out = _inject(run, 2, fault, f"{percent}% packet loss")
        _finish(out, iterations, 150)
        _speed_notes(out)
        return out
    finally:
        run.close()


def _speed_notes(out: Outcome) -> None:
    """Seconds per iteration before and after the fault (progress lines); what the
    coordinator did about it (events after the fault)."""
    lines = _iteration_periods(out.run)
    before = [t for t, _ in lines if t < out.fault]
    after = [t for t, _ in lines if t >= out.fault]
    its = [i for t, i in lines]
    def per(ts, n):
        return (ts[-1] - ts[0]) / n if len(ts) > 1 and n > 0 else None
    nb = (max(i for t, i in lines if t < out.fault) - min(its)) if before else 0
    na = (max(its) - max(i for t, i in lines if t < out.fault)) if before and after else 0
    b = per(before, nb)
    a = (after[-1] - before[-1]) / na if before and after and na else None
    out.notes.append("s/iteration before " + (f"{b:.3f}" if b else "?") + ", after "
                     + (f"{a:.3f}" if a else "?"))
    if out.recover_s is not None:  # from the first plan that trained after the detection
        late = [(t, i) for t, i in lines if t >= out.fault + out.recover_s]
        if len(late) > 1 and late[-1][1] > late[0][1]:
            out.notes[-1] += (", under the plan that planned around it "
                              f"{(late[-1][0] - late[0][0]) / (late[-1][1] - late[0][1]):.3f}")
    said = [e for e in out.run.out.lines if e[0] >= out.fault and not ITER_LINE.search(e[1])
            and "peer-memory snapshots" not in e[1]]
    out.notes.append("coordinator events after the fault: "
                     + ("; ".join(line for _, line in said) if said else "none"))
    if said:  # what the coordinator made of it, first; and when all had re-entered
        out.detect_s, out.detect_line = said[0][0] - out.fault, said[0][1]
        out.recover_s = _recovered(out)


def torchrun_partition_case(lab: Lab, run_dir: str, iterations: int = 10) -> Outcome:
    """(a) + (b) through torchrun: two `torchrun --nnodes 2` launches, node i on host i
    (node = replica, `--placement stages`), the coordinator `recycle train --external`'s
    (here in this process), its store at the gateway. Node 1's host drops every packet once
    iteration 0 is in: its two workers are declared failed by their silent heartbeats, the
    others train on (until iteration 6, held for them by `--rejoin 1:0@6 --rejoin 1:1@6`);
    healed, the fenced processes stop with EXIT_FENCED, node 1's agent restarts them
    (`--max-restarts 1`) and they come back (incarnation 2)."""
    import signal
    import subprocess
    import sys

    from executor.inputs.launch_spec import Faults
    hold = iterations - 4
    # The hold for a torchrun'd worker lasts 4 x --timeout + 5 s from its death; a node's
    # restart (two new processes importing torch) took up to ~16 s on a busy 2-core machine
    run = LocalRun(lab, run_dir, {}, **_spec(
        iterations, deadline_s=170, external=True, timeout=TORCHRUN_TIMEOUT,
        faults=Faults(rejoins=[(1, 0, hold), (1, 1, hold)])))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               RECYCLE_STORE=f"{lab.gateway}:{run.coordinator.store.port}")
    env.pop("GLOO_SOCKET_IFNAME", None)  # executor.torchrun picks the host's interface
    with socket.socket() as s:  # a free port for torchrun's own rendezvous, on host 0
        s.bind(("127.0.0.1", 0))
        master_port = s.getsockname()[1]
    nodes, logs = [], []
    try:
        for node in range(2):
            log = open(os.path.join(run_dir, f"node{node}.log"), "w")
            logs.append(log)
            nodes.append(subprocess.Popen(
                lab.exec_prefix(node) + [
                    sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                    "--node-rank", str(node), "--master-addr", lab.addr(0),
                    "--master-port", str(master_port), "--monitor-interval", "0.2",
                    "--nproc-per-node", str(S), "--max-restarts", "1", "-m", "executor.torchrun"],
                cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        out = _inject(run, 0, lambda: lab.partition(1), "torchrun node partition")
        _detected(out, "failed (heartbeat stopped", 60)  # 1:0's or 1:1's
        for w in ("1:0", "1:1"):
            run.wait_for(f"worker {w} failed", 30, out.fault)
        # Healed at once: its processes must be back within the hold's limit (4 x
        # --timeout + 5 s from their death), and the others train on meanwhile.
        lab.heal(1)
        out.notes.append(f"healed {time.monotonic() - out.fault:.1f} s after the fault")
        back = [run.wait_for(f"worker {w} is back (incarnation", 60, out.fault)
                for w in ("1:0", "1:1")]
        out.back_s = max(back) - out.fault
        _finish(out, iterations, 120)
        for p in nodes:  # both agents exit 0: every worker saw the end
            try:
                out.nodes.append(p.wait(timeout=60))
            except subprocess.TimeoutExpired:
                out.nodes.append(None)
        return out
    finally:
        run.close()
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for f in logs:
            f.close()
