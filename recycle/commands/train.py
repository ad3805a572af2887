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


AC_HELP = ("none, full (every block's forward is recomputed in backward, keeping only its "
           "input), or selective[:N] (every N-th block; N=2 by default): less activation "
           "memory for more compute, the same numbers (recomputed once, in I)")


def _settings() -> dict:
    """Every setting of RunConfig (executor/inputs/run_config.py), in section order:
    name -> (its type, its dataclass field, its section's name)."""
    import dataclasses
    import typing

    from executor.inputs.run_config import RunConfig  # dataclasses only: no torch
    out = {}
    for section, kind in typing.get_type_hints(RunConfig).items():
        hints = typing.get_type_hints(kind)
        for f in dataclasses.fields(kind):
            out[f.name] = (hints[f.name], f, section)
    return out


SETTINGS = _settings()
# what the command line adds to a setting (its value is the same as the file's)
_CLI_ONLY = {"resume": dict(is_eager=True, callback=_resumed)}


def setting_option(name: str, **override):
    """The typer option of a RunConfig setting, from its declaration: its default, its
    flag names, its help, its section as the help's panel (`override`: what a command
    sets otherwise, e.g. `profile`'s own default)."""
    import dataclasses
    _, f, section = SETTINGS[name]
    default = [] if f.default_factory is not dataclasses.MISSING else f.default
    from rich.markup import escape  # "[default: 2, or the --job's]" is not a style
    kw = dict(help=escape(f.metadata["doc"]), rich_help_panel=section.capitalize(),
              **_CLI_ONLY.get(name, {}))
    kw.update(override)
    return typer.Option(kw.pop("default", default), *f.metadata["flags"], **kw)


def _train_signature():
    """train_cmd's parameters: --config, every setting (generated), --token."""
    import inspect
    P = inspect.Parameter
    from rich.markup import escape
    sections = " ".join(f"[{s}]" for s in dict.fromkeys(v[2] for v in SETTINGS.values()))
    config = typer.Option(None, "--config", is_eager=True, callback=_configured, help=escape(
        f"a run's settings from a TOML (or .json) file with sections {sections}, each "
        "setting named as its flag (--d-model is [model] d_model); flags given override "
        "it. Every run writes its own as RUN_DIR/run.toml"))
    token = typer.Option(None, "--token", envvar="RECYCLE_TOKEN", rich_help_panel="Service",
                         help="the job's worker token at --service (never in a file)")
    return inspect.Signature(
        [P("ctx", P.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
         P("config", P.KEYWORD_ONLY, default=config, annotation=Optional[str]),
         *(P(n, P.KEYWORD_ONLY, default=setting_option(n), annotation=hint)
           for n, (hint, _, _) in SETTINGS.items()),
         P("token", P.KEYWORD_ONLY, default=token, annotation=Optional[str])])


def train_cmd(ctx: typer.Context, **given):
    """Train a model (--model; default: the small built-in GPT) on a DxS grid of worker
    processes, surviving injected failures."""
    from rich.console import Console

    from executor.inputs.resolve import resolve
    from executor.inputs.run_config import RunConfig
    from executor.launch.launcher import train

    console = Console(stderr=True)
    resumed = ctx.meta.get("resumed")  # the checkpoint's manifest (_resumed)
    params = dict(ctx.params)  # flags given, else --config's, else --resume's, else defaults
    token, reference, summary, device = (params.pop("token"), params["reference"],
                                         params["summary"], params["device"])
    iterations = params["iterations"]
    if resumed is not None and params.get("replicas") != resumed.replicas and (
            _from_resume(ctx, "microbatches")):
        # another grid: M follows so that the global batch stays the checkpoint's (when
        # no M does, read_checkpoint refuses the run in one line)
        from executor.checkpoint.manifest import resumed_microbatches
        params["microbatches"] = resumed_microbatches(resumed, params["replicas"]) or \
            params["microbatches"]
    if resumed is not None and params["lr_schedule"] != "cosine" and (
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
    model: str = setting_option("model", rich_help_panel=None),
    d_model: Optional[int] = setting_option("d_model", rich_help_panel=None),
    layers: Optional[int] = setting_option("layers", rich_help_panel=None),
    heads: Optional[int] = setting_option("heads", rich_help_panel=None),
    seq_len: Optional[int] = setting_option("seq_len", rich_help_panel=None),
    micro_batch_size: int = setting_option("micro_batch_size", rich_help_panel=None),
    vocab: Optional[int] = setting_option("vocab", rich_help_panel=None),
    seed: int = setting_option("seed", rich_help_panel=None),
    lr: float = setting_option("lr", rich_help_panel=None),
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


train_cmd.__signature__ = _train_signature()
