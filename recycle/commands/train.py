"""`recycle train` and `recycle profile` (hooked into the console command by recycle/cli.py).

torch is imported inside the commands so that `recycle plan` stays fast.
"""
from __future__ import annotations

import os
from typing import List, Optional

import typer

from planner.errors import EXIT_BAD_INPUT, EXIT_MODEL_ERROR, EXIT_NO_PLAN
from recycle.commands.errors import user_errors


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("profile")(profile_cmd)


def _resumed(ctx: typer.Context, value: Optional[str]) -> Optional[str]:
    """--resume DIR (eager: read before the other flags): every flag left out takes the
    checkpoint's value, so the command printed after a halt continues the run as given."""
    if value and not ctx.resilient_parsing:
        from executor.checkpoint.manifest import Manifest, resolve
        from executor.inputs.train_options import resumed_defaults
        with user_errors("train options"):
            man = Manifest.load(resolve(value))
        ctx.meta["resumed"] = man
        ctx.default_map = {**(ctx.default_map or {}), **resumed_defaults(man)}
    return value


def _from_resume(ctx: typer.Context, name: str) -> bool:
    """Did flag `name` take its value from the default map (--resume's or --config's)?
    By the source's name: typer vendors its own click, whose ParameterSource is not
    click's (compared with click's enum this was never true)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "DEFAULT_MAP"


def _configured(ctx: typer.Context, value: Optional[str]) -> Optional[str]:
    """--config FILE (eager): its settings become the defaults of the flags left out, so
    flags given override it; a --resume checkpoint's settings win over it."""
    if value and not ctx.resilient_parsing:
        from executor.inputs.run_config import read_config
        with user_errors("train options"):
            ctx.default_map = {**read_config(value), **(ctx.default_map or {})}
    return value


_ARCH = "default: the --model flavour's, else {}"
AC_HELP = ("none, full (every block's forward is recomputed in backward, keeping only its "
           "input), or selective[:N] (every N-th block; N=2 by default): less activation "
           "memory for more compute, the same numbers (recomputed once, in I)")
# The model options of `train` and `profile` (one definition for both commands).
MODEL_OPTION = typer.Option("gpt", "--model", help="NAME[:FLAVOUR]: gpt, llama (= llama:debug), llama:125m, llama:1b, llama:8b, or an import path package.module:factory returning an executor.compute.model.Workload (docs/executor.md)")
D_MODEL_OPTION = typer.Option(None, "--d-model", help=_ARCH.format(32))
LAYERS_OPTION = typer.Option(None, "--layers", help=_ARCH.format(4))
HEADS_OPTION = typer.Option(None, "--heads", help=_ARCH.format(2))
SEQ_LEN_OPTION = typer.Option(None, "--seq-len", help="default: the --model flavour's (which it may shorten), else 16")
VOCAB_OPTION = typer.Option(None, "--vocab", help=_ARCH.format(64))


