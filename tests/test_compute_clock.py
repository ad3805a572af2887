"""The worker's compute clock (executor/runtime/steps/compute_clock.py): on CPU the thread's CPU
time per micro-batch; on CUDA events per action, read only when done, never a synchronize
per action. The CUDA bookkeeping is checked on CPU with stand-in events whose completion
the test controls (the clock's own logic runs unchanged); the `gpu` test runs the real
thing and skips without CUDA."""
from __future__ import annotations

import time

import pytest
import torch

from executor.runtime.steps.compute_clock import ComputeClock


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_cpu_figure_is_thread_time_per_microbatch():
    clock = ComputeClock(torch.device("cpu"))
    clock.begin(0)
    for _ in range(4):
        clock.timed(_spin, 0.01)
    time.sleep(0.05)  # waiting is not compute
    clock.step_begins()
    per = clock.per_microbatch(4, 0.0)
    assert 0.009 <= per <= 0.02


def test_cpu_injected_slowness_stretches_and_counts():
    clock = ComputeClock(torch.device("cpu"), slows=[(1, 0.5)])
    clock.begin(1)
    t0 = time.perf_counter()
    clock.timed(_spin, 0.02)
    assert time.perf_counter() - t0 >= 0.039  # stretched to 1/0.5 of its time
    clock.step_begins()
    assert clock.per_microbatch(1, 0.0) >= 0.039


class _Event:
    """Stands in for torch.cuda.Event: records a host time; `done` is set by the test
    (the GPU finishing); synchronize() is counted (the clock must not call it)."""
    waits = 0

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t, self.done = None, False

    def record(self, stream=None):
        self.t = time.perf_counter()

    def query(self):
        return self.done

    def synchronize(self):
        _Event.waits += 1
        self.done = True

    def elapsed_time(self, other):
        # CUDA raises unless both are done; an end done means its start is (one stream)
        assert other.done, "elapsed_time of an event not done (would raise)"
        return (other.t - self.t) * 1e3


@pytest.fixture
def fake_cuda(monkeypatch):
    made: list = []

    def event(enable_timing=False):
        e = _Event(enable_timing)
        made.append(e)
        return e

    def no_sync(*a, **k):
        raise AssertionError("torch.cuda.synchronize called by the compute clock")

    monkeypatch.setattr(torch.cuda, "Event", event)
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    _Event.waits = 0
    return made


def _iteration(clock, it, actions, seconds):
    clock.begin(it)
    for _ in range(actions):
        clock.timed(time.sleep, seconds)
    clock.step_begins()
    return clock.per_microbatch(actions, 0.0)


def test_cuda_events_are_read_when_done_never_waited_for(fake_cuda):
    clock = ComputeClock(torch.device("cuda"))
    # iteration 0 ends with its events still queued: no figure yet, and no wait
    assert _iteration(clock, 0, 3, 0.004) == 0.0
    assert clock.resolved_it == -1 and _Event.waits == 0
    assert len(fake_cuda) == 6  # a start and an end event per action
    for e in fake_cuda:
        e.done = True  # the GPU caught up meanwhile
    made_before = len(fake_cuda)
    per = _iteration(clock, 1, 2, 0.002)  # iteration 1 itself is still queued
    assert clock.resolved_it == 0 and 0.0035 <= per <= 0.02  # iteration 0's figure
    for e in fake_cuda[made_before:]:
        e.done = True
    per = _iteration(clock, 2, 2, 0.002)
    assert clock.resolved_it == 1 and 0.0015 <= per <= 0.02
    assert _Event.waits == 0


def test_cuda_partly_done_iteration_is_not_read(fake_cuda):
    clock = ComputeClock(torch.device("cuda"))
    _iteration(clock, 0, 2, 0.0)
    for e in fake_cuda[:2]:  # the first action done, the second not
        e.done = True
    _iteration(clock, 1, 1, 0.0)
    assert clock.resolved_it == -1  # elapsed_time of the second would have raised


def test_cuda_injected_slowness_waits_only_for_its_own_action(fake_cuda):
    clock = ComputeClock(torch.device("cuda"), slows=[(0, 0.5)])
    clock.begin(0)
    t0 = time.perf_counter()
    clock.timed(time.sleep, 0.01)
    assert _Event.waits == 1  # the end event of that action, not the device
    assert time.perf_counter() - t0 >= 0.019


@pytest.mark.gpu
def test_cuda_clock_on_a_device(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dev = torch.device("cuda")

    def no_sync(*a, **k):
        raise AssertionError("torch.cuda.synchronize called by the compute clock")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    clock = ComputeClock(dev)
    a = torch.randn(2048, 2048, device=dev)
    figures = []
    for it in range(4):
        clock.begin(it)
        for _ in range(3):
            clock.timed(torch.mm, a, a)
        clock.step_begins()
        figures.append(clock.per_microbatch(3, 0.0))
    monkeypatch.undo()
    torch.cuda.synchronize(dev)
    figures.append(_iteration(clock, 4, 1, 0.0))  # everything before is done by now
    assert clock.resolved_it >= 3 and figures[-1] > 0.0
