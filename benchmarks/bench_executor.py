"""`python -m benchmarks.bench_executor`: the runtime vs torch.distributed.pipelining (see
benchmarks/executor_bench.py). A benchmark, not a part of the product: nothing in planner/,
executor/, api/ or recycle/ imports benchmarks/ (tests/test_import_rules.py)."""
from __future__ import annotations

import os
import sys
from typing import Optional

import typer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def bench_executor_cmd(
    out: str = typer.Option("benchmarks/results/executor.md", help="results table (markdown; JSON next to it)"),
    stages: int = typer.Option(2, help="pipeline stages S (processes per replica)"),
    microbatches: int = typer.Option(4, help="micro-batches per replica per iteration"),
    iterations: int = typer.Option(12, help="iterations per run"),
    warmup: int = typer.Option(3, help="first iterations excluded from timing"),
    d_model: Optional[int] = typer.Option(None, help="[default: the --model flavour's, else 128]"),
    layers: Optional[int] = typer.Option(None, help="[default: the --model flavour's, else 4]"),
    seq_len: Optional[int] = typer.Option(None, help="[default: the --model flavour's, else 64]"),
    micro_batch_size: int = typer.Option(8),
    solver: str = typer.Option("greedy", help="planner back-end the runtime plans with"),
    rounds: int = typer.Option(2, help="interleaved rounds of the 1F1B vs ReCycle D=1 head to head (best kept)"),
    model: str = typer.Option("gpt", "--model", help="the Workload to train: a built-in NAME[:FLAVOUR] or package.module:factory (as recycle train --model)"),
):
    """Failure-free 1F1B / zero-bubble (torch) vs ReCycle's runtime, planned vs realised
    period under 0, 1 and 2 failures."""
    if ROOT not in sys.path:  # benchmarks/ lives next to the packages, not inside one
        sys.path.insert(0, ROOT)
    from benchmarks.executor_bench import bench_config, run_executor_bench
    from executor.inputs.workload_name import check_workload

    try:  # a --model that does not load or builds unlike itself: one line, exit 2
        check_workload(model, bench_config(model, d_model, layers, seq_len, micro_batch_size),
                       stages)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    run_executor_bench(out, stages=stages, microbatches=microbatches, iterations=iterations,
                       warmup=warmup, d_model=d_model, n_layers=layers, seq_len=seq_len,
                       micro_batch_size=micro_batch_size, solver=solver, rounds=rounds,
                       model=model)


if __name__ == "__main__":
    app()
