"""Sections c and d: how fast is the big model on the GPU, and what do our additions cost?

c. `recycle profile --device cuda` (CUDA-event times of F, I, W, OPT per stage), then the
   training throughput in bf16 of the whole model in one process and of each stage of
   the split as a worker runs it (F, I, W per micro-batch, then the AdamW step), with the
   model FLOPs of a micro-batch counted by torch.utils.flop_counter over one forward and
   backward (attention counted in full, causal mask or not, as PaLM's MFU does).
d. The I/W split against fused B per stage, timed by the profiler's CUDA events
   (executor/compute/profile.measure_stage): benchmarks/split_backward_ab.py times thread
   CPU time, which on a GPU measures kernel launches, not work. Then the copy a
   peer-memory snapshot puts on the training thread (peer_snapshots/local.LocalCopies:
   parameters and AdamW state into pinned host buffers, queued on the stream).
"""
from __future__ import annotations

import gc
import json
import statistics
import tempfile
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.gpu_check.exact import recycle
from benchmarks.gpu_check.machine import peak_tflops
from executor.compute.config import TrainingSettings
from executor.compute.model import ModelConfig
from executor.compute.measure.profile import measure_stage
from executor.compute.stage import StageCompute, autocast, boundary_cast
from executor.inputs.workload_name import load_workload
from executor.models.families import architecture
from executor.runtime.peer_snapshots.local import LocalCopies


def big_config(st: dict) -> ModelConfig:
    return ModelConfig(micro_batch_size=st["big_micro_batch"], seed=0,
                       **architecture(st["big_model"], seq_len=st["big_seq_len"]))


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _call(module, x):
    return module(*x) if isinstance(x, tuple) else module(x)


def _shape(st: dict) -> str:
    return (f"{st['big_model']}, seq_len {st['big_seq_len']}, micro-batch "
            f"{st['big_micro_batch']}")


