"""How long a worker's compute takes per micro-batch: the straggler detector's number
(planner/speeds.py), and the injected slowness of `--slow R:S@ITER:FACTOR`.

On CPU the number is the main thread's CPU time from an iteration's start to its
optimizer step, less the copy for rollback taken while idle (runtime/steps/stepper.py), per
micro-batch: wall time would count the time other processes held the core (on a shared
machine every worker looked slow by turns); waiting costs no CPU time; per-iteration work
stays out (divided by fewer micro-batches it made a worker the plan had unloaded look
slower, and it never looked recovered). The clock is read twice an iteration: reading it
around every action, as the first version did, cost 8-30 us a call on this VM (a system
call), up to 0.45 ms an iteration.

On CUDA the host runs ahead of the GPU, so host time says nothing about compute, and a
synchronize around each action (the first version) drained the GPU's queue before every
F, I and W: the next action's kernels could no longer be queued while the current ones
ran. Instead each action is bracketed by two CUDA events recorded on the current stream
(no wait), and an iteration's events are read when they have completed: `per_microbatch`
at the end of an iteration only asks the events (cudaEventQuery, no wait) and returns the
newest iteration whose events are all done -- in steady state the previous one, since
the optimizer step and the all-reduce of this one may still be queued. Until one is
done it returns 0.0, which the launcher does not report (it skips a falsy figure).
The GPU time between an action's events is what the action took on the device, gaps
where the GPU waited on the host included (a host-bound worker is a slow worker too).

An injected FACTOR really stretches each action to 1/FACTOR of its time (the worker
sleeps the rest), and the stretch counts as compute. To know the action's time the
worker waits for its end event -- only under an injected slowness, which exists to make
the worker slow (tests and benchmarks), never in a normal run.
"""
from __future__ import annotations

import collections
import time
from typing import Sequence

import torch


class ComputeClock:
    def __init__(self, device: torch.device, slows: Sequence[tuple[int, float]] = ()):
        self.cuda = device.type == "cuda"
        self.device = device
        self.slows = sorted((int(i), float(f)) for i, f in slows)
        self.slow = 1.0  # factor in force this iteration
        self._stretch = 0.0  # seconds slept this iteration to stretch actions
        self._cpu0 = 0.0  # CPU: the thread's clock when the iteration began
        self._step_began = 0.0
        # CUDA: this iteration's (start, end) event pairs, then per ended iteration
        # (pairs, micro-batches, stretch) until its events are done
        self._pairs: list = []
        self._unread: collections.deque = collections.deque()
        self._last = 0.0  # CUDA: the newest resolved figure (s per micro-batch)
        self.resolved_it = -1  # CUDA: the iteration that figure is of (-1: none yet)
        self._it = -1

    def begin(self, it: int) -> None:
        self.slow = next((f for i, f in reversed(self.slows) if i <= it), 1.0)
        self._stretch = 0.0
        self._it = it
        if self.cuda:
            self._pairs = []
        else:
            self._cpu0 = time.thread_time()

    def timed(self, fn, *args):
        """Run one F, I or W."""
        if not self.cuda:
            if self.slow == 1.0:
                return fn(*args)
            t0 = time.perf_counter()
            out = fn(*args)
            self._sleep_stretch(time.perf_counter() - t0)
            return out
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(*args)
        end.record()
        self._pairs.append((start, end))
        if self.slow != 1.0:  # injected slowness only: see the module docstring
            end.synchronize()
            self._sleep_stretch(start.elapsed_time(end) / 1e3)
        return out

    def _sleep_stretch(self, dt: float) -> None:
        stretch = dt * (1.0 / self.slow - 1.0)
        if stretch > 0:
            time.sleep(stretch)
            self._stretch += stretch

    def step_begins(self) -> None:
        """The optimizer step starts: the iteration's compute ends here."""
        if not self.cuda:
            self._step_began = time.thread_time()

    def per_microbatch(self, microbatches: int, idle_cpu_s: float) -> float:
        """Seconds per micro-batch (`idle_cpu_s`: CPU time the stepper's idle copy took
        meanwhile). CPU: of this iteration. CUDA: of the newest iteration whose events
        are done (`resolved_it`), 0.0 if none is yet; it never waits."""
        n = max(1, microbatches)
        if not self.cuda:
            return (self._step_began - self._cpu0 - idle_cpu_s + self._stretch) / n
        self._unread.append((self._it, self._pairs, n, self._stretch))
        self._pairs = []
        self._resolve()
        return self._last

    def _resolve(self) -> None:
        """Read every ended iteration whose events are all done, oldest first (a stream's
        events complete in order: the first not done stops the reading)."""
        while self._unread:
            it, pairs, n, stretch = self._unread[0]
            if pairs and not pairs[-1][1].query():
                return
            self._unread.popleft()
            gpu_s = sum(s.elapsed_time(e) for s, e in pairs) / 1e3
            self._last, self.resolved_it = (gpu_s + stretch) / n, it
