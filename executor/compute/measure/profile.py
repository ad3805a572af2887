"""Measure a job's real per-stage costs and memory, and write them as a planner JobSpec.

Per stage: F, I, W (median over `repeats`, after a warm-up) in microseconds, OPT = the
measured AdamW step plus a ring all-reduce estimate over `replicas` peers, and the
activation memory of one micro-batch in bytes: the larger of what its F saves for
backward and what its weight-gradient store keeps from I to W (distinct storages,
parameters excluded), i.e. what the planner charges from F's start to W's end.
Point-to-point delays and the all-reduce are estimates from bandwidths (one process
cannot measure the network); pass the numbers of your cluster.

Noise: on CPU the profile runs on the workers' thread count (RECYCLE_THREADS, default 1)
and, with one thread, times by the thread's CPU time (as the workers' straggler clock
does): wall time counted whatever else held the core, and swung 100x with machine load.
Every figure is the median of `repeats` rounds after a warm-up; `spread` is
(max - min) / median over those rounds, reported next to it. On CUDA: the GPU time between
two events recorded around each action, read after the rounds (no synchronize per
action). Memory is measured on every device: on CPU each worker's capacity is the
machine's memory shared by the `replicas x stages` workers (or --memory-budget).
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Optional

import torch
from torch import Tensor

from executor.compute.config import TrainingSettings
from executor.compute.model import DEFAULT_WORKLOAD, ModelConfig, Workload
from executor.compute.measure.memory import PeakBytes
from executor.compute.stage import StageCompute
from planner.job import Cost, JobSpec, Memory, P2P


def clock_for(device: torch.device):
    """The thread's CPU time on one CPU thread (blind to other processes' load), else wall."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


class _Timer:
    """One action's time. CPU: the clock around it. CUDA: two events recorded around it on
    the stream, read (`us`) only after the round: a synchronize around every action drained
    the GPU's queue between actions, and the host's clock measured launches, not work."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.clock = clock_for(device)

    def __enter__(self):
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = self.clock()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
        else:
            self._us = (self.clock() - self.t0) * 1e6

    @property
    def us(self) -> float:
        if self.cuda:
            self.end.synchronize()  # done already when read after the round
            return self.start.elapsed_time(self.end) * 1e3
        return self._us


def machine_memory() -> int:
    """Physical memory of this machine in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def spread(values: list) -> float:
    """(max - min) / median: how much the rounds disagree."""
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else 0.0


def _saved_bytes(fn, exclude: set[int]) -> int:
    """Bytes of distinct storages autograd saves for backward while fn runs, less those
    whose storage pointer is in exclude (the parameters': torch.nn.Linear saves its weight
    as a transposed view, a different tensor on the same storage)."""
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in exclude:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def _call(module, x):
    """A stage on its input activation (a tuple: positional arguments)."""
    return module(*x) if isinstance(x, tuple) else module(x)


def _floats(out) -> list:
    return [t for t in (out if isinstance(out, tuple) else (out,)) if t.is_floating_point()]


def _leaves(x):
    """The input activation with its floating tensors as fresh leaves needing gradients."""
    leaf = lambda t: t.detach().requires_grad_(True) if t.is_floating_point() else t
    return tuple(leaf(t) for t in x) if isinstance(x, tuple) else leaf(x)