def train_cmd(
    ctx: typer.Context,
    config: Optional[str] = typer.Option(None, "--config", is_eager=True, callback=_configured, help="a run's settings from a TOML (or .json) file with sections \\[grid] \\[model] \\[optimizer] \\[schedule] \\[clipping] \\[data] \\[checkpoint] \\[faults] \\[comm] \\[service] \\[plan] \\[output], each setting named as its flag (--d-model is \\[model] d_model); flags given override it. Every run writes its own as RUN_DIR/run.toml"),
    replicas: Optional[int] = typer.Option(None, "--replicas", "-d", help="data-parallel replicas D [default: 2, or the --job's]"),
    stages: Optional[int] = typer.Option(None, "--stages", "-s", help="pipeline stages S [default: 2, or the --job's]"),
    microbatches: Optional[int] = typer.Option(None, "--microbatches", "-m", help="micro-batches per replica M [default: 4, or the --job's]"),
    iterations: int = typer.Option(5, help="training iterations (one global batch each)"),
    kill: List[str] = typer.Option([], "--kill", help="SIGKILL worker R:S mid-iteration ITER: R:S@ITER (repeatable)"),
    rejoin: List[str] = typer.Option([], "--rejoin", help="bring worker R:S back after it dies: its death is a failure first, the run trains re-routed without it until it reaches iteration ITER, then a new process is started, loads its stage from a live peer and is in the plan from ITER on (with --external the node's torchrun restarts it; training waits before ITER until it is back): R:S@ITER (repeatable: each entry serves one death)"),
    restart: List[str] = typer.Option([], "--restart", help="like --rejoin, but the new process starts as soon as the death is in a plan, and is back as soon as it is up (training waits before iteration ITER until it is): R:S@ITER (repeatable)"),
    slow: List[str] = typer.Option([], "--slow", help="make worker R:S really slower from iteration ITER, to FACTOR of its speed (1 ends it): R:S@ITER:FACTOR (repeatable)"),
    detect_stragglers: bool = typer.Option(True, "--detect-stragglers/--no-detect-stragglers", help="measure each worker's speed and re-plan around slow ones (without a service)"),
    stall: List[str] = typer.Option([], "--stall", help="SIGSTOP worker R:S mid-iteration ITER, SIGCONT it SECONDS later: R:S@ITER:SECONDS"),
    trace: Optional[str] = typer.Option(None, "--trace", help="replay a spot trace (t_ms,add|remove,nodeN, e.g. Bamboo's EC2 traces) on the workers: a node removed SIGKILLs its workers, a node added starts new ones, which join with no state; nodes hold --gpus-per-node workers"),
    trace_start: str = typer.Option("0", "--trace-start", help="where in the trace the window starts (6h, 30m, 90s): the nodes up then are the run's starting workers"),
    trace_hours: float = typer.Option(1.0, "--trace-hours", help="hours of the trace replayed"),
    gpus_per_node: int = typer.Option(1, "--gpus-per-node", help="workers a node of the --trace holds"),
    placement: str = typer.Option("stages", "--placement", help="stages: a --trace node holds G stages of one replica; replicas: one stage of G replicas"),
    time_scale: float = typer.Option(60.0, "--time-scale", help="trace seconds per wall-clock second of the replay (60: an hour of the trace in a minute)"),
    summary: Optional[str] = typer.Option(None, "--summary", help="write {losses, param_checksums} JSON here"),
    reference: bool = typer.Option(False, "--reference", help="train in one process (ground truth), same summary"),
    resume: Optional[str] = typer.Option(None, "--resume", is_eager=True, callback=_resumed, help="continue from this checkpoint directory (or the newest one under it) with its grid, job, model and settings; of the flags given, --lr and the other training settings (schedule, --iterations, --clip, --precision) are honoured, others must match"),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", "--checkpoint", help="where checkpoints (torch.distributed.checkpoint) go (default: RUN_DIR/checkpoints)"),
    checkpoint_every: int = typer.Option(1, "--checkpoint-every", help="checkpoint every N iterations (and the last); a halt resumes from the newest"),
    snapshot_every: str = typer.Option("auto", "--snapshot-every", help="every K iterations also keep each stage's parameters and optimizer state in the host memory of a worker elsewhere (peer-memory snapshots, sent in the background), so a stage lost whole is restored without a disk: auto (K from the measured cost of a snapshot: the smallest K whose snapshot costs about 1-2% of an iteration), off, or K"),
    snapshot_memory: str = typer.Option("25%", "--snapshot-memory", help="host memory the snapshots may take, shared by the workers of a host: a share (25%) or a size (8G); auto turns them off above it"),
    log_memory: str = typer.Option("10%", "--log-memory", help="host memory each host's workers may keep boundary logs in (the activations and gradients they sent since the second-newest snapshot), so a stage lost whole is replayed alone from its snapshot while the others keep their work: a share (10%), a size (2G), or off (the job then rolls back to the snapshot)"),
    solver: str = typer.Option("greedy", help="planner back-end: greedy, 1f1b, cpsat, milp"),
    shape: str = typer.Option("auto", "--shape", help="auto: when fewer live workers are left than stages, the pipeline is cut into fewer, deeper stages (state moved by parameter name) instead of pausing; fixed: the stage count never changes (it pauses for restarts, or halts)"),
    no_split: bool = typer.Option(False, "--no-split", help="fused backward (B): no I/W split"),
    sync: bool = typer.Option(False, "--sync", help="synchronous optimizer: plans for it, and a barrier after every iteration"),
    timeout: float = typer.Option(5.0, help="seconds before a silent peer counts as failed"),
    job: Optional[str] = typer.Option(None, "--job", help="job spec JSON (e.g. from `recycle profile`)"),
    run_dir: Optional[str] = typer.Option(None, help="worker logs and stage states (default: a temp dir)"),
    device: str = typer.Option("auto", "--device", help="auto (CUDA if present), cpu or cuda: where workers compute (--reference: cuda on the GPU, else the CPU)"),
    external: bool = typer.Option(False, help="do not spawn workers: wait for torchrun'd `python -m executor.worker`"),
    store_port: int = typer.Option(0, help="port of the coordinator's store (0: any free port)"),
    service: Optional[str] = typer.Option(None, "--service", help="workers take plans from, and report failures to, `recycle serve` at this URL"),
    job_id: Optional[str] = typer.Option(None, "--job-id", help="the job's id at --service"),
    token: Optional[str] = typer.Option(None, "--token", envvar="RECYCLE_TOKEN", help="the job's worker token at --service"),
    model: str = MODEL_OPTION,
    d_model: Optional[int] = D_MODEL_OPTION, layers: Optional[int] = LAYERS_OPTION,
    heads: Optional[int] = HEADS_OPTION, seq_len: Optional[int] = SEQ_LEN_OPTION,
    micro_batch_size: int = typer.Option(4), vocab: Optional[int] = VOCAB_OPTION,
    seed: int = typer.Option(0), lr: float = typer.Option(3e-3),
    precision: str = typer.Option("fp32", "--precision", help="fp32, or bf16 (autocast; fp32 master weights and gradients)"),
    activation_checkpointing: Optional[str] = typer.Option(None, "--activation-checkpointing", help=AC_HELP + " [default: the --job's, else none]"),
    lr_schedule: str = typer.Option("constant", "--lr-schedule", help="constant, or cosine decay to --min-lr-ratio x --lr after --warmup"),
    warmup: int = typer.Option(0, "--warmup", help="iterations of linear learning-rate warm-up"),
    min_lr_ratio: Optional[float] = typer.Option(None, "--min-lr-ratio", help="cosine floor as a fraction of --lr [default: 0.1]"),
    clip: float = typer.Option(0.0, "--clip", help="clip gradients to this global norm over the whole model (0: off)"),
    data: Optional[str] = typer.Option(None, "--data", help="token file from `recycle data prepare`; the model's vocab is the file's unless --vocab is given (default: the model's synthetic data)"),
    split: Optional[str] = typer.Option(None, "--split", help="stage boundaries: layers (equal layer counts) or balanced (on the per-layer costs of a --job from `recycle profile --split balanced`); default: balanced if the --job has per-layer costs, else layers"),
):
    """Train a model (--model; default: the small built-in GPT) on a DxS grid of worker
    processes, surviving injected failures."""
    from rich.console import Console

    from executor.inputs.resolve import resolve
    from executor.inputs.run_config import RunConfig
    from executor.launch.launcher import train

    console = Console(stderr=True)
    resumed = ctx.meta.get("resumed")  # the checkpoint's manifest (_resumed)
    params = dict(ctx.params)  # flags given, else --config's, else --resume's, else defaults
    if resumed is not None and params.get("replicas") != resumed.replicas and (
            _from_resume(ctx, "microbatches")):
        # another grid: M follows so that the global batch stays the checkpoint's (when
        # no M does, read_checkpoint refuses the run in one line)
        from executor.checkpoint.manifest import resumed_microbatches
        params["microbatches"] = resumed_microbatches(resumed, params["replicas"]) or \
            params["microbatches"]
    if resumed is not None and lr_schedule != "cosine" and (
            _from_resume(ctx, "min_lr_ratio")):
        params["min_lr_ratio"] = None  # the checkpoint's cosine floor; another schedule now
    with user_errors("train options"):
        run = resolve(RunConfig.from_flags(params), resumed=resumed, token=token)
    for warning in run.warnings:  # randomness the runtime cannot key: named, not ignored
        console.print(f"warning: {warning}", markup=False, soft_wrap=True)
    for note in run.notes:
        console.print(note)
    launch = run.launch
    if reference:
        import torch

        from executor.compute.one_process.reference import train_reference
        # the workers' thread count (executor/worker.py): matmuls sum in another order on
        # more threads, and Adam turns that rounding into lr-sized steps where a gradient
        # is near 0 (a GPT with vocab 8192 drifted 0.004 from its own workers on 2 cores)
        torch.set_num_threads(int(os.environ.get("RECYCLE_THREADS", "1")))
        # on the GPU only when asked by name: "auto" kept the reference on the CPU before
        job = launch.job
        result = train_reference(launch.cfg, job.replicas, job.microbatches, iterations,
                                 job.stages, training=launch.training, workload=run.workload,
                                 device="cuda" if device == "cuda" else "cpu")
        for i, loss in enumerate(result.losses):
            console.print(f"iter {i:>4}  loss {loss:.5f}  (reference)")
        if summary:
            result.save(summary)
        return
    result = train(launch, console=console, service=run.watch)
    if result.model_exception:  # the model's code raised: a bug to fix, not a failure
        raise typer.Exit(EXIT_MODEL_ERROR)
    if result.halted:  # a model that breaks its own activation spec is bad input
        raise typer.Exit(EXIT_BAD_INPUT if result.model_error else EXIT_NO_PLAN)
    el = result.summary.elastic or {}
    console.print(f"done: {iterations} iterations, final loss {result.summary.losses[-1]:.5f}, "
                  f"{result.versions} plan versions"
                  + (f", {el['moves']} moves, {el['snapshot_restores']} snapshot restores "
                     f"({el['retrained_iterations']} iterations trained again)"
                     if el.get("moves") or el.get("snapshot_restores") else "")
                  + (f", {el['replays']} replay(s) of a lost stage ({el['replayed_iterations']} "
                     f"iterations replayed in {el['replay_s']:.2f} s)" if el.get("replays") else "")
                  + (f", paused {el['pauses']} time(s) for {el['paused_s']:.1f} s"
                     if el.get("pauses") else "")
                  + (f"; snapshots every {el['snapshot_every']} "
                     f"({el['snapshot_mib_per_worker']:.1f} MiB a worker"
                     + (f", boundary logs {el['log_mib_per_worker']:.1f} MiB"
                        if el.get("log_mib_per_worker") else "") + ")"
                     if el.get("snapshot_every") not in (None, 0, "off") else "")
                  + f"; {el.get('samples', '?')} samples in {el.get('wall_s', 0):.1f} s, no halt; "
                  f"logs in {result.run_dir}" + (f"; summary in {summary}" if summary else ""))


