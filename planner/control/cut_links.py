"""A link cut between two live workers (a partition between hosts that leaves both
connected to the store): which end the coordinator fences.

Re-publishing the same members cannot help: every world of them fails its rendezvous
(gloo connects every pair), and the coordinator used to re-publish forever. When a
rendezvous fails, each member probes the others' addresses (executor/runtime/transport/
member_links.py) and reports the peers it cannot reach as suspects whose reason says LINK_DOWN. A link is
down when both of its ends say so (one probe lost to packet loss is not a cut). After a
short gathering time the coordinator declares one worker failed: the one with the most
links down (a worker cut off from many peers), on a tie the one whose stage keeps the
most live workers (the plan routes around it best), then the highest (replica, stage). Its process
is alive: it finds itself out of the next plan and stops (the plan version is the fence).
Pure bookkeeping: the local coordinator (executor/launch/launcher.py) and the service
(api/heartbeats.py) feed it and carry out the verdict.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Optional

Worker = tuple[int, int]
# What a worker's suspect report says of a peer it cannot reach at all (no TCP connection
# to the address the peer checked in with), as opposed to one that stopped answering.
LINK_DOWN = "link down"
GATHER_S = 1.0  # both ends of a cut link probe at once: they report within this of each other
PATIENCE_S = 6.0  # the other end's report is waited for this long (a loaded machine)


class LinkReports:
    def __init__(self, gather_s: float = GATHER_S, patience_s: float = PATIENCE_S):
        self.gather_s, self.patience_s = gather_s, patience_s
        self.reports: set[tuple[Worker, Worker]] = set()  # (reporter, unreachable peer)
        self.first: Optional[float] = None

    @property
    def pending(self) -> bool:
        """Reports await a verdict: re-publishing the same members would not help."""
        return bool(self.reports)

    def suspect(self, reporter: Worker, reason: str, now: float) -> None:
        """A suspect's reason; if it says LINK_DOWN, the peers it names (comm.py writes
        `link down to [(r, s), ...]`) are out of the reporter's reach."""
        if LINK_DOWN not in reason:
            return
        named = reason.split(LINK_DOWN, 1)[1].split("]", 1)[0]
        for r, s in re.findall(r"\((\d+), (\d+)\)", named):
            self.report(reporter, (int(r), int(s)), now)

    def report(self, reporter: Worker, peer: Worker, now: float) -> None:
        if tuple(reporter) == tuple(peer):
            return
        self.reports.add((tuple(reporter), tuple(peer)))
        if self.first is None:
            self.first = now

    def verdict(self, now: float, live: Iterable[Worker]) -> Optional[tuple[Worker, str]]:
        """(the worker to declare failed, why), once the gathering time is over and some
        link between live workers was reported down from both ends; None before. Reports
        that no other end confirms within the patience are forgotten (a probe lost to
        packet loss is no cut link)."""
        if self.first is None or now - self.first < self.gather_s:
            return None
        live = set(live)
        cut = {frozenset((r, p)) for r, p in self.reports
               if r in live and p in live and (p, r) in self.reports}
        if not cut:
            if now - self.first >= self.patience_s:
                self.reports, self.first = set(), None
            return None
        self.reports, self.first = set(), None
        counts = Counter(w for link in cut for w in link)
        per_stage = Counter(w[1] for w in live)
        victim = max(counts, key=lambda w: (counts[w], per_stage[w[1]], w))
        ends = sorted(w for link in cut if victim in link for w in link if w != victim)
        names = ", ".join(f"{r}:{s}" for r, s in ends)
        return victim, (f"link down to worker(s) {names}, both ends say so, while connected "
                        "to the store: fenced so that the others can meet")
