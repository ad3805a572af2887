"""Token files: `recycle data prepare` writes them, `recycle train --data FILE` reads them.

Two layouts, told apart by the first bytes and the sidecar:
- byte-level (the default tokenizer): a 16-byte header, then one byte per token,
      b"RCYTOK1\\0" | uint32 vocab | uint32 bytes per token (1) | tokens
- nanoGPT's (`--tokenizer bpe:VOCAB` or `--tokenizer tokenizer.json`): FILE is a flat
  array of uint16 token ids (uint32 when some id does not fit 16 bits), no header, as
  nanoGPT's train.bin; FILE.json (the sidecar) gives its dtype, vocab and tokenizer, so
  `np.memmap(FILE, dtype=sidecar["dtype"], mode="r")` reads it in any nanoGPT script.
Either file is memory-mapped read-only, so every worker process shares the page cache and
none loads the corpus.

Micro-batch g of iteration i is `b` windows of seq_len + 1 tokens at offsets drawn from a
generator seeded by (seed, i, g) alone (nanoGPT's get_batch, made a pure function): any
replica can load any micro-batch, so re-routing or re-running an iteration never changes
which samples are trained.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from executor.compute.data import _seed

MAGIC = b"RCYTOK1\0"
HEADER = struct.Struct("<8sII")
WIDTH = 1  # bytes per token of the byte-level layout
SIDECAR_FORMAT = "recycle.tokens/v1"
DTYPES = {"uint16": 2, "uint32": 4}


@dataclass(frozen=True)
class TokenFile:
    path: str
    vocab: int
    width: int  # bytes per token
    tokens: int  # how many
    offset: int = HEADER.size  # bytes before the first token (0 in nanoGPT's layout)
    meta: Optional[dict] = None  # the sidecar (nanoGPT's layout), None for byte-level

    @property
    def dtype(self) -> str:
        return {1: "uint8", 2: "uint16", 4: "uint32"}[self.width]

    @property
    def data(self) -> np.ndarray:
        """The tokens, memory-mapped (never loaded)."""
        st = os.stat(self.path)
        return _mapped(self.path, self.dtype, self.offset, st.st_mtime_ns, st.st_size)


def sidecar_path(path: str) -> str:
    return path + ".json"


def dtype_for(vocab: int) -> str:
    """nanoGPT's uint16 while every id fits in it, else uint32."""
    return "uint16" if vocab <= 1 << 16 else "uint32"


