"""End to end: what keeping a tied embedding/head one weight across stages costs.

A Hugging Face GPT-2 on `recycle train` workers (D=2 S=2, I/W split, staggered), its token
embedding tied to its head (stage 0 and stage 1 hold copies; the tied gradient and the
new value go through the run's store every iteration, executor/runtime/steps/tied.py) vs the
same model untied (tie_word_embeddings=false: same shapes and FLOPs, no exchange).
Interleaved runs; ms per iteration from the coordinator's iteration ends.

    PYTHONPATH=. python benchmarks/tied_exchange_ab.py [--rounds 3] [--vocab 4096] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import os

import torch
from rich.console import Console

from benchmarks.ab_table import write_ab
from executor.compute.model import ModelConfig
from executor.launch.launcher import Coordinator
from executor.inputs.launch_spec import LaunchSpec, sections
from executor.models.families import architecture
from planner.job import JobSpec

ITERS, WARMUP = 12, 3


def _name(vocab: int, tied: bool) -> str:
    return (f"hf:gpt2?n_layer=4&n_embd=64&n_head=4&vocab_size={vocab}&n_positions=64"
            f"&tie_word_embeddings={'true' if tied else 'false'}")


def _run(name: str) -> tuple[float, float]:
    shape = architecture(name, d_model=None, n_layers=None, n_heads=None, seq_len=32, vocab=None)
    cfg = ModelConfig(micro_batch_size=4, **shape)
    c = Coordinator(LaunchSpec(cfg, JobSpec.uniform(2, 2, 4), ITERS, solver="greedy",
                               deadline_s=600,
                               model=name,
                               **sections(timeout=30.0, checkpoint_every=10 ** 9)),
                  console=Console(stderr=True, quiet=True))
    res = c.run()
    ends = [c.iteration_end[i] for i in sorted(c.iteration_end)]
    return 1e3 * (ends[-1] - ends[WARMUP]) / (len(ends) - 1 - WARMUP), res.summary.losses[-1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    res: dict[str, list[float]] = {"tied (exchange)": [], "untied": []}
    losses: dict[str, set] = {k: set() for k in res}
    for _ in range(args.rounds):
        for key, tied in (("tied (exchange)", True), ("untied", False)):
            ms, loss = _run(_name(args.vocab, tied))
            res[key].append(ms)
            losses[key].add(f"{loss:.6f}")
    mb = args.vocab * 64 * 4 / 2 ** 20
    cmd = (f"PYTHONPATH=. python benchmarks/tied_exchange_ab.py --rounds {args.rounds} "
           f"--vocab {args.vocab}" + (f" --out {args.out}" if args.out else ""))
    write_ab("A weight tied across stages: the exchange's cost, end to end", cmd,
             f"`recycle train` workers (D=2 S=2 M=4, I/W split, staggered), Hugging Face GPT-2 "
             f"(4 layers, n_embd 64, vocab {args.vocab}: the tied weight is {mb:.2f} MiB, sent "
             f"twice per iteration through the store), seq 32, micro-batch 4, {ITERS} "
             f"iterations, first {WARMUP} excluded; ms per iteration from the coordinator's "
             f"iteration ends, runs interleaved; torch {torch.__version__}, {os.cpu_count()} "
             f"cores shared with other jobs (1-min load at the end {os.getloadavg()[0]:.1f}). "
             f"Final losses: " + "; ".join(f"{k} {', '.join(sorted(v))}"
                                           for k, v in losses.items())
             + " (untied is another model: its head starts from its own weights).",
             "model", res, args.out)


if __name__ == "__main__":
    main()
