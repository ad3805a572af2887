"""Process lifetime, shared by the service's solver pool and the executor's workers.

Lives in planner/ because it is stdlib-only and both api/ and executor/ may import planner.
A SIGKILLed parent runs no cleanup code, so children must arrange their own death:
Linux's PR_SET_PDEATHSIG makes the kernel signal the child when its parent thread exits.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies. Returns False
    where that is not available (not Linux). Call it first thing in a child: if the
    parent is already gone (we were re-parented), exit at once."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent or parent == 1:  # the parent died before prctl took effect
        os._exit(1)
    return True


def watch_parent(interval_s: float = 0.5) -> None:
    """Exit (code 1) once this process's parent is gone, checked every interval_s in a
    daemon thread: the fallback where PR_SET_PDEATHSIG is not available or was set for a
    parent thread that has since exited (the kernel signals on the thread's exit)."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:  # re-parented: init or a subreaper adopted us
                os._exit(1)

    threading.Thread(target=watch, name="recycle-parent-watch", daemon=True).start()
