"""Faults a run is asked to suffer and survive: injected kills and stalls (injector.py),
workers brought back (rejoins.py), and a real spot trace replayed (trace_replay.py)."""
