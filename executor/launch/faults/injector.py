"""Injected faults for the local coordinator: real signals at a known point of an iteration.

  --kill  R:S@ITER           SIGKILL the worker halfway through its actions of ITER;
  --stall R:S@ITER:SECONDS   SIGSTOP it there and SIGCONT it SECONDS later: a worker that
                             hangs without dying (a straggler, a long GC or swap pause).
The worker reports `mid` when it reaches the middle of its action list and, when a fault
may be due there, waits for the coordinator's go-ahead (steps/iteration.py) so the signal lands
mid-iteration. Every entry fires at most once, in whichever incarnation of the worker
reaches that iteration first (a re-run of the iteration after a rollback does not repeat it).

Faults the network makes need workers on other hosts: RECYCLE_HOSTS / RECYCLE_STORE_ADDR
(read here, checked with the run's other faults; coordinator/processes.py places them).
"""
from __future__ import annotations

import os
import re
import signal
import time
from typing import Callable

from planner.errors import UserError

Worker = tuple[int, int]
# Local workers placed on other (test) hosts (coordinator/processes.py): the network can
# fail them too, so a --rejoin/--restart of theirs needs no --kill or --stall.
HOSTS_ENV = "RECYCLE_HOSTS"
STORE_ADDR_ENV = "RECYCLE_STORE_ADDR"  # where the store listens, and they dial it


def parse_event(text: str) -> tuple[int, int, int]:
    """`R:S@ITER` as typed on the command line."""
    m = re.fullmatch(r"(\d+):(\d+)@(\d+)", text.strip())
    if not m:
        raise UserError(f"cannot read {text!r}: expected REPLICA:STAGE@ITERATION, e.g. 1:0@2")
    return int(m[1]), int(m[2]), int(m[3])


def parse_stall(text: str) -> tuple[int, int, int, float]:
    """`R:S@ITER:SECONDS` as typed on the command line."""
    m = re.fullmatch(r"(\d+):(\d+)@(\d+):(\d+(?:\.\d*)?)", text.strip())
    if not m:
        raise UserError(f"cannot read {text!r}: expected REPLICA:STAGE@ITERATION:SECONDS, "
                         "e.g. 0:1@1:3.5")
    return int(m[1]), int(m[2]), int(m[3]), float(m[4])


def parse_slow(text: str) -> tuple[int, int, int, float]:
    """`R:S@ITER:FACTOR` as typed on the command line (FACTOR 1 ends the slowness)."""
    m = re.fullmatch(r"(\d+):(\d+)@(\d+):(\d+(?:\.\d*)?|\.\d+)", text.strip())
    if not m:
        raise UserError(f"cannot read {text!r}: expected REPLICA:STAGE@ITERATION:FACTOR, "
                         "e.g. 1:1@2:0.5")
    factor = float(m[4])
    if not 0 < factor <= 1:
        raise UserError(f"--slow {text}: FACTOR must be in (0, 1] (1 ends the slowness; "
                         "a worker cannot be made faster)")
    return int(m[1]), int(m[2]), int(m[3]), factor


