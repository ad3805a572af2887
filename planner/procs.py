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


# Set by a command that starts `recycle` commands in sessions of their own (`recycle chaos`):
# a SIGKILLed parent runs no cleanup and its kill of their process groups never comes,
# so each such command leaves once it has been re-parented (recycle/cli.py main).
DIE_WITH_PARENT = "RECYCLE_DIE_WITH_PARENT"


def die_with(pid: int) -> None:
    """Exit (code 1) once process `pid` has ended, watched from a daemon thread: for a
    child whose parent is not the process it serves (a worker forked by a forkserver
    lives and dies with the coordinator, not with the server that forked it). A pidfd
    where the kernel has them (woken by the exit itself, never fooled by a reused pid),
    else a poll every half second."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)  # gone already
    except (AttributeError, OSError):
        fd = None

    def watch():
        if fd is not None:
            import select
            select.select([fd], [], [])  # readable once the process has exited
            os._exit(1)
        while True:
            time.sleep(0.5)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass

    threading.Thread(target=watch, name="recycle-pid-watch", daemon=True).start()
