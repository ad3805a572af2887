"""RECV and SEND steps (planner/lowering.py) over a plan version's World (comm.py)."""
from __future__ import annotations

from executor.runtime.transport import comm
from executor.runtime.transport.comm import World
from planner.lowering import BWD, FWD, Step

COMM_DIRECTION = {FWD: comm.FWD, BWD: comm.BWD}  # a step's direction as the World's tag


class WorldTransport:
    """RECV and SEND steps over the plan version's World (gloo/NCCL point-to-point)."""

    def __init__(self, world: World, it: int):
        self.world, self.it = world, it

    def recv(self, st: Step):
        fn = self.world.recv_activation if st.direction == FWD else self.world.recv_grad
        return fn(st.boundary, st.peer, self.it, st.microbatch)

    def send(self, st: Step, value) -> None:
        fn = self.world.send_activation if st.direction == FWD else self.world.send_grad
        fn(value, st.boundary, st.peer, self.it, st.microbatch)