def worker_hosts(text: str, replicas: int, stages: int) -> dict[Worker, str]:
    """RECYCLE_HOSTS ("R:S=NETNS,...") as {worker: network namespace}; UserError (one
    line) for a malformed entry, a worker outside the grid or a namespace not there."""
    out: dict[Worker, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, ns = item.partition("=")
        r, colon, st = key.partition(":")
        if not (sep and colon and r.strip().isdigit() and st.strip().isdigit() and ns.strip()):
            raise UserError(f"{HOSTS_ENV}: cannot read {item!r}: expected REPLICA:STAGE=NETNS")
        w, ns = (int(r), int(st)), ns.strip()
        if not (w[0] < replicas and w[1] < stages):
            raise UserError(f"{HOSTS_ENV}: no worker {w[0]}:{w[1]} in a {replicas}x{stages} grid")
        path = ns if ns.startswith("/") else os.path.join("/run/netns", ns)
        if not os.path.exists(path):
            raise UserError(f"{HOSTS_ENV}: worker {w[0]}:{w[1]}: no network namespace {ns} "
                            f"({path}; make it with `ip netns add {ns}`)")
        out[w] = ns
    return out


def check_hosts(replicas: int, stages: int) -> None:
    """RECYCLE_HOSTS and RECYCLE_STORE_ADDR as `recycle train` reads them: refused in one
    line before the run starts (coordinator/processes.py places the workers)."""
    if worker_hosts(os.environ.get(HOSTS_ENV, ""), replicas, stages) and not os.environ.get(
            STORE_ADDR_ENV, "").strip():
        raise UserError(f"{HOSTS_ENV} places workers on other hosts: set {STORE_ADDR_ENV} "
                        "to an address of this machine that they reach")


def check_faults(replicas: int, stages: int, iterations: int, kills=(), rejoins=(),
                 stalls=(), slows=(), external: bool = False) -> None:
    """Refuse (ValueError, one line) a fault no run could ever carry out: it would be
    waited for, or silently never happen. With external workers a death may come from
    their launcher (torchrun stops a node's other workers), and with workers on other
    hosts (RECYCLE_HOSTS) from the network (a partition), so a rejoin needs no kill."""
    check_hosts(replicas, stages)
    external = external or bool(os.environ.get(HOSTS_ENV, "").strip())
    def flag_of(rejoin) -> str:  # (r, s, it[, asap]): asap entries are --restart's
        return "--restart" if len(rejoin) > 3 and rejoin[3] else "--rejoin"

    for flag, items in (("--kill", kills),
                        ("--rejoin", [k for k in rejoins if flag_of(k) == "--rejoin"]),
                        ("--restart", [k for k in rejoins if flag_of(k) == "--restart"]),
                        ("--stall", stalls), ("--slow", slows)):
        for k in items:
            r, s, it = k[0], k[1], k[2]
            if not (r < replicas and s < stages):
                raise UserError(f"{flag} {r}:{s}@{it}: no worker {r}:{s} in a "
                                 f"{replicas}x{stages} grid")
            if it >= iterations:
                raise UserError(f"{flag} {r}:{s}@{it}: training has iterations "
                                 f"0..{iterations - 1}")
    # A rejoin serves one death (earliest entry first): each needs its own --kill or
    # --stall (a stalled worker may be declared failed) of that worker at or before it.
    deaths = sorted((k[2], (k[0], k[1])) for k in list(kills) + list(stalls))
    for r, s, it, flag in sorted((*k[:3], flag_of(k)) for k in rejoins if not external):
        cause = next((d for d in deaths if d[1] == (r, s) and d[0] <= it), None)
        if cause is None:
            raise UserError(f"{flag} {r}:{s}@{it}: no --kill or --stall of worker {r}:{s} "
                             f"at or before iteration {it} for it to come back from")
        deaths.remove(cause)


def fault_iterations(kills, stalls, me: Worker) -> set[int]:
    """Iterations at whose mid-point the worker `me` waits for the coordinator."""
    return {k[2] for k in list(kills) + list(stalls) if (k[0], k[1]) == tuple(me)}


class Injector:
    """Coordinator side: sends the signals when a worker reports its mid-point."""

    def __init__(self, kills, stalls, event: Callable[[str], None]):
        self.kills = [tuple(k) for k in kills]
        self.stalls = [tuple(s) for s in stalls]
        self.event = event
        self.stopped: dict[int, tuple[float, str]] = {}  # pid -> (SIGCONT time, worker)
        # What was injected when (wall clock): [start, end, "kill"|"stall", "r:s"]; a stall's
        # end is its SIGCONT. Recovery figures use it to tell clean measurements apart.
        self.log: list[list] = []
        self._stall_row: dict[int, list] = {}

    def mid(self, w: Worker, it: int, pid: int) -> bool:
        """Send what is due; True if the worker was SIGKILLed."""
        killed = False
        for k in [k for k in self.kills if k == (w[0], w[1], it)]:
            self.kills.remove(k)
            self.event(f"SIGKILL worker {w[0]}:{w[1]} mid-iteration {it}")
            try:
                os.kill(pid, signal.SIGKILL)
                killed = True
            except ProcessLookupError:  # gone already (a torchrun'd worker died first)
                continue
            self.log.append([time.time(), time.time(), "kill", f"{w[0]}:{w[1]}"])
        for k in [k for k in self.stalls if k[:3] == (w[0], w[1], it)]:
            self.stalls.remove(k)
            self.event(f"SIGSTOP worker {w[0]}:{w[1]} mid-iteration {it} for {k[3]:g} s")
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            self.stopped[pid] = (time.monotonic() + k[3], f"{w[0]}:{w[1]}")
            self._stall_row[pid] = [time.time(), float("inf"), "stall", f"{w[0]}:{w[1]}"]
            self.log.append(self._stall_row[pid])
        return killed

    def due(self, w: Worker, it: int) -> bool:
        return any(k[:3] == (w[0], w[1], it) for k in self.kills + self.stalls)

    def drop(self, w: Worker, it: int) -> None:
        """A fault that cannot be carried out (the worker is on another host)."""
        self.kills = [k for k in self.kills if k[:3] != (w[0], w[1], it)]
        self.stalls = [k for k in self.stalls if k[:3] != (w[0], w[1], it)]

    def tick(self) -> None:
        now = time.monotonic()
        for pid, (due, name) in list(self.stopped.items()):
            if now >= due:
                self.resume(pid)
                self.event(f"SIGCONT worker {name}")

    def resume(self, pid: int) -> None:
        if pid in self._stall_row:
            self._stall_row.pop(pid)[1] = time.time()
        if self.stopped.pop(pid, None) is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def release_all(self) -> None:
        """On the way out: never leave a stopped process behind."""
        for pid in list(self.stopped):
            self.resume(pid)
