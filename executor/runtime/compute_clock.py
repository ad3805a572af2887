"""How long a worker's compute takes per micro-batch: the straggler detector's number
(planner/speeds.py), and the injected slowness of `--slow R:S@ITER:FACTOR`.

On CPU the number is the main thread's CPU time from an iteration's start to its
optimizer step, less the copy for rollback taken while idle (runtime/stepper.py), per
micro-batch: wall time would count the time other processes held the core (on a shared
machine every worker looked slow by turns); waiting costs no CPU time; per-iteration work
stays out (divided by fewer micro-batches it made a worker the plan had unloaded look
slower, and it never looked recovered). The clock is read twice an iteration: reading it
around every action, as the first version did, cost 8-30 us a call on this VM (a system
call), up to 0.45 ms an iteration.
On CUDA: the F, I and W actions' wall time after a synchronize.
An injected FACTOR really stretches each action to 1/FACTOR of its time (the worker
sleeps the rest), and the stretch counts as compute.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch


class ComputeClock:
    def __init__(self, device: torch.device, slows: Sequence[tuple[int, float]] = ()):
        self.cuda = device.type == "cuda"
        self.device = device
        self.slows = sorted((int(i), float(f)) for i, f in slows)
        self.slow = 1.0  # factor in force this iteration
        self._busy = 0.0  # CUDA: the actions' seconds (stretch included); CPU: the stretch
        self._cpu0 = 0.0  # CPU: the thread's clock when the iteration began
        self._step_began = 0.0

    def begin(self, it: int) -> None:
        self.slow = next((f for i, f in reversed(self.slows) if i <= it), 1.0)
        self._busy = 0.0
        if not self.cuda:
            self._cpu0 = time.thread_time()

    def timed(self, fn, *args):
        """Run one F, I or W."""
        if not self.cuda and self.slow == 1.0:
            return fn(*args)
        t0 = time.perf_counter()
        out = fn(*args)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        stretch = dt * (1.0 / self.slow - 1.0)
        if stretch > 0:
            time.sleep(stretch)
        self._busy += dt + stretch if self.cuda else stretch
        return out

    def step_begins(self) -> None:
        """The optimizer step starts: the iteration's compute ends here."""
        if not self.cuda:
            self._step_began = time.thread_time()

    def per_microbatch(self, microbatches: int, idle_cpu_s: float) -> float:
        """Seconds per micro-batch of this iteration (`idle_cpu_s`: CPU time the stepper's
        idle copy took meanwhile)."""
        n = max(1, microbatches)
        if self.cuda:
            return self._busy / n
        return (self._step_began - self._cpu0 - idle_cpu_s + self._busy) / n
