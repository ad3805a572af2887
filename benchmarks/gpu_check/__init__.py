"""The prepared check of the CUDA path on one GPU (project issue 36, item 1): see
__main__.py for the command, docs/gpu.md for what it measures."""
