"""One interpreter for a worker's lowered steps (planner/lowering.py): a handler per op.

The distributed worker loop (worker_loop.py) and the single-process executor (compute/one_process/local.py) run the
same steps through the same compute handlers (`StageSteps`: F, I, B, W, and the RECV/SEND
that feed and drain them); only the transport differs: a World of real processes, or an
in-memory channel. ALLREDUCE and OPT are theirs too (the agent sums over gloo/NCCL and
reports, the local runner sums in memory). Fault injection is one more handler, on a step
the agent inserts mid-iteration (`with_fault_point`).
"""
from __future__ import annotations

from typing import Callable, Hashable, Mapping, Optional, Protocol, Sequence

from planner.lowering import BWD, FWD, Op, Step

Handler = Callable[[Step], None]
FAULT = "FAULT"  # the op of the injection point: not a plan's, the executor's own


class Transport(Protocol):
    def recv(self, step: Step): ...

    def send(self, step: Step, value) -> None: ...


def with_fault_point(steps: Sequence[Step]) -> list[Step]:
    """The steps with a FAULT step before the first step of the middle plan action (where
    an injected --kill/--stall lands: mid-iteration, with compute done and to do)."""
    last = max((st.index for st in steps), default=-1)
    half = (last + 1) // 2
    at = next((k for k, st in enumerate(steps) if st.index >= half), len(steps))
    return [*steps[:at], Step(FAULT, index=half), *steps[at:]]


def run_steps(steps: Sequence[Step], table: Mapping[Hashable, Handler],
              before: Optional[Callable[[int], None]] = None) -> None:
    """Run `steps` in order: `before(k)` ahead of step k (e.g. post early receives)."""
    for k, st in enumerate(steps):
        if before is not None:
            before(k)
        table[st.op](st)


class StageSteps:
    """The compute of one worker's steps for one iteration: F, I, B and W on its
    StageCompute, inputs from RECV steps (or the data), outputs to SEND steps."""

    def __init__(self, compute, stage: int, stages: int, batch: Callable[[int], tuple],
                 transport: Transport, call: Callable = lambda what, g, fn, *a: fn(*a)):
        self.compute, self.s, self.S = compute, stage, stages
        self.batch, self.transport, self.call = batch, transport, call
        self.inbox: dict = {}   # (direction, g) -> what a RECV brought
        self.outbox: dict = {}  # (direction, g) -> what a SEND takes

    def table(self) -> dict:
        return {Op.RECV: self.recv, Op.SEND: self.send, Op.F: self.forward,
                Op.I: self.backward, Op.B: self.backward, Op.W: self.weight}

    def recv(self, st: Step) -> None:
        self.inbox[(st.direction, st.microbatch)] = self.transport.recv(st)

    def send(self, st: Step) -> None:
        self.transport.send(st, self.outbox.pop((st.direction, st.microbatch)))

    def forward(self, st: Step) -> None:
        g, last = st.microbatch, self.s == self.S - 1
        x = self.batch(g)[0] if self.s == 0 else self.inbox.pop((FWD, g))
        targets = self.batch(g)[1] if last else None
        out = self.call("forward", g, self.compute.forward, g, x, targets)
        if not last:
            self.outbox[(FWD, g)] = out

    def backward(self, st: Step) -> None:
        g = st.microbatch
        grad = None if self.s == self.S - 1 else self.inbox.pop((BWD, g))
        fn = self.compute.backward_input if st.op is Op.I else self.compute.backward_full
        gx = self.call("backward", g, fn, g, grad)
        if self.s > 0:
            self.outbox[(BWD, g)] = gx

    def weight(self, st: Step) -> None:
        self.call("weight gradients", st.microbatch, self.compute.backward_weight, st.microbatch)
