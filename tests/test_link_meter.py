"""The link meter reads the kernel's own TCP figures (executor/runtime/transport/
link_meter.py): the offsets it reads in struct tcp_info, and that a fast link reads next to nothing.
The slow link itself (tc tbf between test hosts) is tests/test_network_faults.py's."""
import socket
import threading

from executor.runtime.transport.link_meter import LinkMeter, _tcp_info, tcp_sockets_to


def _pair():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    srv.close()
    return c, s


def _drain(s):
    while s.recv(1 << 20):
        pass


def test_bytes_acked_is_read_at_its_offset():
    c, s = _pair()
    threading.Thread(target=_drain, args=(s,), daemon=True).start()
    try:
        a0 = _tcp_info(c.fileno())[0]
        c.sendall(b"x" * 300_000)
        for _ in range(500):  # until the peer's kernel acked it all
            if _tcp_info(c.fileno())[0] - a0 >= 300_000:
                break
            threading.Event().wait(0.01)
        assert _tcp_info(c.fileno())[0] - a0 == 300_000
    finally:
        c.close()
        s.close()


def test_a_fast_link_reads_next_to_nothing_and_only_the_named_hosts_are_watched():
    c, s = _pair()
    threading.Thread(target=_drain, args=(s,), daemon=True).start()
    try:
        assert c.fileno() in tcp_sockets_to({"127.0.0.1"})
        assert not tcp_sockets_to({"10.255.255.254"})
        meter = LinkMeter({"127.0.0.1"})
        c.sendall(b"x" * 100_000)
        threading.Event().wait(0.05)
        # busy time is counted in jiffies (1-4 ms): loopback carries 100 kB in under one
        # or two on a loaded machine; a 400 kbit/s link would be busy 2 s
        assert meter.seconds_per_microbatch(2) <= 0.02
    finally:
        c.close()
        s.close()
