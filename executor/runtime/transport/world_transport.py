"""RECV and SEND steps (planner/lowering.py) over a plan version's World (comm.py)."""
from __future__ import annotations

from executor.runtime.replay.boundary_log import BWD as LOG_BWD, FWD as LOG_FWD
from executor.runtime.transport import comm
from executor.runtime.transport.comm import World
from planner.lowering import BWD, FWD, Step

COMM_DIRECTION = {FWD: comm.FWD, BWD: comm.BWD}  # a step's direction as the World's tag


class WorldTransport:
    """RECV and SEND steps over the plan version's World (gloo/NCCL point-to-point)."""

    def __init__(self, world: World, it: int, log=None):
        """log: the worker's BoundaryLog (runtime/replay/), kept what every SEND carried."""
        self.world, self.it, self.log = world, it, log

    def recv(self, st: Step):
        fn = self.world.recv_activation if st.direction == FWD else self.world.recv_grad
        return fn(st.boundary, st.peer, self.it, st.microbatch)

    def send(self, st: Step, value) -> None:
        fn = self.world.send_activation if st.direction == FWD else self.world.send_grad
        fn(value, st.boundary, st.peer, self.it, st.microbatch)
        if self.log is not None and self.log.on:
            self.log.keep(st.peer[1], LOG_FWD if st.direction == FWD else LOG_BWD, self.it,
                          st.microbatch, value)
