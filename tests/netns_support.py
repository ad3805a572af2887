"""Test hosts for network faults: Linux network namespaces joined by veth links.

`Lab(n)` makes n hosts `rcXXXXh0..` (network namespaces, each with one interface `eth0`
at 10.A.B.(10+i)/24) whose veth peers are ports of a bridge in the root namespace, which
holds 10.A.B.1: the coordinator's address (its store listens there). Workers placed on
a host (`RECYCLE_HOSTS`, executor/launch/coordinator/processes.py, or `ip netns exec
HOST torchrun ...`) reach the store and each other over real links, so faults are real:

  partition(i)       host i drops every packet in and out (nftables in its namespace):
                     alive and still sending, but cut off from everyone
  cut(i, j)          hosts i and j drop each other's packets only (both stay connected to
                     the store and to every other host)
  slow(i, rate)      tc tbf on both ends of host i's link (egress of each side)
  loss(i, percent)   nftables `numgen random mod 100 < percent drop`, in and out of host i
  heal(i)            every nftables rule of host i goes (tc stays until unslow(i))

Everything a Lab makes it removes in close() (its namespaces, with the rules and qdiscs
in them, the veths and the bridge), also after a failed test; names carry a random tag
so concurrent runs never meet. `Lab.unavailable()` says why a test must skip (not root,
no CAP_NET_ADMIN, no `ip`/`nft`/`tc`, a kernel that refuses namespaces).

`LocalRun` runs the local coordinator (executor/launch/launcher.py) in this process on a
thread, its workers on the lab's hosts, with every line it prints stamped with the time
it came; the `*_case` functions at the end are the cases tests/test_network_faults.py
asserts on and benchmarks/network_faults.py times."""
from __future__ import annotations

import functools
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

TABLE = "recycle_fault"


def sh(*args: str, check: bool = True, input: Optional[str] = None) -> subprocess.CompletedProcess:
    out = subprocess.run(list(args), capture_output=True, text=True, input=input)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out


