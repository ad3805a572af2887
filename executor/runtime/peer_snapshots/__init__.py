"""Peer-memory snapshots (docs/executor.md, "Peer-memory snapshots"): every stage's state
also kept in the host memory of a worker elsewhere, refreshed every K iterations off the
critical path, so a stage whose live workers all die can be restored, exactly, without a
disk.

  sender.PeerSnapshots  a worker's side: its SnapshotHost, its local copies, offer()
  host.SnapshotHost     the server keeping other stages' snapshots (newest two each)
  local.LocalCopies     this worker's own stage at its snapshot iterations
  client                fetch / held_by / inventory / forget / common_iteration
  wire                  the format (JSON header + raw tensor bytes) and deadlines
"""
from executor.runtime.peer_snapshots.client import (address_of, common_iteration, fetch,
                                                    forget, held_by, inventory, where_held)
from executor.runtime.peer_snapshots.host import SnapshotHost
from executor.runtime.peer_snapshots.local import HostCopy, LocalCopies
from executor.runtime.peer_snapshots.sender import DONE_KEY, PeerSnapshots
from executor.runtime.peer_snapshots.wire import SnapshotError

__all__ = ["PeerSnapshots", "SnapshotHost", "LocalCopies", "HostCopy", "SnapshotError",
           "fetch", "held_by", "inventory", "forget", "common_iteration", "where_held",
           "address_of", "DONE_KEY"]
