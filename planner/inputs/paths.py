"""Output paths checked before the work: a result is never computed only to be lost."""
from __future__ import annotations

import os

from planner.errors import UserError


def check_writable(path: str, flag: str) -> None:
    """Refuse (ValueError, one line) a file path that cannot be written."""
    full = os.path.abspath(path)
    parent = os.path.dirname(full)
    if os.path.isdir(full):
        raise UserError(f"{flag} {path}: is a directory, expected a file path")
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path}: no such directory {parent}")
    if not os.access(parent, os.W_OK) or (os.path.exists(full) and not os.access(full, os.W_OK)):
        raise UserError(f"{flag} {path}: not writable")


def check_directory(path: str, flag: str) -> None:
    """Refuse a path that should be (or become) a writable directory."""
    full = os.path.abspath(path)
    if os.path.exists(full) and not os.path.isdir(full):
        raise UserError(f"{flag} {path}: exists and is not a directory")
    probe = full
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK):
        raise UserError(f"{flag} {path}: cannot create or write in {probe}")