def profile_cmd(
    out: str = typer.Option("job.json", "--out", "-o", help="job spec JSON to write"),
    replicas: int = typer.Option(2, "--replicas", "-d"),
    stages: int = typer.Option(2, "--stages", "-s"),
    microbatches: int = typer.Option(4, "--microbatches", "-m"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads while measuring (default: the workers' RECYCLE_THREADS, 1)"),
    repeats: int = typer.Option(7, "--repeats", help="rounds per figure after a warm-up: the median is kept, the spread printed"),
    memory_budget: Optional[int] = typer.Option(None, "--memory-budget", help="bytes per worker (default: the GPU's memory; on CPU this machine's memory / (D x S))"),
    details: Optional[str] = typer.Option(None, "--details", help="write every stage's medians, spreads and bytes as JSON here"),
    split: str = typer.Option("layers", "--split", help="layers (equal layer counts), or balanced: profile every layer alone first, write those costs into the job (layer_cost) and profile the stages of the split they balance (for `train --split balanced`)"),
    model: str = MODEL_OPTION,
    d_model: Optional[int] = D_MODEL_OPTION, layers: Optional[int] = LAYERS_OPTION,
    heads: Optional[int] = HEADS_OPTION, seq_len: Optional[int] = SEQ_LEN_OPTION,
    micro_batch_size: int = typer.Option(4), vocab: Optional[int] = VOCAB_OPTION,
    seed: int = typer.Option(0), lr: float = typer.Option(3e-3),
    activation_checkpointing: str = typer.Option("none", "--activation-checkpointing", help=AC_HELP + "; the job records it, and `train --job` trains with it"),
):
    """Measure F/I/W/OPT and activation memory of each stage and write a job spec for
    `recycle plan` / `train --job`."""
    import json

    from executor.compute.config import TrainingSettings
    from executor.compute.measure.profile import profile
    from executor.runtime.transport.endpoints import check_device

    with user_errors("profile options"):
        check_device(device)
        if device == "auto":
            device = "cpu"
        if repeats < 1:
            raise ValueError(f"--repeats must be at least 1, not {repeats}")
        if threads is not None and threads < 1:
            raise ValueError(f"--threads must be at least 1, not {threads}")
        from executor.inputs.train_options import checkpointing_of
        checkpointing = checkpointing_of(activation_checkpointing, None)
        from executor.inputs.resolve import model_config
        from executor.inputs.run_config import ModelSection
        cfg = model_config(ModelSection(model=model, d_model=d_model, layers=layers,
                                        heads=heads, seq_len=seq_len, vocab=vocab,
                                        micro_batch_size=micro_batch_size, seed=seed), lr=lr)
        from executor.models.balance import check_split
        check_split(split)
        from executor.inputs.workload_name import check_workload
        notes: list = []
        workload = check_workload(model, cfg, stages, notes)
        for note in notes:
            typer.echo(f"warning: {note}", err=True)
        from executor.models.footprint import check_fits  # this machine holds a stage
        check_fits(model, workload, cfg, stages, replicas=1, device=device, mode="profile")
        rows: list = []
        measure = profile
        if split == "balanced":  # per-layer costs first; cfg gets their boundaries
            from executor.compute.measure.profile import profile_balanced as measure
        spec = measure(cfg, stages, replicas, microbatches, device=device, repeats=repeats,
                       # the optimizer OPT times; the recomputation F/I/W and memory have
                       training=TrainingSettings(lr=lr, activation_checkpointing=checkpointing),
                       workload=workload,
                       memory_budget=memory_budget, threads=threads, details=rows)
        with open(out, "w") as fh:
            fh.write(spec.model_dump_json(indent=1))
        if details:
            with open(details, "w") as fh:
                json.dump(rows, fh, indent=1)
    typer.echo(f"{'stage':>5} " + " ".join(f"{k + ' us':>10} {'spread':>6}" for k in ("F", "I", "W", "OPT"))
               + f" {'act. bytes':>11}")
    for s, r in enumerate(rows):
        typer.echo(f"{s:>5} " + " ".join(f"{r[k]:>10.1f} {r['spread'][k]:>6.2f}" for k in ("F", "I", "W", "OPT"))
                   + f" {r['activation_bytes']:>11,}")
    if spec.layer_cost:
        from executor.models.balance import balanced_boundaries
        typer.echo(f"per-layer F+I+W us [embedding, blocks, head]: {spec.layer_cost}; "
                   f"balanced boundaries {list(balanced_boundaries(spec.layer_cost, stages))}")
    typer.echo(f"wrote {out}: F={spec.cost.F} I={spec.cost.I} W={spec.cost.W} OPT={spec.cost.OPT} "
               f"activation={spec.memory.activation} capacity={spec.memory.capacity} "
               f"(median of {repeats}; spread = (max-min)/median)")
