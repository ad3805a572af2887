"""Where a worker's process group meets and runs: the coordinator's store (hosted on one
address, reached by the workers) and the worker's device."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from planner.errors import UserError


def connect_store(host: str, port: int, timeout_s: float, is_master: bool = False) -> dist.TCPStore:
    return dist.TCPStore(host, port, None, is_master, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def host_store(bind_host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The coordinator's store, listening on `bind_host` only (TCPStore alone would listen
    on every interface): we bind the socket and hand it over."""
    import socket
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind_host, port))
    sock.listen(512)
    port = sock.getsockname()[1]
    # its own client connects where it listens (loopback reaches only a loopback or
    # wildcard bind; a store on a test host's bridge address refused it)
    me = "127.0.0.1" if bind_host in ("0.0.0.0", "") else bind_host
    return dist.TCPStore(me, port, None, True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False, master_listen_fd=sock.detach())


def check_device(want: str = "auto") -> str:
    """'auto', 'cpu' or 'cuda' as asked; ValueError (one line) for a device not here."""
    if want not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda, not {want!r}")
    if want == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device on this machine "
                         f"(torch {torch.__version__}, torch.cuda.is_available() is False)")
    return want


def pick_device(local_rank: int, want: str = "auto") -> torch.device:
    """The worker's device: GPU local_rank (modulo the GPUs there are) on CUDA."""
    if check_device(want) != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def local_workers_hint() -> Optional[int]:
    """torchrun tells how many ranks share this host; NCCL needs one GPU each."""
    v = os.environ.get("LOCAL_WORLD_SIZE")
    return int(v) if v else None
