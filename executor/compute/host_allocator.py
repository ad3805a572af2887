"""A worker's host memory kept mapped between micro-batches (glibc's malloc).

A worker allocates the same buffers every micro-batch: activations, the gradients I
captures for W, W's intermediates. glibc gives a freed chunk above its mmap threshold
back to the kernel at once (munmap) and trims the heap's top past 128 KiB, so the next
micro-batch faults those pages in again, zeroed by the kernel: 100-500 minor page faults
per micro-batch on GPT's stages, fused B and the I/W split alike, 0-9 with this setting
(benchmarks/results/split_backward.md; fused B and the split each ran 3-5% faster, their
ratio within the runs' spread; docs/executor.md, "Counted, not timed"). Keeping freed
memory mapped is what torch's caching allocator does for CUDA memory; on the host it is
two mallopt settings:
chunks up to MMAP_THRESHOLD come from the heap, and the heap keeps up to TRIM_THRESHOLD
of free memory at its top. The worker's resident memory then stays at its high-water
mark, which it reaches every iteration anyway.

`RECYCLE_HOST_ALLOCATOR=system` leaves glibc's defaults (the benchmarks' ablation).
Elsewhere than glibc (musl, macOS) nothing is changed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
# Both as measured (MALLOC_MMAP_THRESHOLD_ = MALLOC_TRIM_THRESHOLD_ = 1 GiB): a chunk
# larger than that (a large model's embedding gradient) is still mapped for itself.
MMAP_THRESHOLD = TRIM_THRESHOLD = 1 << 30
ENV = "RECYCLE_HOST_ALLOCATOR"


def keep_freed_memory() -> bool:
    """Set glibc to keep freed memory mapped in this process; True if it now does."""
    if os.environ.get(ENV, "keep") == "system":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success, 0 for a value it refuses
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
