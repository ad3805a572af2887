"""What the coordinator does with each message a worker sends through the store's mailbox
(rendezvous.py Mailbox): a handler per message type (executor/protocol.py), looked up in
HANDLERS. `Bye` is read only at the end (ending.py); any other is ignored."""
from __future__ import annotations

import socket

from executor import protocol as P
from executor.protocol import wkey


def on_mid(c, w, m: P.Mid) -> None:
    """Halfway through an iteration's actions: where --kill/--stall faults strike."""
    pid = c.processes.pid(w)
    if pid is None and c.external and m.pid:  # a torchrun'd worker: signal it if it runs here
        if m.host == socket.gethostname():
            pid = m.pid
        elif c.faults.due(w, m.it):
            c.event(f"cannot signal worker {wkey(w)} on host {m.host} from "
                    f"{socket.gethostname()}: fault at iteration {m.it} skipped")
            c.faults.drop(w, m.it)
    if pid is not None and c.faults.mid(w, m.it, pid):
        t = max(row[0] for row in c.faults.log if row[2] == "kill")
        c.record.killed(w, m.it, t)
        if w not in c.processes.procs and w not in c.failed:  # torchrun'd: no exit to poll, and
            c.died(w, "SIGKILLed by the coordinator")  # the kill is sure
    if m.wait:
        c.store.set(P.go_key(w, m.inc, m.it), "1")


def on_done(c, w, m: P.Done) -> None:
    """An iteration completed: its losses, the compute time, the last checksum."""
    if m.sync:
        c.record.entered(m.at, w, m.inc, m.v, m.it + 1)
    slot = tuple(m.slot or w)  # the slot it fills (a plan's roles may move it)
    # measured speeds are of the job's own grid: after a change of shape the slots are
    # another grid's, and the detector waits (a shaped plan is made for nominal speeds)
    if (m.compute and c.detector is not None and m.v == c.version
            and c.plans.plan.partition is None):
        c.detector.observe(slot[0], slot[1], m.compute, m.it)  # paired by iteration
    c.progress.completed(w, m.it, m.v)
    if m.losses:
        c.record.trained_with(m.it, m.v)
        c.end.losses.add(m.it, m.losses)
    if m.it == c.iterations - 1:
        c.end.final(slot[1], m.v, m.checksum, m.base_checksums)
        if m.snap_bytes is not None:  # the host memory its snapshots hold, and K in force
            c.snapshots.final(w, m.snap_every, m.snap_bytes, m.log_bytes)
    c.snapshots.look(c.store)
    if c.snapshots.choice is not None and c.service is None:  # (the service's: its own)
        c.plans.snapshots_chosen(c.snapshots.choice.every)


def on_replayed(c, w, m: P.Replayed) -> None:
    """A stage lost whole was replayed from the boundary logs: counted, said, and the
    losses of the iterations its dead workers never reported filled in."""
    c.record.replayed(m.v, m.stage, m.first, m.last, m.seconds, m.workers)
    c.event(f"plan v{m.v}: stage {m.stage} replayed iterations {m.first}..{m.last} from the "
            f"boundary logs on {m.workers} worker(s) in {m.seconds:.3f} s; the other stages "
            f"kept their work")
    for it, losses in (m.losses or {}).items():
        if not c.end.losses.complete(int(it)):
            c.end.losses.add(int(it), losses)


def on_rolled_back(c, w, m: P.RolledBack) -> None:
    """A stage lost whole could not be replayed: every stage went back to a snapshot."""
    c.record.rolled_back(m.v, m.to, m.why, m.tier, m.again)
    c.event(f"plan v{m.v}: the job rolled back to iteration {m.to} from {m.tier}, "
            f"{m.again} iteration(s) to train again ({m.why})")


def on_fatal(c, w, m: P.Fatal) -> None:
    """The model itself is wrong (an activation spec broken, or its code raised)."""
    if c.fatal is None:  # the model's own exception comes with the worker's log
        c.fatal = f"worker {wkey(w)}: {m.reason}" + (
            f"; traceback in {m.log}" if m.log else "")
        c.model_exception = m.error == "exception"


def on_suspect(c, w, m: P.Suspect) -> None:
    """A peer's comm op failed under version v: resync if nobody dies (launcher tick)."""
    c.plans.suspected(m.v)


def on_ready(c, w, m: P.Ready) -> None:
    """A newer process of w asks in: its predecessor is dead (or w was failed)."""
    if c.service is not None or m.inc <= c.plans.members.incarnation(w):
        return  # the service admits it / a stale message
    if w not in c.failed:  # (torchrun restarted it) that death is news: a failure first
        c.died(w, f"a new process, incarnation {m.inc}, replaced it")
    c.admission.ask(w, m.inc)


def on_halt(c, w, m: P.NoCopyLeft) -> None:
    """A worker found no live copy of some stage's state: no plan can go on."""
    if c.no_copy is None:
        c.no_copy = f"worker {wkey(w)}: {m.reason}"


HANDLERS = {P.NoCopyLeft: on_halt, P.Mid: on_mid, P.Done: on_done, P.Fatal: on_fatal,
            P.Suspect: on_suspect, P.Ready: on_ready, P.Replayed: on_replayed,
            P.RolledBack: on_rolled_back}
