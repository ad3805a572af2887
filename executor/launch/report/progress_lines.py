"""The coordinator's progress output: a line per completed iteration, at most one per
`every_s` (rendering one with rich cost the coordinator 1 ms of CPU, also on a quiet
console, taken from the workers on a host they fill), and always the first and the last
iteration and the first under a new plan. tok/s is over the iterations since the line
before."""
from __future__ import annotations

import time

from rich.console import Console


class ProgressLines:
    def __init__(self, console: Console, tokens_per_iteration: int, start: int, last: int,
                 every_s: float = 0.25):
        self.console, self.tokens, self.last, self.every_s = console, tokens_per_iteration, last, every_s
        self._at, self._it, self._plan = float("-inf"), start - 1, None  # the last line's
        self._since = time.monotonic()

    def completed(self, it: int, loss: float, version: int, failed, now: float) -> None:
        plan = (version, sorted(failed))
        if now - self._at < self.every_s and it < self.last and plan == self._plan:
            return
        tok = self.tokens * (it - self._it) / max(now - self._since, 1e-9)
        self._at, self._it, self._plan, self._since = now, it, plan, now
        self.console.print(f"iter {it:>4}  loss {loss:.5f}  {tok:>9,.0f} tok/s  plan v{version}  "
                           f"failed {plan[1] or '-'}")