def _atomic(path: str, write) -> None:
    """Write under a temporary name, then rename: a reader never sees half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_tokens(path: str, tokens: bytes | bytearray, vocab: int = 256) -> TokenFile:
    """Write byte-level tokens (one byte each)."""
    def write(fh):
        fh.write(HEADER.pack(MAGIC, vocab, WIDTH))
        fh.write(tokens)
    _atomic(path, write)
    if os.path.exists(sidecar_path(path)):  # a byte-level file has none: drop a stale one
        os.remove(sidecar_path(path))
    return TokenFile(path, vocab, WIDTH, len(tokens))


def write_id_tokens(path: str, ids: np.ndarray, meta: dict) -> TokenFile:
    """Write token ids in nanoGPT's layout: the flat array, then its sidecar (which makes
    the file readable, so it comes last)."""
    vocab = int(meta["vocab"])
    dtype = dtype_for(vocab)
    if ids.size and int(ids.max()) >= vocab:
        raise ValueError(f"token id {int(ids.max())} is outside the vocab of {vocab}")
    arr = np.ascontiguousarray(ids, dtype=dtype)
    _atomic(path, lambda fh: fh.write(arr.tobytes()))
    meta = {"format": SIDECAR_FORMAT, "dtype": dtype, "vocab": vocab,
            "tokens": int(arr.size), **meta}
    _atomic(sidecar_path(path), lambda fh: fh.write(json.dumps(meta, indent=1).encode()))
    return TokenFile(path, vocab, DTYPES[dtype], int(arr.size), 0, meta)


def _sidecar(path: str, size: int) -> TokenFile:
    side = sidecar_path(path)
    try:
        with open(side) as fh:
            meta = json.load(fh)
        dtype, vocab = meta["dtype"], int(meta["vocab"])
        if meta.get("format") != SIDECAR_FORMAT or dtype not in DTYPES:
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"--data {path}: its sidecar {side} is not a {SIDECAR_FORMAT} "
                         f"file (write both with `recycle data prepare`)") from None
    width = DTYPES[dtype]
    if size % width or size // width != int(meta.get("tokens", size // width)):
        raise ValueError(f"--data {path} holds {size} bytes, not the {meta.get('tokens')} "
                         f"{dtype} tokens its sidecar says (a file from another run?)")
    if vocab > (1 << 8 * width):
        raise ValueError(f"--data {path}: vocab {vocab} does not fit its dtype {dtype}")
    return TokenFile(path, vocab, width, size // width, 0, meta)


def open_tokens(path: str) -> TokenFile:
    """Header (or sidecar) of a token file; ValueError (one line) if it is not one."""
    if not os.path.isfile(path):
        raise ValueError(f"--data {path}: no such file")
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(HEADER.size)
    if len(head) == HEADER.size and head[:8] == MAGIC:
        _, vocab, width = HEADER.unpack(head)
        if width != WIDTH:
            raise ValueError(f"--data {path}: corrupt header (token width {width}, "
                             f"{size - HEADER.size} bytes of tokens)")
        return TokenFile(path, vocab, width, (size - HEADER.size) // width)
    if os.path.isfile(sidecar_path(path)):
        return _sidecar(path, size)
    raise ValueError(f"--data {path} is not a token file (no header, no sidecar "
                     f"{os.path.basename(sidecar_path(path))}; write one with "
                     f"`recycle data prepare`)")


@lru_cache(maxsize=4)
def _mapped(path: str, dtype: str, offset: int, _mtime: int, _size: int) -> np.ndarray:
    # (mtime, size) in the key: a file replaced by `prepare --force` is mapped afresh
    return np.memmap(path, dtype=dtype, mode="r", offset=offset)


def microbatch_from(tf: TokenFile, seed: int, micro_batch_size: int, seq_len: int,
                    iteration: int, g: int) -> tuple[Tensor, Tensor]:
    """(tokens, targets) LongTensor[b, seq_len] of micro-batch g of `iteration`."""
    gen = torch.Generator().manual_seed(_seed(seed, 0x70C5, iteration, g))
    starts = torch.randint(tf.tokens - seq_len, (micro_batch_size,), generator=gen)
    data = tf.data
    rows = torch.from_numpy(np.stack([data[s:s + seq_len + 1] for s in starts.tolist()])
                            .astype(np.int64))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def data_vocab(path: str, given: Optional[int]) -> int:
    """The model's vocab when training on `path`: the token file's (its header or sidecar),
    or `given` (--vocab) when the user set one, which may be larger (nanoGPT pads its vocab)
    but not smaller."""
    tf = open_tokens(path)
    if given is not None and given < tf.vocab:
        raise ValueError(f"--data {path} holds tokens 0..{tf.vocab - 1}, more than the "
                         f"model's vocab of {given} (leave --vocab out: the token file's "
                         f"{tf.vocab} is used)")
    return tf.vocab if given is None else given


def check_data(path: str, vocab: int, micro_batch_size: int, seq_len: int,
               global_microbatches: int) -> TokenFile:
    """The token file `recycle train --data` will read, checked against the run."""
    tf = open_tokens(path)
    if tf.vocab > vocab:
        raise ValueError(f"--data {path} holds tokens 0..{tf.vocab - 1}, more than the "
                         f"model's vocab of {vocab} (leave --vocab out: the token file's "
                         f"{tf.vocab} is used)")
    need = global_microbatches * micro_batch_size * seq_len + 1
    if tf.tokens < need:
        raise ValueError(f"--data {path} holds {tf.tokens:,} tokens, too few for one global "
                         f"batch of {global_microbatches} micro-batches x {micro_batch_size} x "
                         f"{seq_len} tokens (needs at least {need:,})")
    return tf


def with_data(workload, data: str):
    """The workload reading its micro-batches from the token file `data` (TrainingSettings'
    data; unchanged when it is empty)."""
    if not data:
        return workload
    if not workload.reads_tokens:
        raise ValueError("--data feeds token ids, but this --model does not declare "
                         "reads_tokens=True (its first stage takes other inputs)")
    tf = open_tokens(data)
    def microbatch(c, iteration: int, g: int):
        return microbatch_from(tf, c.seed, c.micro_batch_size, c.seq_len, iteration, g)
    return replace(workload, microbatch=microbatch)
