"""Where a worker's connections go out from: the host it runs on (a network namespace, for
test hosts) and the interface gloo binds.

gloo picks its address from the machine's hostname and, where that resolves to no
address it can bind (Debian's `127.0.1.1 host` line, a container, a network namespace),
falls back to loopback: every peer on another machine is then told to connect to
127.0.0.1, and the first world times out. Unless GLOO_SOCKET_IFNAME says otherwise, a
worker whose store is on another host therefore binds gloo to the interface its route to
the store leaves by (`bind_gloo_towards`), the one interface known to reach the run.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import os
import socket
import struct
from typing import Optional

from planner.control.cut_links import LINK_DOWN  # noqa: F401 (its users import it here)

CLONE_NEWNET = 0x40000000
SIOCGIFADDR = 0x8915
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"


def enter_netns(name: str) -> None:
    """Move this process (its calling thread, and every thread and socket it makes from
    now on) into network namespace `name`: one made by `ip netns add NAME`
    (/run/netns/NAME), or a path. As `ip netns exec NAME`, without a new process."""
    path = name if name.startswith("/") else os.path.join("/run/netns", name)
    fd = os.open(path, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot enter network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _ipv4(host: str) -> Optional[str]:
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except (socket.gaierror, IndexError):
        return None


def route_interface(host: str) -> Optional[str]:
    """The interface this host's route to `host` leaves by (IPv4), or None."""
    addr = _ipv4(host)
    if addr is None:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))  # no packet: a UDP connect only picks the route
            local = s.getsockname()[0]
            for _, name in socket.if_nameindex():
                try:
                    raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR,
                                                    struct.pack("256s", name.encode()[:15]))
                except OSError:  # no IPv4 address on it
                    continue
                if socket.inet_ntoa(raw[20:24]) == local:
                    return name
    except OSError:
        return None
    return None


def _hostname_address() -> Optional[str]:
    """The hostname's first address that is not loopback and can be bound here: where
    gloo's default device listens (None: it takes loopback)."""
    try:
        addrs = [ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None,
                                                        socket.AF_INET)]
    except socket.gaierror:
        return None
    for a in addrs:
        if ipaddress.ip_address(a).is_loopback:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((a, 0))
            return a
        except OSError:
            continue
    return None


def gloo_would_use_loopback() -> bool:
    """gloo's default device (no GLOO_SOCKET_IFNAME): the hostname's address if it can
    bind one of them, else loopback."""
    return _hostname_address() is None


def bind_gloo_towards(store_host: str) -> Optional[str]:
    """Set GLOO_SOCKET_IFNAME to the interface towards the store when it is unset, the
    store is not on loopback and gloo would otherwise bind loopback; the name set, or
    None (nothing changed)."""
    if os.environ.get(GLOO_IFNAME):
        return None
    addr = _ipv4(store_host)
    if addr is None or ipaddress.ip_address(addr).is_loopback or not gloo_would_use_loopback():
        return None
    name = route_interface(addr)
    if name is None or name == "lo":
        return None
    os.environ[GLOO_IFNAME] = name
    return name


# ---- which links of a world are down --------------------------------------------------
# A world's members check in on the store (comm.py World._meet) with the address of a
# listening socket on the address gloo binds; when gloo's rendezvous then fails, each
# member tries a TCP connection to every other member's: one that neither connects nor is
# refused within the probe time is a link down (the peer itself is alive and checked in).
# The suspect it reports says LINK_DOWN, so the coordinator can fence one end of a cut
# link instead of re-publishing the same members forever (planner/control/cut_links.py).
# LINK_DOWN (imported above from planner/control/cut_links.py) names it.


def interface_address(name: str) -> Optional[str]:
    """The IPv4 address of interface `name`, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(raw[20:24])
    except OSError:
        return None


def gloo_address() -> str:
    """The address gloo binds here: GLOO_SOCKET_IFNAME's (its first interface), else the
    hostname's if bindable, else loopback (as gloo's default device)."""
    names = [n for n in os.environ.get(GLOO_IFNAME, "").split(",") if n]
    if names:
        return interface_address(names[0]) or "127.0.0.1"
    return _hostname_address() or "127.0.0.1"


def probe_listener(backlog: int) -> Optional[socket.socket]:
    """A socket listening on gloo's address (connections complete in the kernel's
    backlog: nothing accepts them), or None if none can be opened."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((gloo_address(), 0))
        s.listen(max(16, backlog))
        return s
    except OSError:
        return None


def unreachable(peers: dict, timeout_s: float) -> list:
    """Of `peers` ({key: "host:port"}), those no TCP connection reaches within
    `timeout_s` (neither accepted nor refused), probed all at once."""
    import selectors
    import time
    down = []
    with selectors.DefaultSelector() as sel:
        for key, addr in peers.items():
            host, _, port = addr.rpartition(":")
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            err = s.connect_ex((host, int(port)))
            if err in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                sel.register(s, selectors.EVENT_WRITE, key)
                continue
            s.close()
            if err not in (0, errno.ECONNREFUSED):  # no route, network unreachable
                down.append(key)
        end = time.monotonic() + timeout_s
        while sel.get_map() and time.monotonic() < end:
            for k, _ in sel.select(max(0.0, end - time.monotonic())):
                sel.unregister(k.fileobj)
                err = k.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                k.fileobj.close()
                if err not in (0, errno.ECONNREFUSED):
                    down.append(k.data)
        for k in list(sel.get_map().values()):  # neither connected nor refused in time
            sel.unregister(k.fileobj)
            k.fileobj.close()
            down.append(k.data)
    return down
