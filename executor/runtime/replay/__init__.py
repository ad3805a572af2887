"""Replay of a stage lost whole (SWIFT's logging and replay; docs/executor.md, "Replay of
a lost stage"): instead of rolling every stage back to a snapshot, the lost stage alone is
rebuilt from its snapshot and the boundary messages its neighbours logged since.

  boundary_log.BoundaryLog  what a worker sent across stage boundaries, in host memory
  replay_plan               pure: whether the logs cover a replay, and who sends what
  replayer                  carrying one out when a version is entered
"""
from executor.runtime.replay.boundary_log import BWD, FWD, BoundaryLog

__all__ = ["BoundaryLog", "FWD", "BWD"]
