"""`recycle data prepare --tokenizer`: real token ids with Hugging Face `tokenizers`.

`bpe:VOCAB` trains a byte-level BPE tokenizer (GPT-2's scheme: a 256-byte base alphabet,
so every text has a tokenization; merges learned from the corpus itself, offline) with
`<|endoftext|>` as id 0; `FILE.json` loads a tokenizer a user already has (any
`tokenizers` JSON, e.g. a Hugging Face model's tokenizer.json). Either way the documents
are encoded, each followed by the end-of-text id where the tokenizer has one (the byte
path's NUL separator), and written in nanoGPT's layout with the tokenizer beside them
(executor/data/token_file.py).
"""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass

import numpy as np

from executor.data.prepare import check_out, read_documents
from executor.data.token_file import TokenFile, sidecar_path, write_id_tokens

EOT = "<|endoftext|>"
# end-of-text names of common tokenizers, for a tokenizer.json that is not ours
EOT_NAMES = (EOT, "<|end_of_text|>", "</s>", "<eos>", "[SEP]")
MIN_BPE_VOCAB = 256 + 1  # the byte alphabet and <|endoftext|>
MAX_BPE_VOCAB = 1 << 20
SPEC_HELP = "bpe:VOCAB (train a byte-level BPE on the files) or a tokenizer.json file"


@dataclass
class Encoded:
    token_file: TokenFile
    files: int
    skipped: int
    tokenizer: str  # the tokenizer file written beside the tokens


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ValueError("--tokenizer needs Hugging Face `tokenizers`: "
                         "pip install 'recycle[tokens]'") from None
    return tokenizers


def parse_spec(spec: str) -> tuple[str, int | str]:
    """("bpe", VOCAB) or ("file", PATH); ValueError (one line) for anything else."""
    head, sep, tail = spec.partition(":")
    if sep and head == "bpe":
        if not tail.isdigit():
            raise ValueError(f"--tokenizer {spec}: VOCAB must be a whole number ({SPEC_HELP})")
        vocab = int(tail)
        if vocab < MIN_BPE_VOCAB:
            raise ValueError(f"--tokenizer {spec}: vocab too small; byte-level BPE needs "
                             f"at least {MIN_BPE_VOCAB} (256 bytes and {EOT})")
        if vocab > MAX_BPE_VOCAB:
            raise ValueError(f"--tokenizer {spec}: vocab too large (at most {MAX_BPE_VOCAB:,})")
        return "bpe", vocab
    if spec.endswith(".json") or os.sep in spec:
        if not os.path.isfile(spec):
            raise ValueError(f"--tokenizer {spec}: no such file")
        return "file", spec
    raise ValueError(f"--tokenizer {spec}: unknown tokenizer (use {SPEC_HELP})")


def train_bpe(docs: list[bytes], vocab: int):
    """A byte-level BPE of at most `vocab` ids learned from `docs` (fewer when the corpus
    has fewer pairs worth merging)."""
    tk = _tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT],
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     show_progress=False)
    tok.train_from_iterator((d.decode("utf-8") for d in docs), trainer=trainer,
                            length=len(docs))
    return tok


def load_tokenizer(path: str):
    tk = _tokenizers()
    try:
        return tk.Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises its own Exception subclass
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"--tokenizer {path} is not a `tokenizers` JSON file ({first})") from None


def end_of_text(tok) -> int | None:
    for name in EOT_NAMES:
        i = tok.token_to_id(name)
        if i is not None:
            return i
    return None


def encode(paths: list[str], out: str, spec: str, *, pattern: str = "*.py",
           max_bytes: int = 0, force: bool = False) -> Encoded:
    kind, arg = parse_spec(spec)  # bad specs are refused before any file is read
    check_out(out, force)
    docs, skipped = read_documents(paths, pattern, max_bytes)
    tok = train_bpe(docs, arg) if kind == "bpe" else load_tokenizer(arg)
    eot = end_of_text(tok)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    ids = []
    for enc in tok.encode_batch([d.decode("utf-8") for d in docs], add_special_tokens=False):
        ids.append(np.asarray(enc.ids, dtype=np.int64))
        if eot is not None:
            ids.append(np.array([eot], dtype=np.int64))
    tok_path = out + ".tokenizer.json"
    if kind == "bpe":
        tok.save(tok_path)
    else:
        shutil.copyfile(arg, tok_path)  # the exact file the user gave
    with open(tok_path, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    meta = {"vocab": vocab, "tokenizer": os.path.basename(tok_path), "tokenizer_sha256": digest,
            "tokenizer_spec": spec if kind == "bpe" else f"file:{os.path.basename(arg)}",
            "end_of_text": eot, "documents": len(docs)}
    tf = write_id_tokens(out, np.concatenate(ids), meta)
    return Encoded(tf, len(docs), skipped, tok_path)


def tokenizer_of(path: str):
    """The tokenizer a token file was written with (its sidecar names the file beside it)."""
    import json
    with open(sidecar_path(path)) as fh:
        meta = json.load(fh)
    return load_tokenizer(os.path.join(os.path.dirname(os.path.abspath(path)), meta["tokenizer"]))
