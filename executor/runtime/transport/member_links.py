"""One version's links as a member sees them: the probe socket its check-in names, the
probe of the others' before gloo's rendezvous (a cut link, binding.unreachable), and the
meter of its own link (a slow link, link_meter.py). comm.World owns one per version."""
from __future__ import annotations

from typing import Optional

import torch.distributed as dist

from executor import protocol as P
from executor.runtime.transport.binding import probe_listener, unreachable
from executor.runtime.transport.link_meter import LinkMeter

Worker = tuple[int, int]


class MemberLinks:
    def __init__(self, version: int, me: Worker, workers: list, timeout_s: float):
        self.version, self.me, self.workers, self.timeout_s = version, me, workers, timeout_s
        # a socket listening where gloo listens (nothing accepts: the kernel's backlog
        # completes the peers' connections); None where none can be opened
        self.probe = probe_listener(len(workers))
        self.meter: Optional[LinkMeter] = None

    def checkin(self) -> str:
        """What the check-in key holds: the probe's "host:port", "1" without one."""
        return "1" if self.probe is None else "%s:%d" % self.probe.getsockname()[:2]

    def addresses(self, store: dist.Store, members) -> dict:
        """{member: "host:port"} of those of `members` (not us) checked in under this
        version with a probe socket; {} when the store is out of reach."""
        peers = {}
        try:
            for w in members:
                key = P.checkin_key(self.version, w)
                if w != self.me and store.check([key]):
                    addr = store.get(key).decode()
                    if ":" in addr:
                        peers[w] = addr
        except Exception:  # the store itself is out of reach: no link to blame
            return {}
        return peers

    def down(self, store: dist.Store) -> list:
        """The members checked in whose probe address no TCP connection reaches, in rank
        order: before a later version's rendezvous, and after any failed one."""
        if self.probe is None:
            return []
        # SYNs lost to packet loss are sent again after 1 and 3 s: a link that answers
        # none within the comm timeout (at most 5 s) is down
        return sorted(unreachable(self.addresses(store, self.workers), min(5.0, self.timeout_s)))

    def start_meter(self, store: dist.Store) -> None:
        """Once gloo's groups exist: meter this worker's links to the members of its own
        and the adjacent stages on other hosts; none where all share our host."""
        if self.probe is None:
            return
        near = [w for w in self.workers if abs(w[1] - self.me[1]) <= 1]
        hosts = {a.rpartition(":")[0] for a in self.addresses(store, near).values()}
        hosts = {h for h in hosts if h != self.probe.getsockname()[0]
                 and not h.startswith("127.")}
        self.meter = LinkMeter(hosts) if hosts else None

    def seconds_per_microbatch(self, microbatches: int) -> float:
        return 0.0 if self.meter is None else self.meter.seconds_per_microbatch(microbatches)

    def close(self) -> None:
        self.meter = None
        probe, self.probe = self.probe, None
        if probe is not None:
            probe.close()
