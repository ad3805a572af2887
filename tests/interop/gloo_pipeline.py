"""Run exported CSV schedules in torch.distributed.pipelining's own runtime on 2 gloo
processes, next to Schedule1F1B on the same model and batch; write what each rank saw.

Usage: python gloo_pipeline.py OUT_DIR PORT M CSV [CSV ...]
OUT_DIR/rank{r}.json: {"1f1b": {...}, "<csv> defer=<bool>": {...}} where each entry holds
the losses (last rank) and the stage's parameter gradients, as lists of floats.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

S, WIDTH, BATCH = 2, 8, 16


def stage_module(rank: int) -> torch.nn.Module:
    torch.manual_seed(100 + rank)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
                               torch.nn.Linear(WIDTH, WIDTH))


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)


def run(schedule_of, rank: int, M: int) -> dict:
    mod = stage_module(rank)
    stage = PipelineStage(mod, rank, S, torch.device("cpu"))
    sched = schedule_of(stage)
    torch.manual_seed(7)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    losses: list = []
    if rank == 0:
        sched.step(x)
    else:
        sched.step(target=y, losses=losses)
    return {"losses": [float(v.detach()) for v in losses],
            "grads": [p.grad.flatten().tolist() for p in mod.parameters()]}


def worker(rank: int, out_dir: str, port: int, M: int, csvs: list) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=S)
    try:
        res = {"1f1b": run(lambda st: Schedule1F1B(st, M, loss_fn=loss_fn), rank, M)}
        for path in csvs:
            for defer in (False, True):
                def runtime(st, path=path, defer=defer):
                    sched = _PipelineScheduleRuntime([st], M, loss_fn=loss_fn,
                                                     defer_pp_recv=defer)
                    sched._load_csv(path)
                    return sched
                res[f"{os.path.basename(path)} defer={defer}"] = run(runtime, rank, M)
                dist.barrier()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(res, fh)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    out_dir, port, M, csvs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    torch.set_num_threads(1)
    mp.spawn(worker, args=(out_dir, port, M, csvs), nprocs=S, join=True)
