"""`recycle train` and `recycle profile` (hooked into the console command by recycle/cli.py).

torch is imported inside the commands so that `recycle plan` stays fast.
"""
from __future__ import annotations

from typing import List, Optional

import typer

from planner.commands.cli_errors import EXIT_NO_PLAN, user_errors
from planner.solvers.timeline import Mode


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("profile")(profile_cmd)


def _model(d_model, layers, heads, seq_len, micro_batch_size, vocab, seed, lr):
    from executor.compute.model import ModelConfig
    return ModelConfig(vocab=vocab, seq_len=seq_len, d_model=d_model, n_heads=heads,
                       n_layers=layers, micro_batch_size=micro_batch_size, seed=seed, lr=lr)


def train_cmd(
    replicas: int = typer.Option(2, "--replicas", "-d", help="data-parallel replicas D"),
    stages: int = typer.Option(2, "--stages", "-s", help="pipeline stages S"),
    microbatches: int = typer.Option(4, "--microbatches", "-m", help="micro-batches per replica M"),
    iterations: int = typer.Option(5, help="training iterations (one global batch each)"),
    kill: List[str] = typer.Option([], "--kill", help="SIGKILL worker R:S mid-iteration ITER: R:S@ITER (repeatable)"),
    rejoin: List[str] = typer.Option([], "--rejoin", help="restart worker R:S when it dies, back in the plan at ITER: R:S@ITER (repeatable: each entry serves one death)"),
    slow: List[str] = typer.Option([], "--slow", help="make worker R:S really slower from iteration ITER, to FACTOR of its speed (1 ends it): R:S@ITER:FACTOR (repeatable)"),
    detect_stragglers: bool = typer.Option(True, "--detect-stragglers/--no-detect-stragglers", help="measure each worker's speed and re-plan around slow ones (without a service)"),
    stall: List[str] = typer.Option([], "--stall", help="SIGSTOP worker R:S mid-iteration ITER, SIGCONT it SECONDS later: R:S@ITER:SECONDS"),
    summary: Optional[str] = typer.Option(None, "--summary", help="write {losses, param_checksums} JSON here"),
    reference: bool = typer.Option(False, "--reference", help="train in one process (ground truth), same summary"),
    resume: Optional[str] = typer.Option(None, "--resume", help="checkpoint written when a whole stage was lost"),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="where to write that checkpoint (default: in the run dir)"),
    solver: str = typer.Option("greedy", help="planner back-end: greedy, 1f1b, cpsat, milp"),
    no_split: bool = typer.Option(False, "--no-split", help="fused backward (B): no I/W split"),
    sync: bool = typer.Option(False, "--sync", help="plan for a synchronous optimizer"),
    timeout: float = typer.Option(5.0, help="seconds before a silent peer counts as failed"),
    job: Optional[str] = typer.Option(None, "--job", help="job spec JSON (e.g. from `recycle profile`)"),
    run_dir: Optional[str] = typer.Option(None, help="worker logs and stage states (default: a temp dir)"),
    external: bool = typer.Option(False, help="do not spawn workers: wait for torchrun'd `python -m executor.worker`"),
    store_port: int = typer.Option(0, help="port of the coordinator's store (0: any free port)"),
    service: Optional[str] = typer.Option(None, "--service", help="workers take plans from, and report failures to, `recycle serve` at this URL"),
    job_id: Optional[str] = typer.Option(None, "--job-id", help="the job's id at --service"),
    token: Optional[str] = typer.Option(None, "--token", envvar="RECYCLE_TOKEN", help="the job's worker token at --service"),
    d_model: int = typer.Option(32), layers: int = typer.Option(4), heads: int = typer.Option(2),
    seq_len: int = typer.Option(16), micro_batch_size: int = typer.Option(4),
    vocab: int = typer.Option(64), seed: int = typer.Option(0), lr: float = typer.Option(3e-3),
):
    """Train a small GPT on a DxS grid of worker processes, surviving injected failures."""
    from rich.console import Console

    from executor.launch.faults import check_faults, parse_slow
    from executor.launch.launcher import parse_event, parse_stall, read_checkpoint, train
    from planner.job import JobSpec

    console = Console(stderr=True)
    with user_errors("train options"):
        if iterations < 1:
            raise ValueError(f"--iterations must be at least 1, not {iterations}")
        if not timeout > 0:
            raise ValueError(f"--timeout must be positive, not {timeout:g}")
        cfg = _model(d_model, layers, heads, seq_len, micro_batch_size, vocab, seed, lr)
        kills = [parse_event(k) for k in kill]
        rejoins = [parse_event(r) for r in rejoin]
        stalls = [parse_stall(s) for s in stall]
        slows = [parse_slow(s) for s in slow]
        spec = JobSpec.load(job) if job else None
        watch = None
        if service:  # workers poll, heartbeat and report to the service themselves
            from executor.sources.service_source import ServiceWatch
            if not (job_id and token):
                raise ValueError("--service needs --job-id and --token")
            watch = ServiceWatch(service, job_id, token, timeout_s=max(30.0, timeout))
            spec = spec or watch.plan.job
            replicas, stages, microbatches = spec.replicas, spec.stages, spec.microbatches
        spec = spec or JobSpec.uniform(replicas, stages, microbatches)
        check_faults(replicas, stages, iterations, kills, rejoins, stalls, slows)
        if resume:
            read_checkpoint(resume, spec, iterations)
    if reference:
        from executor.compute.reference import train_reference
        result = train_reference(cfg, replicas, microbatches, iterations, stages)
        for i, loss in enumerate(result.losses):
            console.print(f"iter {i:>4}  loss {loss:.5f}  (reference)")
        if summary:
            result.save(summary)
        return
    if external:
        console.print("[bold]coordinator[/] waiting for workers: RECYCLE_STORE=<this host>:"
                      f"{store_port or '?'} torchrun ... -m executor.worker")
    result = train(cfg, replicas, stages, microbatches, iterations, kills, rejoins, summary,
                   job=spec, solver=solver, timeout=timeout, resume=resume,
                   checkpoint_path=checkpoint, run_dir=run_dir, external=external,
                   store_port=store_port, console=console, service=watch, stalls=stalls,
                   slows=slows, detect_stragglers=detect_stragglers,
                   mode=Mode(split_backward=not no_split, staggered=not sync))
    if result.halted:
        raise typer.Exit(EXIT_NO_PLAN)
    console.print(f"done: {iterations} iterations, final loss {result.summary.losses[-1]:.5f}, "
                  f"{result.versions} plan versions; logs in {result.run_dir}"
                  + (f"; summary in {summary}" if summary else ""))


def profile_cmd(
    out: str = typer.Option("job.json", "--out", "-o", help="job spec JSON to write"),
    replicas: int = typer.Option(2, "--replicas", "-d"),
    stages: int = typer.Option(2, "--stages", "-s"),
    microbatches: int = typer.Option(4, "--microbatches", "-m"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    d_model: int = typer.Option(32), layers: int = typer.Option(4), heads: int = typer.Option(2),
    seq_len: int = typer.Option(16), micro_batch_size: int = typer.Option(4),
    vocab: int = typer.Option(64), seed: int = typer.Option(0), lr: float = typer.Option(3e-3),
):
    """Measure F/I/W/OPT of each stage and write a job spec for `recycle plan` / `train --job`."""
    from executor.compute.profile import profile

    cfg = _model(d_model, layers, heads, seq_len, micro_batch_size, vocab, seed, lr)
    spec = profile(cfg, stages, replicas, microbatches, device=device)
    with open(out, "w") as fh:
        fh.write(spec.model_dump_json(indent=1))
    typer.echo(f"wrote {out}: F={spec.cost.F} I={spec.cost.I} W={spec.cost.W} OPT={spec.cost.OPT}")