class Lab:
    def __init__(self, hosts: int):
        self.tag = f"rc{random.randrange(16 ** 4):04x}"
        self.hosts = [f"{self.tag}h{i}" for i in range(hosts)]
        self.bridge = f"{self.tag}br"
        used = sh("ip", "-4", "-o", "addr").stdout
        while True:
            net = f"10.{random.randrange(100, 250)}.{random.randrange(256)}"
            if f" {net}." not in used:
                break
        self.net = net
        self.gateway = f"{net}.1"  # the root namespace's end: where the store listens
        self._made: list[tuple[str, str]] = []  # ("netns"|"link", name), to remove

    # ---- the hosts -------------------------------------------------------------------
    @staticmethod
    def unavailable() -> Optional[str]:
        """Why network-namespace tests cannot run here, or None."""
        if os.geteuid() != 0:
            return "needs root (CAP_NET_ADMIN) for network namespaces"
        for tool in ("ip", "nft", "tc"):
            if shutil.which(tool) is None:
                return (f"`{tool}` not installed (scripts/setup.sh installs iproute2 and "
                        "nftables)")
        probe = f"rcprobe{os.getpid() % 100000}"
        made = sh("ip", "netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"the kernel refuses network namespaces: {made.stderr.strip()}"
        try:
            veth = sh("ip", "link", "add", f"{probe}a", "type", "veth", "peer", "name", "eth0",
                      "netns", probe, check=False)
            if veth.returncode != 0:
                return f"no veth links: {veth.stderr.strip()}"
            nft = sh("ip", "netns", "exec", probe, "nft", "add", "table", "inet", TABLE,
                     check=False)
            if nft.returncode != 0:
                return f"nftables refused: {nft.stderr.strip()}"
        finally:
            sh("ip", "link", "del", f"{probe}a", check=False)
            sh("ip", "netns", "del", probe, check=False)
        return None

    def addr(self, i: int) -> str:
        return f"{self.net}.{10 + i}"

    def up(self) -> "Lab":
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", self.bridge))
            sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "up")
            for i, host in enumerate(self.hosts):
                sh("ip", "netns", "add", host)
                self._made.append(("netns", host))
                port = f"{self.tag}v{i}"
                sh("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0",
                   "netns", host)
                self._made.append(("link", port))
                sh("ip", "link", "set", port, "master", self.bridge)
                sh("ip", "link", "set", port, "up")
                self.ns(i, "ip", "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
                self.ns(i, "ip", "link", "set", "eth0", "up")
                self.ns(i, "ip", "link", "set", "lo", "up")
            self._wait_links()
        except BaseException:
            self.close()
            raise
        return self

    def _wait_links(self, timeout_s: float = 10.0) -> None:
        """Every host reaches the gateway (a bridge port forwards once it is up)."""
        end = time.monotonic() + timeout_s
        for i in range(len(self.hosts)):
            while not self.reaches(i, self.gateway):
                if time.monotonic() > end:
                    raise RuntimeError(f"host {self.hosts[i]} cannot reach {self.gateway}")
                time.sleep(0.1)

    def reaches(self, i: int, addr: str, timeout_s: float = 1.0) -> bool:
        """Does a TCP connection from host i to `addr` get through (an open port on it, or
        a refusal: either way the packets went both ways)?"""
        with socket.socket() as listener:
            listener.bind(("0.0.0.0", 0)) if addr == self.gateway else None
            port = listener.getsockname()[1] if addr == self.gateway else 9  # 9: refused
            if addr == self.gateway:
                listener.listen(1)
            probe = (f"import socket,sys\ns=socket.socket();s.settimeout({timeout_s})\n"
                     f"try: s.connect(('{addr}',{port}))\n"
                     "except ConnectionRefusedError: pass\n"
                     "except OSError: sys.exit(1)\n")
            return self.ns(i, sys.executable, "-c", probe, check=False).returncode == 0

    def close(self) -> None:
        """Remove everything made, newest first; never raises."""
        for kind, name in reversed(self._made):
            if kind == "netns":
                sh("ip", "netns", "del", name, check=False)
            else:
                sh("ip", "link", "del", name, check=False)
        self._made.clear()

    def __enter__(self) -> "Lab":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.close()

    def ns(self, i: int, *cmd: str, check: bool = True, input: Optional[str] = None):
        return sh("ip", "netns", "exec", self.hosts[i], *cmd, check=check, input=input)

    def exec_prefix(self, i: int) -> list[str]:
        """A command prefix that runs a command on host i."""
        return ["ip", "netns", "exec", self.hosts[i]]

    def placement(self, workers: dict) -> str:
        """RECYCLE_HOSTS for {(replica, stage): host index}."""
        return ",".join(f"{r}:{s}={self.hosts[i]}" for (r, s), i in sorted(workers.items()))

    # ---- faults ------------------------------------------------------------------------
    def _rules(self, i: int, rules: list[str]) -> None:
        """nftables rules on host i's eth0, input and output, in one transaction."""
        body = "\n".join(
            [f"add table inet {TABLE}",
             f"add chain inet {TABLE} in {{ type filter hook input priority 0 ; }}",
             f"add chain inet {TABLE} out {{ type filter hook output priority 0 ; }}"]
            + [f"add rule inet {TABLE} {chain} {rule}" for chain, rule in rules])
        self.ns(i, "nft", "-f", "-", input=body + "\n")

    def partition(self, i: int) -> None:
        self._rules(i, [("in", 'iifname "eth0" drop'), ("out", 'oifname "eth0" drop')])

    def cut(self, i: int, j: int) -> None:
        """Hosts i and j no longer reach each other (rules on both sides)."""
        for a, b in ((i, j), (j, i)):
            self._rules(a, [("in", f"ip saddr {self.addr(b)} drop"),
                            ("out", f"ip daddr {self.addr(b)} drop")])

    def loss(self, i: int, percent: int) -> None:
        self._rules(i, [("in", f'iifname "eth0" numgen random mod 100 < {percent} drop'),
                        ("out", f'oifname "eth0" numgen random mod 100 < {percent} drop')])

    def heal(self, i: int) -> None:
        self.ns(i, "nft", "delete", "table", "inet", TABLE, check=False)

    def slow(self, i: int, rate: str = "400kbit") -> None:
        """Host i's link at `rate` both ways (tbf on each end's egress)."""
        tbf = ["root", "tbf", "rate", rate, "burst", "4kb", "latency", "2s"]
        self.ns(i, "tc", "qdisc", "replace", "dev", "eth0", *tbf)
        sh("tc", "qdisc", "replace", "dev", f"{self.tag}v{i}", *tbf)

    def unslow(self, i: int) -> None:
        self.ns(i, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        sh("tc", "qdisc", "del", "dev", f"{self.tag}v{i}", "root", check=False)


# ---- a local run on the hosts ----------------------------------------------------------
class Stamped:
    """A text stream that keeps when each line was written (time.monotonic())."""

    def __init__(self):
        self.lines: list[tuple[float, str]] = []
        self._part = ""

    def write(self, s: str) -> int:
        now = time.monotonic()
        self._part += s
        *done, self._part = self._part.split("\n")
        self.lines.extend((now, line) for line in done)
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def line_at(self, needle: str, after: float = 0.0) -> str:
        return next((line for t, line in self.lines if t >= after and needle in line), "")

    def when(self, needle: str, after: float = 0.0) -> Optional[float]:
        """When the first line holding `needle` (written after `after`) came, or None."""
        return next((t for t, line in self.lines if t >= after and needle in line), None)


class LocalRun:
    """`recycle train`'s coordinator (executor/launch/launcher.py) in this process, on a
    thread, with worker R:S on host `placement[(R, S)]` of `lab` (RECYCLE_HOSTS, the
    store at the lab's gateway). `spec` holds LaunchSpec's other fields."""

    def __init__(self, lab: Lab, run_dir: str, placement: dict, **spec):
        import threading

        from rich.console import Console

        from executor.inputs.launch_spec import LaunchSpec
        from executor.launch.launcher import Coordinator
        self.out = Stamped()
        self.run_dir = run_dir
        env = {"RECYCLE_HOSTS": lab.placement(placement), "RECYCLE_STORE_ADDR": lab.gateway}
        self._env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # read by LaunchSpec's checks and the coordinator's processes
        try:
            self.spec = LaunchSpec(run_dir=run_dir, summary_path=os.path.join(run_dir, "s.json"),
                                   **spec)
            self.coordinator = Coordinator(self.spec, console=Console(
                file=self.out, width=250, color_system=None, soft_wrap=True))
        finally:  # the coordinator has read them (its processes keep the placement)
            self._restore()
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.began = time.monotonic()
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.coordinator.run()
            if self.result.summary is not None:
                self.result.summary.save(self.spec.summary_path)
        except BaseException as exc:  # noqa: BLE001 (re-raised by wait())
            self.error = exc

    def _restore(self) -> None:
        for k, v in self._env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def text(self) -> str:
        return self.out.text()

    def wait_for(self, needle: str, timeout_s: float, after: float = 0.0) -> float:
        """When the coordinator printed `needle` (polled); AssertionError past timeout_s."""
        end = time.monotonic() + timeout_s
        while (t := self.out.when(needle, after)) is None:
            if time.monotonic() > end or not self.thread.is_alive():
                raise AssertionError(f"no {needle!r} within {timeout_s:g} s:\n{self.text()}"
                                     f"\n{self.logs()}")
            time.sleep(0.02)
        return t

    def wait_iteration(self, k: int, timeout_s: float) -> float:
        """When the coordinator first printed the progress of iteration k or a later one
        (it does not print every iteration)."""
        end = time.monotonic() + timeout_s
        while True:
            for t, line in self.out.lines:
                m = ITER_LINE.search(line)
                if m and int(m[1]) >= k:
                    return t
            if time.monotonic() > end or not self.thread.is_alive():
                raise AssertionError(f"no iteration {k} within {timeout_s:g} s:\n"
                                     f"{self.text()}\n{self.logs()}")
            time.sleep(0.02)

    def wait(self, timeout_s: float):
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise AssertionError(f"run not over within {timeout_s:g} s:\n{self.text()}\n"
                                 f"{self.logs()}")
        if self.error is not None:
            raise self.error
        return self.result

    def logs(self) -> str:
        import glob
        return "".join(f"== {f}\n" + open(f).read() for f in sorted(
            glob.glob(os.path.join(self.run_dir, "*.log"))))

    def close(self) -> None:
        """End the run if it still goes (its workers die with it)."""
        if self.thread.is_alive():
            self.coordinator.stop()
            self.thread.join(30)

    def entered(self) -> dict:
        """{version: [wall time each worker entered it]} from the run record."""
        out: dict = {}
        for at, w, inc, v, first in self.coordinator.record.entries:
            out.setdefault(v, []).append(at)
        return out


# ---- the cases (tests/test_network_faults.py asserts on them, benchmarks/network_faults.py
# times them) -----------------------------------------------------------------------------
D, S, M = 2, 2, 2
TIMEOUT = 3.0  # --timeout: every detection below is a few of these
TORCHRUN_TIMEOUT = 6.0  # through torchrun: its restarts must come back within the hold
FOUR_HOSTS = {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3}  # one worker a host
ITER_LINE = re.compile(r"iter +(\d+) .*plan v(\d+) +failed (.*)$")


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
