"""Network faults between real (test) hosts (issue 42 item 6; the plan version as the
fence: docs/design.md section 6).

Every worker runs on its own test host: a network namespace whose `eth0` is a veth port of
a bridge in the root namespace, where the coordinator's store listens (tests/netns_support.py;
local workers are placed with RECYCLE_HOSTS, executor/launch/coordinator/processes.py;
torchrun nodes run under `ip netns exec`). gloo runs over those links, and the faults are
real: nftables rules in a host's namespace (a partition, a cut between two hosts, random
loss with `numgen random mod 100 < 5 drop`) and tc tbf (a slow link). Each case is injected
once a given iteration is in and must end exact against the one-process reference.
The cases themselves are in netns_support.py (benchmarks/network_faults.py times them).
Skipped with the reason where the kernel or the user cannot make namespaces.
"""
import os

import pytest

from netns_support import (FOUR_HOSTS, Lab, cut_case, loss_case, partition_case, slow_case,
                           torchrun_partition_case)

WHY_NOT = Lab.unavailable()
needs_hosts = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


@pytest.fixture
def lab():
    with Lab(len(FOUR_HOSTS)) as made:
        yield made


def _why(out) -> str:
    return f"{out.diffs}\n{out.run.text()}\n{out.run.logs()}"


@needs_hosts
@pytest.mark.hard_timeout(150)
def test_partitioned_worker_is_declared_failed_fenced_and_rejoins_once_healed(tmp_path, lab):
    """(a) + (b). Worker 1:1's host drops every packet: alive, still sending, cut off from
    the store and from every peer. Its heartbeat stops, so it is declared failed (the local
    coordinator used to re-publish the same members forever); what it sends as the old
    process is not acted on (a forged fatal and wrong losses of iteration 0 change nothing);
    the others train on exact. Healed, it learns it is out of the plan and stops, and the
    due --restart brings it back as incarnation 2."""
    out = partition_case(lab, str(tmp_path))
    assert out.exact, _why(out)
    ev = "\n".join(out.events)
    # declared failed by its silence; or, when the partition caught it in a store request
    # that times out (a wait; others block until the link heals), by its exit
    assert "worker 1:1 failed (heartbeat stopped" in ev or "worker 1:1 failed (process" in ev, ev
    assert "ignoring worker 1:1 (incarnation 1)" in ev, ev
    assert "worker 1:1 is back (incarnation 2)" in ev, ev
    plans = out.result.summary.plans
    assert any([1, 1] in p["failed"] for p in plans), plans  # trained on without it
    assert not plans[-1]["failed"] and plans[-1]["incarnations"][1][1] == 2, plans
    assert out.result.summary.elastic["fenced_messages"] >= 2, out.result.summary.elastic
    log = open(tmp_path / "worker-1-1.log").read()
    assert "started (incarnation 2)" in log, log


@needs_hosts
@pytest.mark.hard_timeout(150)
def test_cut_between_two_stages_fences_one_end_and_the_rest_train_on(tmp_path, lab):
    """(c). Only the link between 0:0 (stage 0) and 0:1 (stage 1) is cut: both stay alive
    and connected to the store and to the other hosts. Every world of the same members
    fails (gloo connects every pair): the coordinator used to re-publish them forever. Now
    the members probe each other before a later version's rendezvous, both ends report the
    link down, and the coordinator fences one end (0:1, the tie broken by (replica, stage));
    the three others train on, exact."""
    out = cut_case(lab, str(tmp_path))
    assert out.exact, _why(out)
    assert "worker 0:1 failed (link down to worker(s) 0:0" in out.detect_line, out.detect_line
    assert [0, 1] in out.result.summary.plans[-1]["failed"], out.result.summary.plans
    assert not [e for e in out.events if "0:0 failed" in e], out.events
    log = open(tmp_path / "worker-0-1.log").read()
    assert "declared failed" in log and "stopping" in log, log


@needs_hosts
@pytest.mark.hard_timeout(150)
def test_slow_link_is_planned_around_as_a_straggler(tmp_path, lab):
    """(d). Worker 1:1's link at 400 kbit/s both ways (tc tbf) from iteration 2: its
    compute is as fast as ever, but its connections stay busy (the kernel's figure,
    link_meter.py), so it reports the link's time per micro-batch; the detector marks it
    slow and the next plan routes micro-batches away from it; exact."""
    out = slow_case(lab, str(tmp_path))
    assert out.exact, _why(out)
    assert "'1:1'" in out.detect_line, out.detect_line  # the worker behind the slow link
    assert not any(k in out.detect_line for k in ("'0:0'", "'0:1'", "'1:0'")), out.detect_line
    assert len(out.result.summary.plans) > 1, out.result.summary


