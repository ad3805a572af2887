"""What a stage costs: F/I/W/OPT times and activation memory profiled into a job spec
(profile.py), and tensor bytes tracked op by op (memory.py)."""
