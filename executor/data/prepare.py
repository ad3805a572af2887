"""`recycle data prepare`: text files -> one byte-level token file.

Byte-level tokenizer: a token is a byte of the UTF-8 text (vocab 256), so every text has a
tokenization and no vocabulary file is needed. Documents are separated by a NUL byte (0),
which no text file contains: the model sees where one file ends and the next begins.
"""
from __future__ import annotations

import fnmatch
import os
import sysconfig
from dataclasses import dataclass

from executor.data.token_file import TokenFile, write_tokens

SEPARATOR = b"\0"


@dataclass
class Prepared:
    token_file: TokenFile
    files: int
    skipped: int  # not text (not UTF-8, or containing NUL)


def text_files(paths: list[str], pattern: str) -> list[str]:
    """The files named, and under each directory named those matching `pattern`, sorted
    (the token file is the same whatever order the file system lists them in)."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs.sort()
                found += [os.path.join(root, f) for f in files if fnmatch.fnmatch(f, pattern)]
            if not found:
                raise ValueError(f"{p}: no file matching {pattern!r} under it")
            out += sorted(found)
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise ValueError(f"{p}: no such file or directory")
    if not out:
        raise ValueError("no text files given")
    return out


def check_out(out: str, force: bool) -> None:
    """--out is writable and not replaced by accident (checked before any work)."""
    if os.path.isdir(out):
        raise ValueError(f"--out {out} is a directory")
    if os.path.exists(out) and not force:
        raise ValueError(f"--out {out} exists; pass --force to replace it")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise ValueError(f"--out {out}: cannot write in {parent}")


def read_documents(paths: list[str], pattern: str, max_bytes: int) -> tuple[list[bytes], int]:
    """The UTF-8 text of each file in order (at most `max_bytes` with one separator each,
    0: no limit), and how many files were skipped as not text."""
    if max_bytes < 0:
        raise ValueError(f"--max-mb must be positive, not {max_bytes / 1e6:g}")
    docs, size, skipped = [], 0, 0
    for path in text_files(paths, pattern):
        with open(path, "rb") as fh:
            raw = fh.read()
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        if SEPARATOR in raw or not raw:
            skipped += 1
            continue
        if max_bytes and size + len(raw) + 1 > max_bytes:
            break
        docs.append(raw)
        size += len(raw) + 1
    if not docs:
        raise ValueError("the files hold no text (all empty, binary or over --max-mb)")
    return docs, skipped


def prepare(paths: list[str], out: str, *, pattern: str = "*.py", max_bytes: int = 0,
            force: bool = False) -> Prepared:
    """Byte-level: the documents' bytes, each followed by the NUL separator."""
    check_out(out, force)
    docs, skipped = read_documents(paths, pattern, max_bytes)
    buf = b"".join(d + SEPARATOR for d in docs)
    return Prepared(write_tokens(out, buf), len(docs), skipped)


def stdlib_dir() -> str:
    """The Python standard library's source: real text every machine with Python has."""
    return sysconfig.get_paths()["stdlib"]