def measure_stage(cfg: ModelConfig, stage: int, stages: int, *, device: str = "cpu",
                  repeats: int = 5, workload: Workload = DEFAULT_WORKLOAD,
                  inputs: Optional[Tensor] = None,
                  training: TrainingSettings = TrainingSettings()) -> dict:
    """Timings (us) of F, I, W, the fused B, a native full backward and the AdamW step of
    one micro-batch on `stage`, plus its activation, output and parameter bytes. inputs:
    the stage's input activation (default: the earlier stages run on micro-batch 0)."""
    dev = torch.device(device)
    wl = workload
    tokens, targets = wl.microbatch(cfg, 0, 0)
    tokens, targets = tokens.to(dev), targets.to(dev)
    x = tokens if inputs is None else inputs
    with torch.no_grad():  # a real input activation: run the earlier stages once
        for s in range(stage if inputs is None else 0):
            x = _call(wl.build_stage(cfg, s, stages).to(dev), x)
    module = wl.build_stage(cfg, stage, stages).to(dev)
    first, last = stage == 0, stage == stages - 1
    comp = StageCompute(module, first, last, 1.0, loss_fn=wl.loss_fn, stage=stage,
                        seed=cfg.seed, checkpointing=training.activation_checkpointing)
    opt = wl.make_optimizer(training, module.parameters())
    params = {id(p) for p in module.parameters()}
    grad = None
    if not last:
        with torch.no_grad():
            out = _call(module, x)
        gen = torch.Generator().manual_seed(1)
        # the gradient message: one per floating output (a tuple may carry ids too)
        grads = [torch.randn(o.shape, generator=gen).to(dev, o.dtype)
                 for o in (out if isinstance(out, tuple) else (out,)) if o.is_floating_point()]
        grad = grads[0] if isinstance(out, Tensor) else tuple(grads)
    t = {k: [] for k in ("F", "I", "W", "B", "native_backward", "OPT")}
    act = store = held_f = peak = 0
    for r in range(repeats + 1):
        keep = r > 0  # the first round warms up kernels and allocators
        comp.track_memory = not keep  # memory on the warm-up round: no hooks in timed ones
        tracker = PeakBytes() if not keep else None  # every byte F, I and W allocate
        if tracker is not None:
            tracker.__enter__()
        with _Timer(dev) as tm:
            comp.forward(0, x, targets)
        t["F"].append(tm)
        if not keep:
            held_f = comp.held_bytes(0)  # what it keeps from F to I (checkpointing: inputs)
        with _Timer(dev) as tm:
            comp.backward_input(0, grad)
        t["I"].append(tm)
        if not keep:
            store = comp.held_bytes(0)  # what the micro-batch keeps from I to W
        with _Timer(dev) as tm:
            comp.backward_weight(0)
        t["W"].append(tm)
        if tracker is not None:
            tracker.__exit__(None, None, None)
            peak = tracker.peak_without(p.grad for p in module.parameters())
        with _Timer(dev) as tm:
            opt.step()
        t["OPT"].append(tm)
        comp.zero_grad()
        comp.forward(0, x, targets)
        with _Timer(dev) as tm:
            comp.backward_full(0, grad)
        t["B"].append(tm)
        comp.zero_grad()
        # native autograd (no deferral) as the yardstick for "W is not a second backward"
        xin = x if first else _leaves(x)
        root = None

        def fwd():
            nonlocal root
            out = _call(module, xin)
            root = wl.loss_fn(out, targets) if last else _floats(out)
        act = _saved_bytes(fwd, {p.untyped_storage().data_ptr() for p in module.parameters()})
        with _Timer(dev) as tm:
            torch.autograd.backward(root, None if last else _floats(grad))
        t["native_backward"].append(tm)
        comp.zero_grad()
        if not keep:
            for v in t.values():
                v.clear()
    comp.reset()
    t = {k: [tm.us for tm in v] for k, v in t.items()}  # CUDA: the events, read now
    res = {k: statistics.median(v) for k, v in t.items()}
    res["spread"] = {k: round(spread(v), 3) for k, v in t.items()}
    res["rounds"] = repeats
    # What a micro-batch holds from F's start to W's end, the planner's charge: the larger
    # of what F saves and what is kept from I to W. Under activation checkpointing F keeps
    # only the recomputed layers' inputs, and recompute.trim leaves W only what it reads.
    # While it computes, a micro-batch takes more: gradients in flight, temporaries, and
    # under checkpointing its layers recomputed in I. `workspace_bytes`, the most it took
    # above its charge (tensor bytes tracked op by op, its parameter gradients left out:
    # they are state), is kept free on every worker: one micro-batch computes at a time.
    ckpt = comp.units.policy.on
    charge = max(held_f, store) if ckpt else max(act, store)
    res.update(activation_bytes=charge, saved_bytes=act, store_bytes=store,
               held_after_f=held_f, workspace_bytes=max(0, peak - charge),
               output_bytes=0 if last else sum(g.numel() * g.element_size()
                                               for g in _floats(grad)),
               param_bytes=sum(p.numel() * p.element_size() for p in module.parameters()))
    return res


