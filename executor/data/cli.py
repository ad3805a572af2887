"""`recycle data prepare TEXT_FILES... --out FILE` (hooked in by recycle/cli.py)."""
from __future__ import annotations

from typing import List

import typer

from planner.commands.cli_errors import user_errors


def register(app: typer.Typer) -> None:
    data = typer.Typer(help="Training data: token files for `recycle train --data`.",
                       no_args_is_help=True)
    data.command("prepare")(prepare_cmd)
    app.add_typer(data, name="data")


def prepare_cmd(
    paths: List[str] = typer.Argument(..., help="text files, or directories to search for --glob files"),
    out: str = typer.Option(..., "--out", "-o", help="token file to write"),
    glob: str = typer.Option("*.py", "--glob", help="which files to take from a directory"),
    max_mb: float = typer.Option(0.0, "--max-mb", help="stop before the token file passes this many MB (0: no limit)"),
    force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
):
    """Tokenize text files byte by byte (vocab 256) into one memory-mapped token file."""
    from executor.data.prepare import prepare

    with user_errors("data prepare"):
        res = prepare(paths, out, pattern=glob, max_bytes=int(max_mb * 1e6), force=force)
    tf = res.token_file
    typer.echo(f"wrote {tf.path}: {tf.tokens:,} tokens (byte-level, vocab {tf.vocab}) from "
               f"{res.files} files" + (f", {res.skipped} skipped (not text)" if res.skipped else ""))