def profile(st: dict) -> dict:
    S = str(st["big_stages"])
    with tempfile.TemporaryDirectory(prefix="gpu_check_c_") as tmp:
        args = ["profile", "--model", st["big_model"], "--device", st["device"], "-s", S,
                "-d", "1", "-m", str(st["rate_microbatches"]), "--seq-len",
                str(st["big_seq_len"]), "--micro-batch-size", str(st["big_micro_batch"]),
                "--repeats", str(st["profile_repeats"]), "--out", f"{tmp}/job.json",
                "--details", f"{tmp}/details.json"]
        t0 = time.perf_counter()
        recycle(*args, timeout=600)
        secs = time.perf_counter() - t0
        with open(f"{tmp}/details.json") as fh:
            rows = json.load(fh)
    lines = [f"`recycle {' '.join(args).replace(tmp, 'TMP')}` (fp32; "
             f"{secs:.1f} s with the builds). ms per micro-batch, median of "
             f"{st['profile_repeats']} rounds.", "",
             "| stage | F ms | I ms | W ms | OPT ms | activation MiB | parameters MiB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s, r in enumerate(rows):
        lines.append(f"| {s} | {r['F'] / 1e3:.2f} | {r['I'] / 1e3:.2f} | {r['W'] / 1e3:.2f} | "
                     f"{r['OPT'] / 1e3:.2f} | {r['activation_bytes'] / 2**20:.1f} | "
                     f"{r['param_bytes'] / 2**20:.1f} |")
    return {"lines": lines, "numbers": {"profile_s": secs, **{f"F{s}_ms": r["F"] / 1e3
                                                              for s, r in enumerate(rows)}}}


class _Stage:
    """One stage (or the whole model: stages=1) on `dev`, trained as a worker does."""

    def __init__(self, st: dict, stages: int, stage: int, precision: str):
        self.dev = torch.device(st["device"])
        cfg, wl = big_config(st), load_workload(st["big_model"])
        tokens, self.targets = (t.to(self.dev) for t in wl.microbatch(cfg, 0, 0))
        x = tokens
        with torch.no_grad(), autocast(precision, self.dev):  # its real input activation
            for s in range(stage):
                out = _call(wl.build_stage(cfg, s, stages).to(self.dev), x)
                cast = boundary_cast([out] if isinstance(out, torch.Tensor) else list(out),
                                     precision)
                x = cast[0] if isinstance(out, torch.Tensor) else tuple(cast)
        self.x, self.wl, self.precision = x, wl, precision
        self.module = wl.build_stage(cfg, stage, stages).to(self.dev)
        self.first, self.last = stage == 0, stage == stages - 1
        self.mbs = st["rate_microbatches"]
        self.comp = StageCompute(self.module, self.first, self.last, 1.0 / self.mbs,
                                 loss_fn=wl.loss_fn, precision=precision)
        self.opt = wl.make_optimizer(TrainingSettings(), self.module.parameters())
        self.grad = None
        if not self.last:  # the gradient message a worker would receive
            out = self.comp.forward(0, x, self.targets)
            self.grad = (torch.randn_like(out) if isinstance(out, torch.Tensor) else
                         tuple(torch.randn_like(t) for t in out if t.is_floating_point()))
            self.comp.reset()
        self.tokens_per_mb = tokens.numel()

    def flops(self) -> int:
        """Model FLOPs of one micro-batch's forward and backward (native autograd)."""
        leaf = lambda t: t.detach().requires_grad_(True) if t.is_floating_point() else t
        x = self.x if self.first else (tuple(map(leaf, self.x)) if isinstance(self.x, tuple)
                                       else leaf(self.x))
        with FlopCounterMode(display=False) as fc:
            with autocast(self.precision, self.dev):
                out = _call(self.module, x)
                root = self.wl.loss_fn(out, self.targets) if self.last else out
            if self.last:
                root.backward()
            else:
                outs = [out] if isinstance(out, torch.Tensor) else [o for o in out
                                                                    if o.is_floating_point()]
                grads = [self.grad] if isinstance(self.grad, torch.Tensor) else list(self.grad)
                torch.autograd.backward(outs, [g.to(o.dtype) for o, g in zip(outs, grads)])
        self.module.zero_grad(set_to_none=True)
        return fc.get_total_flops()

    def step(self) -> None:
        for g in range(self.mbs):
            self.comp.forward(g, self.x, self.targets)
            self.comp.backward_input(g, self.grad)
            self.comp.backward_weight(g)
        self.opt.step()
        self.comp.reset()  # drops the losses and the gradients

    def rate(self, steps: int) -> float:
        """Seconds per optimizer step, after one warm-up step."""
        self.step()
        _sync(self.dev)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        _sync(self.dev)
        return (time.perf_counter() - t0) / steps


def rates(st: dict) -> dict:
    dev = torch.device(st["device"])
    peak = st.get("peak_tflops") or (peak_tflops(torch.cuda.get_device_name(dev))
                                     if dev.type == "cuda" else None)
    S = st["big_stages"]
    lines = [f"{_shape(st)}, bf16 autocast (fp32 master weights, AdamW), "
             f"{st['rate_microbatches']} micro-batches per step, {st['rate_steps']} timed "
             f"steps after a warm-up; each micro-batch F, I, W as a worker runs them. MFU = "
             f"model TFLOPS / peak dense bf16 "
             + (f"{peak:g} TFLOPS." if peak else "(unknown here: MFU n/a)."), "",
             "| what | step ms | tokens/s | GFLOP per micro-batch | TFLOPS | MFU |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    numbers = {}
    for stages, stage, what in [(1, 0, "whole model, one process")] + [
            (S, s, f"stage {s} of {S}") for s in range(S)]:
        run = _Stage(st, stages, stage, "bf16")
        flops = run.flops()
        sec = run.rate(st["rate_steps"])
        tps = run.tokens_per_mb * run.mbs / sec
        tflops = flops * run.mbs / sec / 1e12
        mfu = f"{100 * tflops / peak:.1f}%" if peak else "n/a"
        lines.append(f"| {what} | {sec * 1e3:.1f} | {tps:,.0f} | {flops / 1e9:,.4g} | "
                     f"{tflops:.3g} | {mfu} |")
        key = "full" if stages == 1 else f"stage{stage}"
        numbers[f"{key}_tokens_per_s"] = tps
        if peak:
            numbers[f"{key}_mfu"] = tflops / peak
        del run
        _free(dev)
    return {"lines": lines, "numbers": numbers}


def split(st: dict) -> dict:
    cfg, wl, S = big_config(st), load_workload(st["big_model"]), st["big_stages"]
    lines = [f"{_shape(st)}, fp32, S={S}; ms per micro-batch, median of "
             f"{st['split_repeats']} rounds of CUDA events (on the CPU: thread time). "
             "I+W/B: what splitting the backward costs over one fused backward; native: "
             "plain autograd.", "",
             "| stage | F | fused B | I | W | I+W | I+W / B | native backward |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    numbers = {}
    for s in range(S):
        r = measure_stage(cfg, s, S, device=st["device"], repeats=st["split_repeats"],
                          workload=wl)
        iw = r["I"] + r["W"]
        lines.append(f"| {s} | {r['F'] / 1e3:.2f} | {r['B'] / 1e3:.2f} | {r['I'] / 1e3:.2f} | "
                     f"{r['W'] / 1e3:.2f} | {iw / 1e3:.2f} | {iw / r['B']:.3f} | "
                     f"{r['native_backward'] / 1e3:.2f} |")
        numbers[f"stage{s}_iw_over_b"] = iw / r["B"]
        _free(torch.device(st["device"]))
    return {"lines": lines, "numbers": numbers}


def snapshot(st: dict) -> dict:
    dev = torch.device(st["device"])
    cfg, wl, S = big_config(st), load_workload(st["big_model"]), st["big_stages"]
    module = wl.build_stage(cfg, 0, S).to(dev)
    opt = wl.make_optimizer(TrainingSettings(), module.parameters())
    for p in module.parameters():  # one step on zero gradients: AdamW's state exists
        p.grad = torch.zeros_like(p)
    opt.step()
    state = {"model": module.state_dict(), "optim": opt.state_dict()}  # as the agent offers
    copies = LocalCopies(max_copies=1)  # from the third take on, buffers are reused
    rows = []
    for k in range(st["snapshot_takes"]):
        _sync(dev)
        t0 = time.perf_counter()
        copy = copies.take(k, state, 0)
        host = time.perf_counter() - t0
        copy.ready()
        rows.append((host, time.perf_counter() - t0, copy.nbytes))
    gb = rows[-1][2] / 1e9
    size = f"{gb:.2f} GB" if gb >= 0.1 else f"{gb * 1e3:.2f} MB"
    reused = rows[2:] or rows[-1:]
    host = statistics.median(r[0] for r in reused)
    done = statistics.median(r[1] for r in reused)
    lines = [f"Stage 0 of {S} of {_shape(st)}: parameters, buffers and AdamW state, "
             f"{size}, into {'pinned ' if dev.type == 'cuda' else ''}host buffers "
             f"(LocalCopies.take, as a worker's snapshot). On the training thread: until "
             f"take returns; copied: until its event is done.", "",
             "| take | on the training thread ms | copied ms | GB/s |",
             "| --- | ---: | ---: | ---: |"]
    for k, (h, d, n) in enumerate(rows):
        note = " (allocates)" if k < 2 else " (reuses)"
        lines.append(f"| {k}{note} | {h * 1e3:.2f} | {d * 1e3:.2f} | {n / 1e9 / d:.3g} |")
    return {"lines": lines, "numbers": {"snapshot_gb": gb, "host_ms": host * 1e3,
                                        "copy_gbps": gb / done}}
