"""`recycle data prepare TEXT_FILES... --out FILE` (hooked in by recycle/cli.py)."""
from __future__ import annotations

from typing import List, Optional

import typer

from recycle.commands.errors import user_errors


def register(app: typer.Typer) -> None:
    data = typer.Typer(help="Training data: token files for `recycle train --data`.",
                       no_args_is_help=True)
    data.command("prepare")(prepare_cmd)
    app.add_typer(data, name="data")


def prepare_cmd(
    paths: List[str] = typer.Argument(..., help="text files, or directories to search for --glob files"),
    out: str = typer.Option(..., "--out", "-o", help="token file to write"),
    glob: str = typer.Option("*.py", "--glob", help="which files to take from a directory"),
    max_mb: float = typer.Option(0.0, "--max-mb", help="take at most this many MB of text (0: no limit); byte-level, that is the token file's size"),
    force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="bpe:VOCAB: train a byte-level BPE tokenizer (Hugging Face tokenizers) on the files; or a tokenizer.json to use. Writes nanoGPT's layout (flat uint16/uint32 ids, OUT.json sidecar, OUT.tokenizer.json). Default: byte-level tokens, vocab 256"),
):
    """Tokenize text files into one memory-mapped token file for `recycle train --data`."""
    from executor.data.prepare import prepare

    with user_errors("data prepare"):
        if tokenizer is not None:
            from executor.data.tokenizer import encode
            res = encode(paths, out, tokenizer, pattern=glob, max_bytes=int(max_mb * 1e6),
                         force=force)
        else:
            res = prepare(paths, out, pattern=glob, max_bytes=int(max_mb * 1e6), force=force)
    tf = res.token_file
    if tokenizer is not None:
        typer.echo(f"wrote {tf.path}: {tf.tokens:,} tokens ({tf.dtype}, vocab {tf.vocab}, "
                   f"{tokenizer}) from {res.files} files"
                   + (f", {res.skipped} skipped (not text)" if res.skipped else "")
                   + f"; sidecar {tf.path}.json, tokenizer {res.tokenizer}")
        return
    typer.echo(f"wrote {tf.path}: {tf.tokens:,} tokens (byte-level, vocab {tf.vocab}) from "
               f"{res.files} files" + (f", {res.skipped} skipped (not text)" if res.skipped else ""))
