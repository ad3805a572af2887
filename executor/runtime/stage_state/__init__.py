"""How a worker gets its stage's state when it enters a plan version: from a live holder of
the stage (a rejoin, a move), or from peer-memory snapshots with the whole job rolled back
(`entry_plan.py`, pure; `sync.py` carries it out)."""
