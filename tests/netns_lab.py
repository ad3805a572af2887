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
it came; the cases (netns_support.py) are what tests/test_network_faults.py asserts on and
benchmarks/network_faults.py times."""
from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Optional

TABLE = "recycle_fault"
ITER_LINE = re.compile(r"iter +(\d+) .*plan v(\d+) +failed (.*)$")  # a progress line


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
            self.spec = LaunchSpec.build(run_dir=run_dir,
                                         summary_path=os.path.join(run_dir, "s.json"), **spec)
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
