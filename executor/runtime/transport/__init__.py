"""How a worker talks: the store (plans, the mailbox, heartbeats: rendezvous.py), one
world of gloo/NCCL groups per plan version (comm.py, world_transport.py, wire.py), and
the one wait primitive every blocking loop uses (waiting.py)."""
