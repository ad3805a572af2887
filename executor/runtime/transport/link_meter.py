"""How long this worker's links take to carry its messages: a slow link planned around
as a straggler (docs/operators.md, "Network faults").

The straggler detector (planner/speeds.py) sees compute time per micro-batch, and a slow
link costs no compute: a worker behind a 400 kbit/s link trained every iteration 2.7x
slower and reported the same figure as its peers.

The kernel already times every TCP connection: `tcpi_busy_time` is how long the
connection had data to send and could not finish (in flight or queued), `tcpi_bytes_acked`
what it delivered (Linux 4.10+, TCP_INFO). So, once per iteration, this reads them from
the connections gloo opened to the members of this worker's own and adjacent stages on
other hosts (two processes of one host share no link that can be slow) -- a system call
per connection, no probe traffic, and no noise from the interpreter lock, which a timed
probe of our own paid on shared cores (a probe of a micro-batch's size also passed the
slow link's burst bucket untouched, while the iteration's traffic did not).

Per neighbour host, busy time per byte; the worker's own link is the fastest of them:
a worker whose every link is slow sits behind a slow link, while one slow neighbour
(0:0 sending to the slow 1:1) is that neighbour's figure, not ours. Time spent blocked
on the receiver's window (`tcpi_rwnd_limited`: the peer not reading yet) is the peer's
wait, not the link's, and is left out. The figure per micro-batch is that rate times the
bytes the worker sent this iteration over the micro-batches it ran; the worker reports
max(compute, link): receives are posted ahead (runtime/steps/iteration.py), so a
transfer overlaps the compute until it takes longer, and then the link paces the worker.
The kernel keeps busy time in jiffies (1-4 ms), so a fast link reads 0.

Where the data goes over NCCL (one GPU per worker), it does not cross these sockets (NCCL
keeps its own, or InfiniBand verbs the kernel never sees): the meter then watches gloo's
control traffic only, which reads next to nothing: a slow fabric link under NCCL is not
seen here, a known gap on GPU clusters.
"""
from __future__ import annotations

import os
import socket
import stat
import struct
from typing import Optional

# struct tcp_info (linux/tcp.h): offsets of the fields read
_BYTES_ACKED, _BUSY, _RWND_LIMITED = 120, 168, 176
_INFO_LEN = 192


def _tcp_info(fd: int) -> Optional[tuple[int, int, int]]:
    """(bytes acked, busy us, rwnd-limited us) of the TCP socket at `fd`; None if it is
    not one (any more) or the kernel is too old to say."""
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        b = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_LEN)
    except OSError:
        return None
    finally:
        s.detach()  # gloo's socket: never closed here
    if len(b) < _INFO_LEN:
        return None
    return (struct.unpack_from("Q", b, _BYTES_ACKED)[0], struct.unpack_from("Q", b, _BUSY)[0],
            struct.unpack_from("Q", b, _RWND_LIMITED)[0])


def tcp_sockets_to(hosts: set) -> dict:
    """{fd: (inode, peer host)} of this process's TCP sockets connected to `hosts`."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if not stat.S_ISSOCK(st.st_mode):
            continue
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if s.family == socket.AF_INET and s.type == socket.SOCK_STREAM:
                host = s.getpeername()[0]
                if host in hosts:
                    out[fd] = (st.st_ino, host)
        except OSError:
            pass
        finally:
            s.detach()
    return out


class LinkMeter:
    def __init__(self, hosts: set):
        """`hosts`: the addresses of this worker's neighbours on other hosts; the
        connections to them are gloo's of this version (call once its groups exist)."""
        self.socks = tcp_sockets_to(hosts)
        self._last = self._read()

    def _read(self) -> dict:
        """{fd: (bytes acked, busy us, rwnd-limited us)} of the sockets still ours."""
        out = {}
        for fd, (ino, _) in self.socks.items():
            try:
                if os.fstat(fd).st_ino != ino:  # gloo closed it; the number was reused
                    continue
            except OSError:
                continue
            info = _tcp_info(fd)
            if info is not None:
                out[fd] = info
        return out

    def seconds_per_microbatch(self, microbatches: int) -> float:
        """Since the last call: the time this worker's own link took per micro-batch to
        carry what it sent (0.0 when no neighbour link was busy for a jiffy)."""
        now = self._read()
        sent, per_host = 0, {}
        for fd, (acked, busy, rwnd) in now.items():
            a0, b0, r0 = self._last.get(fd, (acked, busy, rwnd))
            d_acked = acked - a0
            if d_acked <= 0:
                continue
            sent += d_acked
            host = self.socks[fd][1]
            b, n = per_host.get(host, (0, 0))
            per_host[host] = (b + max(0, (busy - b0) - (rwnd - r0)), n + d_acked)
        self._last = now
        if not per_host:
            return 0.0
        s_per_byte = min(b / n for b, n in per_host.values()) / 1e6
        return s_per_byte * sent / max(1, microbatches)