@needs_hosts
@pytest.mark.hard_timeout(150)
def test_five_percent_packet_loss_trains_exact(tmp_path, lab):
    """(e). Every host drops 5% of the packets it sends and of those it receives (about
    10% of every packet between two hosts, 5% between a host and the store): TCP resends
    them, iterations slow down, the run stays exact."""
    out = loss_case(lab, str(tmp_path), iterations=8)
    assert out.exact, _why(out)


@needs_hosts
@pytest.mark.hard_timeout(170)
def test_torchrun_node_partitioned_is_fenced_and_restarted_by_torchrun_once_healed(tmp_path):
    """(a) + (b) through torchrun: node 1 (replica 1) on its own host is partitioned; its
    workers are declared failed by their heartbeats, the others train on. Healed, the fenced
    processes stop with EXIT_FENCED (they used to exit 0, and torchrun never restarted
    them; or, caught by the partition in a store request that times out, they die of it),
    node 1's agent restarts them and both come back; exact, both agents exit 0."""
    with Lab(2) as lab:
        out = torchrun_partition_case(lab, str(tmp_path))
    assert out.exact, _why(out)
    ev = "\n".join(out.events)
    for w in ("1:0", "1:1"):
        assert f"worker {w} is back (incarnation 2)" in ev, ev
    assert out.nodes == [0, 0], out.nodes
    down = [p for p in out.result.summary.plans if p["failed"] == [[1, 0], [1, 1]]]
    # the others trained on without node 1 (from iteration 0 again when the partition
    # caught a worker before its step of iteration 0 was final: a roll-back, still exact)
    assert down, out.result.summary.plans
    node1 = open(tmp_path / "node1.log").read()
    # its workers stopped fenced once healed (exit 5), or died of a store request that
    # timed out while cut off: either way torchrun restarted them (exit 0 it does not)
    assert "restart 1" in node1 and "gloo binds eth0" in node1, node1


# ---- the parts, without processes --------------------------------------------------------

def test_a_cut_link_fences_the_end_with_most_links_down_once_both_ends_say_so():
    from planner.control.cut_links import LinkReports
    live = [(0, 0), (0, 1), (1, 0), (1, 1)]
    links = LinkReports(gather_s=0.5, patience_s=6.0)
    links.suspect((0, 0), "(0, 0): world v1 rendezvous: link down to [(0, 1)] (no TCP", 10.0)
    assert links.pending and links.verdict(10.2, live) is None  # still gathering
    links.suspect((0, 1), "(0, 1): world v1 rendezvous: link down to [(0, 0)] (no TCP", 10.3)
    w, why = links.verdict(10.6, live)
    assert w == (0, 1) and "0:0" in why and not links.pending  # a tie: the higher slot
    # one side only (a probe lost to packet loss) is no cut link: forgotten in time
    links.suspect((1, 0), "link down to [(1, 1)]", 20.0)
    assert links.verdict(21.0, live) is None and links.pending
    assert links.verdict(26.5, live) is None and not links.pending
    # a host cut off from three peers while it reaches the store: it goes, not a peer
    for r in live[1:]:
        links.suspect(r, "link down to [(0, 0)]", 30.0)
    links.suspect((0, 0), "link down to [(0, 1), (1, 0), (1, 1)]", 30.1)
    assert links.verdict(31.0, live)[0] == (0, 0)
    links.suspect((0, 0), "v1 recv of micro-batch 0 from (0, 1): timed out", 40.0)
    assert not links.pending  # any other suspect says nothing of links


def test_probes_tell_a_link_down_from_a_peer_that_refuses_or_accepts():
    import socket

    from executor.runtime.transport.binding import unreachable
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen(4)
        closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
        peers = {"up": "127.0.0.1:%d" % listening.getsockname()[1],
                 "refuses": "127.0.0.1:%d" % closed.getsockname()[1],
                 "down": "192.0.2.123:9"}  # TEST-NET-1: nothing answers (or no route)
        assert unreachable(peers, 0.5) == ["down"]


