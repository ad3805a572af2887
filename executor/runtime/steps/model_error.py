"""The model's own code raised: not a worker failure a plan can route around."""
from __future__ import annotations

import os
import traceback
from typing import Optional


class ModelError(Exception):
    """The model's own code (its forward, loss, backward or data) raised: the same code
    runs on every replica, so no plan can route around it; the run halts naming it."""

    def traceback_text(self) -> str:
        """The model's exception with its traceback (for the worker's log)."""
        return "".join(traceback.format_exception(self.__cause__)).rstrip()

    def one_line(self) -> str:
        """What the coordinator prints: the exception's last line and where it came."""
        last = traceback.format_exception_only(self.__cause__)[-1].strip()
        return f"the model raised {last} ({self})"


def own_log() -> Optional[str]:
    """The file this process's output goes to (the worker's log), if it is a file."""
    try:
        path = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    return path if os.path.isfile(path) else None
