"""The backward pass split into input-gradient (I) and weight-gradient (W) work
(split_backward.py, direct_w.py), and activation checkpointing's recomputation, done once
in I (recompute.py)."""
