"""A worker's micro-batches: this iteration's, and the next one's loaded ahead on a thread.

Micro-batches depend only on (cfg, iteration, g), so a plan change or a rollback can make
one loaded ahead unused, never wrong."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional


class Batches:
    def __init__(self, load: Callable[[int, int], tuple], ahead: bool):
        self.load = load  # (iteration, g) -> (first-stage input, targets)
        self.ahead = ahead  # load the next iteration's on a thread (first and last stage)
        self._now: dict[int, object] = {}  # g -> batch or its Future, this iteration
        self._next: dict[tuple[int, int], Future] = {}
        self._pool: Optional[ThreadPoolExecutor] = None

    def begin(self, it: int, next_gs: Optional[list[int]]) -> None:
        """Iteration `it` starts; `next_gs`: the micro-batches this worker loads in it + 1."""
        self._now = {g: f for (i, g), f in self._next.items() if i == it}
        self._next.clear()
        if self.ahead and next_gs:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="recycle-loader")
            for g in next_gs:
                self._next[(it + 1, g)] = self._pool.submit(self.load, it + 1, g)

    def get(self, it: int, g: int):
        got = self._now.get(g)
        if got is None:
            got = self._now[g] = self.load(it, g)
        elif isinstance(got, Future):  # loaded ahead (usually done by now)
            got = self._now[g] = got.result()
        return got

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
