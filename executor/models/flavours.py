"""Named shapes ("flavours") of the built-in families.

A flavour fixes the architecture fields of ModelConfig that shape the parameters
(d_model, n_layers, n_heads, n_kv_heads, ffn_hidden, vocab) and gives a default seq_len
(the context it is meant to train at; --seq-len may change it, since no parameter depends
on it and a short one lets the big flavours be profiled on a CPU). `params` is the
published or intended parameter count, which tests/test_llama.py holds the build to.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flavour:
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    params: int  # expected parameter count (untied head), for the record and the tests
    note: str = ""

    def shape(self) -> dict:
        """The ModelConfig fields this flavour sets."""
        return dict(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                    n_kv_heads=self.n_kv_heads, ffn_hidden=self.ffn_hidden, vocab=self.vocab,
                    seq_len=self.seq_len)


LLAMA = {
    # trains in seconds on a CPU; vocab 256 reads byte-level token files
    "debug": Flavour(d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=192,
                     vocab=256, seq_len=32, params=229_952,
                     note="CPU tests and demos"),
    # GPT-2-small-sized Llama with a 32k vocabulary (as Llama 2's tokenizer)
    "125m": Flavour(d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_hidden=2048,
                    vocab=32_000, seq_len=2048, params=125_000_000,
                    note="d 768, 12 layers, GQA 12/4"),
    # TinyLlama-1.1B's shape (untied head; published count 1,100,048,384)
    "1b": Flavour(d_model=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_hidden=5632,
                  vocab=32_000, seq_len=2048, params=1_100_048_384,
                  note="TinyLlama-1.1B"),
    # Llama-3-8B's shape (published count 8,030,261,248)
    "8b": Flavour(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14_336,
                  vocab=128_256, seq_len=8192, params=8_030_261_248,
                  note="Llama-3-8B"),
}
