"""Baselines from torch.distributed.pipelining on the same model, data and process count.

One process per rank, gloo over loopback, one thread each. Each rank wraps the very
stages ReCycle runs (executor.compute.model.build_stage) as PipelineStage(s) and times whole
iterations (schedule.step + AdamW step): the interval between consecutive iteration ends,
after `warmup` iterations. Micro-batches are generated before the timed loop. Schedules:
  1f1b  Schedule1F1B, one stage per rank (S ranks, S stages)
  zbv   ScheduleZBVZeroBubble: the zero-bubble schedule that runs on one stage per
        "virtual" chunk, so it needs exactly 2 stages per rank: the model is split into
        2S stages, rank r holds chunks r and 2S-1-r (the V); same model, same S ranks.
  izb   ScheduleInterleavedZeroBubble, 2 stages per rank in looped order (r, r+S).
Rank 0 of the 1f1b run also measures the one-way gloo latency of an activation-sized
tensor (ping-pong with rank 1), which the planner's p2p delay is then set to.
"""
from __future__ import annotations

import socket
import statistics
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from executor.compute.config import ModelConfig, TrainingSettings
from executor.inputs.workload_name import DEFAULT_MODEL, load_workload

SCHEDULES = ("1f1b", "zbv", "izb")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pingpong(cfg: ModelConfig, rank: int, rounds: int = 30) -> float:
    """One-way latency (us) of an activation-sized send over gloo, median of `rounds`."""
    buf = torch.zeros(cfg.micro_batch_size, cfg.seq_len, cfg.d_model)
    times = []
    for _ in range(rounds + 5):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        times.append((time.perf_counter() - t0) * 1e6 / 2)
    return statistics.median(times[5:])


def _stage_ids(kind: str, rank: int, S: int) -> list[int]:
    if kind == "1f1b":
        return [rank]
    if kind == "zbv":
        return [rank, 2 * S - 1 - rank]
    return [rank, rank + S]  # izb: looped placement


def _worker(rank: int, S: int, port: int, cfg_d: dict, M: int, iters: int, warmup: int,
            kind: str, q, model: str = DEFAULT_MODEL) -> None:
    try:
        torch.set_num_threads(1)
        # the host allocator ReCycle's workers run with (RECYCLE_HOST_ALLOCATOR decides for
        # both sides): the rows compare schedules and runtimes, not malloc settings
        from executor.compute.host_allocator import keep_freed_memory
        keep_freed_memory()
        from torch.distributed.pipelining import (PipelineStage, Schedule1F1B,
                                                  ScheduleInterleavedZeroBubble,
                                                  ScheduleZBVZeroBubble)
        cfg = ModelConfig.from_dict(cfg_d)
        wl = load_workload(model)  # the same Workload ReCycle's workers train
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=S)
        lat = _pingpong(cfg, rank) if kind == "1f1b" and S > 1 else None
        ids = _stage_ids(kind, rank, S)
        n_stages = S if kind == "1f1b" else 2 * S
        mods = [wl.build_stage(cfg, i, n_stages) for i in ids]
        stages = [PipelineStage(m, i, n_stages, torch.device("cpu")) for m, i in zip(mods, ids)]
        opt = wl.make_optimizer(TrainingSettings(), [p for m in mods for p in m.parameters()])
        if kind == "1f1b":
            sched = Schedule1F1B(stages[0], M, loss_fn=wl.loss_fn)
        elif kind == "zbv":
            sched = ScheduleZBVZeroBubble(stages, M, loss_fn=wl.loss_fn)
        else:
            sched = ScheduleInterleavedZeroBubble(stages, M, loss_fn=wl.loss_fn)
        first, last = 0 in ids, n_stages - 1 in ids
        ends, losses = [], []
        # generated up front, as in ReCycle's benchmark workers (a prefetching loader)
        data = [[wl.microbatch(cfg, it, g) for g in range(M)] if first or last else None
                for it in range(iters)]
        for it in range(iters):
            mbs = data[it]
            x = torch.cat([m[0] for m in mbs]) if first else None
            y = torch.cat([m[1] for m in mbs]) if last else None
            out: list = []
            args = (x,) if first else ()
            kw = {"target": y, "losses": out} if last else {}
            sched.step(*args, **kw)
            opt.step()
            opt.zero_grad(set_to_none=True)
            ends.append(time.perf_counter())
            if out:
                losses.append(float(sum(float(v.detach()) for v in out) / len(out)))
        steps = [b - a for a, b in zip(ends[warmup:], ends[warmup + 1:])]
        q.put({"rank": rank, "iter_s": steps, "latency_us": lat, "losses": losses})
        dist.destroy_process_group()
    except Exception:  # report instead of hanging the parent
        q.put({"rank": rank, "error": traceback.format_exc()[-1500:]})


def run_torch(cfg: ModelConfig, S: int, M: int, iters: int, warmup: int, kind: str,
              timeout_s: float = 240.0, model: str = DEFAULT_MODEL) -> dict:
    """Run one torch.distributed.pipelining schedule; per-iteration seconds per rank."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, S, port, cfg.to_dict(), M, iters, warmup,
                                               kind, q, model)) for r in range(S)]
    for p in procs:
        p.start()
    res, deadline = [], time.monotonic() + timeout_s
    while len(res) < S:
        try:
            res.append(q.get(timeout=1.0))
        except Exception:  # queue.Empty: is anyone dead, or are we out of time?
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                why = f"a rank exited with code {dead[0]}" if dead else f"timed out after {timeout_s:.0f}s"
                res.append({"rank": -1, "error": why})
                break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    errs = [r["error"] for r in res if "error" in r]
    if errs:
        return {"kind": kind, "error": errs[0].strip().splitlines()[-1][:300]}
    res.sort(key=lambda r: r["rank"])
    per_rank = [statistics.mean(r["iter_s"]) for r in res]
    return {"kind": kind, "iter_ms": 1e3 * max(per_rank),
            "iter_ms_median": 1e3 * max(statistics.median(r["iter_s"]) for r in res),
            "latency_us": res[0]["latency_us"],
            "losses": next((r["losses"] for r in res if r["losses"]), [])}


if __name__ == "__main__":  # quick check: PYTHONPATH=. python benchmarks/pp_baseline.py
    c = ModelConfig(vocab=256, seq_len=64, d_model=128, n_heads=4, n_layers=4, micro_batch_size=8)
    for k in SCHEDULES:
        print(run_torch(c, 2, 4, 6, 2, k))
