"""Does posting a gloo receive before its message is sent save time? (runtime/transport/comm.py's
World.post_early; the agent keeps the next receives of its plan posted.)

Two processes, gloo on loopback, one thread each. Per round: a barrier, then rank 0
computes 2 ms and sends an activation-sized tensor; rank 1 computes 6 ms (so the message
is sent while it computes) and waits for it. "late": rank 1 posts its receive after its
compute, as a runtime that posts at the action does; "early": before it. The figure is
how long rank 1 then waits in the receive (median over rounds, per block), the time a
message adds to the critical path when its data is already due.

    PYTHONPATH=. python benchmarks/gloo_early_recv.py [--out benchmarks/results/gloo_early_recv.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SHAPE = (8, 64, 128)  # the executor benchmark's activation: micro-batch 8, seq 64, d 128


def _compute(ms: float) -> None:
    t0, a = time.perf_counter(), torch.randn(128, 128)
    while (time.perf_counter() - t0) * 1e3 < ms:
        a = a @ a * 1e-3


def _rank(rank: int, port: int, rounds: int, blocks: int, q) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    buf, res = torch.randn(SHAPE), {"late": [], "early": []}
    for _ in range(blocks):
        for mode in res:  # interleaved blocks: both see the same load drift
            waits = []
            for i in range(rounds):
                dist.barrier()
                if rank == 0:
                    _compute(2)
                    dist.isend(buf, 1, tag=i).wait()
                    continue
                out = torch.empty(SHAPE)
                work = dist.irecv(out, 0, tag=i) if mode == "early" else None
                _compute(6)
                work = work or dist.irecv(out, 0, tag=i)
                t0 = time.perf_counter()
                work.wait()
                waits.append((time.perf_counter() - t0) * 1e6)
            if rank == 1:
                res[mode].append(statistics.median(waits[3:]))
    if rank == 1:
        q.put(res)
    dist.destroy_process_group()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from benchmarks.pp_baseline import free_port
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, args.rounds, args.blocks, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = q.get(timeout=300)
    for p in procs:
        p.join(30)
    lines = ["# gloo: receive posted before vs after its message is sent", "",
             f"Command: `PYTHONPATH=. python benchmarks/gloo_early_recv.py --rounds {args.rounds} "
             f"--blocks {args.blocks}" + (f" --out {args.out}`" if args.out else "`"), "",
             f"Activation {list(SHAPE)} float32 ({torch.Size(SHAPE).numel() * 4 // 1024} KiB), 2 processes, "
             f"gloo on loopback, {os.cpu_count()} cores shared with other jobs (1-min load "
             f"{os.getloadavg()[0]:.1f}). Median wait in the receive (us) per block of {args.rounds} "
             "rounds, blocks interleaved:", "",
             "| receive posted | " + " | ".join(f"block {i + 1}" for i in range(args.blocks)) + " |",
             "| --- |" + " --- |" * args.blocks]
    for mode in ("late", "early"):
        lines.append(f"| {'after its compute (at the action)' if mode == 'late' else 'before its compute (early)'} | "
                     + " | ".join(f"{v:.0f}" for v in res[mode]) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return res


if __name__ == "__main__":
    main()