def test_hosts_placement_is_read_whole_or_refused_in_one_line(tmp_path, monkeypatch):
    from executor.launch.faults.injector import check_faults, worker_hosts
    from planner.errors import UserError
    ns = tmp_path / "h0"
    ns.write_text("")
    assert worker_hosts(f"0:1={ns}, 1:0={ns}", 2, 2) == {(0, 1): str(ns), (1, 0): str(ns)}
    assert worker_hosts("", 2, 2) == {}
    for bad, says in ((f"0:1:{ns}", "expected REPLICA:STAGE=NETNS"),
                      (f"2:0={ns}", "no worker 2:0 in a 2x2 grid"),
                      ("0:0=no-such-host-ns", "no network namespace no-such-host-ns")):
        with pytest.raises(UserError, match=says):
            worker_hosts(bad, 2, 2)
    # a worker on another host may be failed by the network: its rejoin needs no --kill
    with pytest.raises(UserError, match="no --kill or --stall"):
        check_faults(2, 2, 5, rejoins=[(0, 1, 3)])
    monkeypatch.setenv("RECYCLE_HOSTS", f"0:1={ns}")
    with pytest.raises(UserError, match="set RECYCLE_STORE_ADDR"):
        check_faults(2, 2, 5, rejoins=[(0, 1, 3)])
    monkeypatch.setenv("RECYCLE_STORE_ADDR", "10.1.2.1")
    check_faults(2, 2, 5, rejoins=[(0, 1, 3)])
    monkeypatch.setenv("RECYCLE_HOSTS", "0:0=no-such-host-ns")  # as `recycle train` says it
    with pytest.raises(UserError, match="RECYCLE_HOSTS: worker 0:0: no network namespace"):
        check_faults(2, 2, 5)


def test_a_torchrun_worker_that_stops_while_the_run_goes_on_was_fenced():
    """executor.torchrun's exit: 0 only when the run is over (complete, halted, or its
    store gone), else EXIT_FENCED so that torchrun restarts it."""
    from executor import protocol as P
    from executor.runtime.transport.endpoints import host_store
    from executor.runtime.transport.rendezvous import publish_plan
    from executor.torchrun import run_over
    from planner.job import JobSpec
    from planner.solvers.backends import solve
    store = host_store("127.0.0.1", 0, 5.0)
    addr = f"127.0.0.1:{store.port}"
    store.set(P.CONFIG, '{"service": null}')
    plan = solve(JobSpec.uniform(2, 2, 2), [(1, 1)]).stamped(1, [[1, 1], [1, 1]])
    publish_plan(store, plan)
    assert not run_over(addr, wait_s=0.1)  # fenced: the run goes on without it
    publish_plan(store, plan.model_copy(update={"version": 2, "workers": []}))
    assert run_over(addr, wait_s=0.1)  # the final, empty plan: training complete
    store.delete_key(P.plan_key(2))
    store.add(P.PLAN_VERSION, -1)
    store.set(P.HALTED, "no plan")
    assert run_over(addr, wait_s=0.1)
    port = store.port
    del store
    assert run_over(f"127.0.0.1:{port}", wait_s=0.1)  # the coordinator closed its store


def test_gloo_binds_towards_the_store_only_where_it_would_bind_loopback(monkeypatch):
    from executor.runtime.transport import binding
    assert binding.route_interface("127.0.0.1") == "lo"
    before = os.environ.pop("GLOO_SOCKET_IFNAME", None)
    try:  # (bind_gloo_towards sets os.environ itself: restored by hand, not by monkeypatch)
        assert binding.bind_gloo_towards("127.0.0.1") is None  # a store on loopback
        monkeypatch.setattr(binding, "gloo_would_use_loopback", lambda: True)
        monkeypatch.setattr(binding, "route_interface", lambda host: "eth7")
        assert binding.bind_gloo_towards("192.0.2.1") == "eth7"
        assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"
        assert binding.bind_gloo_towards("192.0.2.1") is None  # set (by the user): it wins
        del os.environ["GLOO_SOCKET_IFNAME"]
        monkeypatch.setattr(binding, "gloo_would_use_loopback", lambda: False)
        assert binding.bind_gloo_towards("192.0.2.1") is None  # the hostname's address
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)
        if before is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = before
