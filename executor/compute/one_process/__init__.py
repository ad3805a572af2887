"""Whole plans in one process: the in-memory executor of a plan (local.py) and the
ground-truth reference run every multi-process run is compared with (reference.py)."""
