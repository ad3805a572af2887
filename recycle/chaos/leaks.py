"""Find and kill every process a chaos run left behind, by an environment tag.

Each run exports RECYCLE_CHAOS_TAG=<uuid> to what it starts; children inherit it whatever
session or process group they move to, so /proc/*/environ finds escapees that a kill of
the run's process group misses.
"""
from __future__ import annotations

import os
import signal
import time
import uuid

from planner.procs import DIE_WITH_PARENT

TAG_VAR = "RECYCLE_CHAOS_TAG"


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged_env(tag: str) -> dict[str, str]:
    """The environment of a command a chaos run starts: tagged, and told to leave when
    `recycle chaos` itself dies (planner/procs.py DIE_WITH_PARENT)."""
    return {**os.environ, TAG_VAR: tag, DIE_WITH_PARENT: "1"}


def tagged(tag: str, var: str = TAG_VAR) -> list[int]:
    """Live processes (not zombies) with var=tag in their environment; other users' are
    unreadable and skipped."""
    needle = f"{var}={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours
            continue
        if needle in env and not _zombie(int(name)):
            found.append(int(name))
    return found


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"{pid} {cmd[:160]}"


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_gone(tag: str, seconds: float) -> list[int]:
    """Give exiting processes a moment; returns those still there."""
    end = time.monotonic() + seconds
    while True:
        left = tagged(tag)
        if not left or time.monotonic() >= end:
            return left
        time.sleep(0.1)


def reap_leaks(tag: str, var: str = TAG_VAR) -> list[str]:
    """SIGKILL every process still carrying the tag; returns what each one was."""
    leaks = []
    for pid in tagged(tag, var):
        leaks.append(describe(pid))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return leaks
