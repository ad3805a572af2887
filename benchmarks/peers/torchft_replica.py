"""One torchft replica group of S=1 (a DDP replica): the project's model and token data,
torchft's Manager, lighthouse quorum and fault-tolerant gloo process group.

Run by benchmarks/peers/run.py, one process per replica. Replica d trains its own share of
each global batch, micro-batches g = d*M .. d*M+M-1 of `microbatch(cfg, step, g)` (the
samples ReCycle's replica d trains), each loss scaled by 1/M; torchft's Manager.allreduce
averages the gradients over the replicas in the quorum. With every replica in, that is ReCycle's update
(the global-batch mean); when a replica is gone, torchft trains the survivors' shares only.

Every step writes one JSON line to --log: step, committed, participants, local loss, wall
time at the end of the step. --kill-at K makes this process SIGKILL itself after the first
micro-batch of step K (the kill time is logged first).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time
from datetime import timedelta

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--microbatches", type=int, required=True)
    ap.add_argument("--iterations", type=int, required=True)
    ap.add_argument("--config", required=True, help="ModelConfig and TrainingSettings fields "
                    "as one JSON object")
    ap.add_argument("--lighthouse", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--timeout", type=float, default=5.0)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("RECYCLE_THREADS", "1")))  # as ReCycle's workers

    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.optim import OptimizerWrapper

    from executor.compute.config import ModelConfig, TrainingSettings, split_flat
    from executor.compute.model import DEFAULT_WORKLOAD
    from executor.data.token_file import with_data

    model, settings = split_flat(json.loads(a.config))
    cfg, training = ModelConfig.from_dict(model), TrainingSettings.from_dict(settings)
    wl = with_data(DEFAULT_WORKLOAD, training.data)
    module = wl.build_stage(cfg, 0, 1)  # S=1: the whole model, seeded alike in every replica
    log = open(a.log, "a", buffering=1)

    def load_state_dict(sd):
        module.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": module.state_dict(), "optim": opt.state_dict()}

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=a.timeout)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"replica_{a.replica}", lighthouse_addr=a.lighthouse,
                      store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
                      timeout=timeout, quorum_timeout=timedelta(seconds=60),
                      init_sync=False)  # identical seeded init in every replica
    params = list(module.parameters())
    opt = OptimizerWrapper(manager, wl.make_optimizer(training, module.parameters()))
    M = a.microbatches
    log.write(json.dumps({"ready": time.time(), "replica": a.replica}) + "\n")
    while manager.current_step() < a.iterations:
        step = manager.current_step()
        opt.zero_grad()  # starts the quorum (asynchronously, under the forward)
        total = 0.0
        for k in range(M):
            x, y = wl.microbatch(cfg, step, a.replica * M + k)
            loss = wl.loss_fn(module(x), y)
            (loss / M).backward()
            total += float(loss.detach())
            if step == a.kill_at and k == 0:
                log.write(json.dumps({"kill": time.time(), "step": step}) + "\n")
                log.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        allreduce_grads(manager, params)
        committed = manager.should_commit()
        if committed:
            opt.optim.step()  # (OptimizerWrapper.step would ask should_commit again)
        log.write(json.dumps({"step": step, "committed": committed, "t": time.time(),
                              "participants": manager.num_participants(),
                              "loss": total / M, "samples": M * cfg.micro_batch_size}) + "\n")
    checksum = float(sum(p.detach().double().sum() for p in module.parameters()))
    log.write(json.dumps({"end": time.time(), "checksum": checksum}) + "\n")
    manager.shutdown(wait=False)


def allreduce_grads(manager, params) -> None:
    """What torchft's DDP comm hook does per bucket, in one bucket: Manager.allreduce (the
    fault-tolerant all-reduce, averaged over the quorum's participants). Not
    torchft.ddp.DistributedDataParallel itself: in torchft 0.2.0 its hook fails on a peer's
    death (`assert fut._fut`, torchft/ddp.py:76, AssertionError out of backward) instead of
    letting should_commit() skip the step."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
    grads = [p.grad for p in params]
    flat = _flatten_dense_tensors(grads)
    manager.allreduce(flat).wait()
    for g, r in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(r)


if __name__ == "__main__":
    main()