def profile(cfg: ModelConfig, stages: int, replicas: int, microbatches: int,
            device: str = "cpu", repeats: int = 5, *, memory_budget: Optional[int] = None,
            intra_gbps: float = 50.0, cross_gbps: float = 12.5, latency_us: float = 5.0,
            workload: Workload = DEFAULT_WORKLOAD, details: Optional[list] = None,
            threads: Optional[int] = None,
            training: TrainingSettings = TrainingSettings()) -> JobSpec:
    """A JobSpec with measured durations (us) and memory (bytes). memory_budget: bytes per
    worker (default: the GPU's memory on CUDA, this machine's memory / (replicas x stages)
    on CPU); capacity is the budget less parameters, gradients and AdamW's two moments
    (4x parameter bytes) and the room one micro-batch takes while it computes, above what
    it holds (measure_stage's workspace_bytes: its recomputation under checkpointing,
    gradients in flight and temporaries). threads: torch threads while measuring (default: the workers'
    RECYCLE_THREADS, 1). `details`, if given, receives each stage's measure_stage dict."""
    us = lambda v: max(1, int(round(v)))
    if threads is None:
        threads = int(os.environ.get("RECYCLE_THREADS", "1"))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows = [measure_stage(cfg, s, stages, device=device, repeats=repeats, workload=workload,
                              training=training) for s in range(stages)]
    finally:
        torch.set_num_threads(before)
    if details is not None:
        details.extend(rows)
    ring = 2 * (replicas - 1) / replicas  # bytes each peer sends in a ring all-reduce
    opt = [r["OPT"] + (ring * r["param_bytes"] / (cross_gbps * 1e3) + latency_us
                       if replicas > 1 else 0) for r in rows]
    out_bytes = max(r["output_bytes"] for r in rows)
    p2p = P2P(intra=us(latency_us + out_bytes / (intra_gbps * 1e3)),
              cross=us(latency_us + out_bytes / (cross_gbps * 1e3)))
    if memory_budget is None:
        if torch.device(device).type == "cuda":
            memory_budget = torch.cuda.get_device_properties(torch.device(device)).total_memory
        else:  # the workers of the grid share this machine's memory
            memory_budget = machine_memory() // max(1, replicas * stages)
    memory = None
    if memory_budget is not None:
        act = [max(1, r["activation_bytes"]) for r in rows]
        cap = [int(memory_budget - 4 * r["param_bytes"] - r["workspace_bytes"]) for r in rows]
        for s, (a, c) in enumerate(zip(act, cap)):
            if c < a:
                room = f" + {rows[s]['workspace_bytes']} to compute it" \
                    if rows[s]["workspace_bytes"] else ""
                raise ValueError(f"memory_budget {memory_budget} B cannot hold stage {s}'s "
                                 f"state plus one micro-batch ({4 * rows[s]['param_bytes']} + "
                                 f"{a} B{room})")
        memory = Memory(activation=act, capacity=cap)
    return JobSpec(replicas=replicas, stages=stages, microbatches=microbatches,
                   cost=Cost(F=[us(r["F"]) for r in rows], I=[us(r["I"]) for r in rows],
                             W=[us(r["W"]) for r in rows], OPT=[us(v) for v in opt]),
                   p2p=p2p, memory=memory,
                   activation_checkpointing=training.activation_checkpointing
                   if training.activation_checkpointing != "none" else None)


# ---- per-layer costs and `--split balanced` (executor/models/balance.py) ----------------

def profile_layers(cfg: ModelConfig, *, device: str = "cpu", repeats: int = 5,
                   workload: Workload = DEFAULT_WORKLOAD,
                   threads: Optional[int] = None) -> list[int]:
    """F+I+W (us, median rounds) of one micro-batch through each layer alone:
    [embedding, block 0, ..., block L-1, head] (JobSpec.layer_cost). Measured on the split
    that gives every layer its own stage (boundaries 0, 1, ..., L over L+2 stages: the
    first holds only the embedding, the last only the final norm and head), each stage fed
    the previous one's real output, so a layer is built once."""
    L = cfg.n_layers
    fine = dataclasses.replace(cfg, boundaries=tuple(range(L + 1)))
    dev = torch.device(device)
    if threads is None:
        threads = int(os.environ.get("RECYCLE_THREADS", "1"))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = workload.microbatch(fine, 0, 0)[0].to(dev)
        out = []
        for s in range(L + 2):
            r = measure_stage(fine, s, L + 2, device=device, repeats=repeats,
                              workload=workload, inputs=x)
            out.append(max(1, int(round(r["F"] + r["I"] + r["W"]))))
            if s < L + 1:
                with torch.no_grad():
                    x = _call(workload.build_stage(fine, s, L + 2).to(dev), x)
    finally:
        torch.set_num_threads(before)
    return out


def profile_balanced(cfg: ModelConfig, stages: int, replicas: int, microbatches: int,
                     device: str = "cpu", repeats: int = 5, **kw) -> JobSpec:
    """Per-layer costs, the balanced boundaries they give (executor/models/balance.py),
    then the stages of that split profiled as `profile` does: a JobSpec whose layer_cost
    gives `train` the same boundaries back."""
    from executor.models.balance import balanced_boundaries
    costs = profile_layers(cfg, device=device, repeats=repeats,
                           workload=kw.get("workload", DEFAULT_WORKLOAD), threads=kw.get("threads"))
    cfg = dataclasses.replace(cfg, boundaries=balanced_boundaries(costs, stages))
    spec = profile(cfg, stages, replicas, microbatches, device=device, repeats=repeats, **kw)
    return spec.model_copy(update={"layer_cost": costs})
