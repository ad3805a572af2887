"""Token files: `recycle data prepare` writes them, `recycle train --data FILE` reads them.

Layout (little-endian): a 16-byte header, then the tokens back to back, as nanoGPT's
train.bin but self-describing:
    b"RCYTOK1\\0" | uint32 vocab | uint32 bytes per token (1: byte-level) | tokens
The file is memory-mapped read-only, so every worker process shares the page cache and
none loads the corpus.

Micro-batch g of iteration i is `b` windows of seq_len + 1 tokens at offsets drawn from a
generator seeded by (seed, i, g) alone (nanoGPT's get_batch, made a pure function): any
replica can load any micro-batch, so re-routing or re-running an iteration never changes
which samples are trained.
"""
from __future__ import annotations

import mmap
import os
import struct
import warnings
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
from torch import Tensor

from executor.compute.data import _seed

MAGIC = b"RCYTOK1\0"
HEADER = struct.Struct("<8sII")
WIDTH = 1  # bytes per token: byte-level tokens (the header's field leaves room for more)


@dataclass(frozen=True)
class TokenFile:
    path: str
    vocab: int
    width: int  # bytes per token
    tokens: int  # how many

    @property
    def data(self) -> Tensor:
        return _mapped(self.path)


def write_tokens(path: str, tokens: bytes | bytearray, vocab: int = 256) -> TokenFile:
    """Write byte-level tokens (one byte each) atomically: a reader never sees half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(HEADER.pack(MAGIC, vocab, WIDTH))
        fh.write(tokens)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return TokenFile(path, vocab, WIDTH, len(tokens))


def open_tokens(path: str) -> TokenFile:
    """Header of a token file; ValueError (one line) if it is not one."""
    if not os.path.isfile(path):
        raise ValueError(f"--data {path}: no such file")
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(HEADER.size)
    if len(head) < HEADER.size or head[:8] != MAGIC:
        raise ValueError(f"--data {path} is not a token file (write one with "
                         f"`recycle data prepare`)")
    _, vocab, width = HEADER.unpack(head)
    if width != WIDTH:
        raise ValueError(f"--data {path}: corrupt header (token width {width}, "
                         f"{size - HEADER.size} bytes of tokens)")
    return TokenFile(path, vocab, width, (size - HEADER.size) // width)


@lru_cache(maxsize=4)
def _mapped(path: str) -> Tensor:
    with open(path, "rb") as fh:
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    # torch.frombuffer warns on a read-only buffer; nothing here ever writes to it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=torch.uint8, offset=HEADER.size)


def microbatch_from(tf: TokenFile, seed: int, micro_batch_size: int, seq_len: int,
                    iteration: int, g: int) -> tuple[Tensor, Tensor]:
    """(tokens, targets) LongTensor[b, seq_len] of micro-batch g of `iteration`."""
    gen = torch.Generator().manual_seed(_seed(seed, 0x70C5, iteration, g))
    starts = torch.randint(tf.tokens - seq_len, (micro_batch_size,), generator=gen)
    data = tf.data
    rows = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()]).long()
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def check_data(path: str, vocab: int, micro_batch_size: int, seq_len: int,
               global_microbatches: int) -> TokenFile:
    """The token file `recycle train --data` will read, checked against the run."""
    tf = open_tokens(path)
    if tf.vocab > vocab:
        raise ValueError(f"--data {path} holds tokens 0..{tf.vocab - 1}, more than the "
                         f"model's vocab of {vocab} (use --vocab {tf.vocab} or a flavour "
                         f"with vocab >= {tf.vocab})")
    need = global_microbatches * micro_batch_size * seq_len + 1
    if tf.tokens < need:
        raise ValueError(f"--data {path} holds {tf.tokens:,} tokens, too few for one global "
                         f"batch of {global_microbatches} micro-batches x {micro_batch_size} x "
                         f"{seq_len} tokens (needs at least {need:,})")
    return tf


def with_data(workload, cfg):
    """The workload reading its micro-batches from cfg.data (unchanged when it is empty)."""
    if not cfg.data:
        return workload
    if not workload.reads_tokens:
        raise ValueError("--data feeds token ids, but this --model does not declare "
                         "reads_tokens=True (its first stage takes other inputs)")
    tf = open_tokens(cfg.data)
    def microbatch(c, iteration: int, g: int):
        return microbatch_from(tf, c.seed, c.micro_batch_size, c.seq_len, iteration, g)
    return replace(workload, microbatch=microbatch)
