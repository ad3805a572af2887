"""From a run's one typed configuration to what runs it.

`recycle train`'s flags, a `--config` TOML file and a `--resume` checkpoint's manifest all
land in one RunConfig (run_config.py: the flags given win over the file, the checkpoint's
settings fill the flags left out). `resolve` turns that tree into the run: the model's
shape (its flavour's, the data's vocab, the stage split), the training settings, the job
(a --job file, the service's, the checkpoint's or the uniform grid), the faults, and the
LaunchSpec the coordinator takes whole; each part reads its section. Every check that
fails is a one-line ValueError/UserError naming its flag.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Optional

from executor.compute.config import ModelConfig, TrainingSettings
from executor.inputs.launch_spec import Faults, LaunchSpec
from executor.inputs.run_config import RunConfig
from planner.job import JobSpec
from planner.plan import Mode


@dataclass
class Resolved:
    launch: LaunchSpec  # the run, validated (cfg split into stages, run_config attached)
    workload: Any  # the --model's Workload, loaded (and built alike twice) here
    watch: Any = None  # a ServiceWatch when the run follows --service
    notes: tuple = ()  # lines to print before the run (a resumed checkpoint's changes)
    warnings: tuple = ()  # randomness the runtime cannot key (compute/draws.py), named


def model_config(m, *, lr: float) -> ModelConfig:
    """[model]'s shape as its --model flavour fixes it (flags given win), and --lr; one line
    if bad."""
    from executor.inputs.train_options import check_model_options
    from executor.models.families import architecture
    arch = architecture(m.model, d_model=m.d_model, n_layers=m.layers, n_heads=m.heads,
                        seq_len=m.seq_len, vocab=m.vocab)
    check_model_options(d_model=arch["d_model"], layers=arch["n_layers"],
                        heads=arch["n_heads"], seq_len=arch["seq_len"],
                        micro_batch_size=m.micro_batch_size, vocab=arch["vocab"], lr=lr)
    return ModelConfig(micro_batch_size=m.micro_batch_size, seed=m.seed, **arch)


def training_settings(run: RunConfig, *, min_lr_ratio: Optional[float]) -> TrainingSettings:
    """[optimizer] [schedule] [clipping] [data] as the optimizer, schedule and data read them."""
    from executor.inputs.train_options import check_training
    s, it = run.schedule, run.grid.iterations
    floor = check_training(precision=run.model.precision, lr_schedule=s.lr_schedule,
                           warmup=s.warmup, min_lr_ratio=min_lr_ratio, clip=run.clipping.clip,
                           iterations=it)
    data = run.data.data
    return TrainingSettings(**dataclasses.asdict(run.optimizer), precision=run.model.precision,
                            lr_schedule=s.lr_schedule, warmup_iters=s.warmup, total_iters=it,
                            min_lr_ratio=floor, clip=run.clipping.clip,
                            data=os.path.abspath(data) if data else "")


def job_of(run: RunConfig, resumed, token: Optional[str]):
    """(job spec, ServiceWatch or None): a --job file, the service's job, the checkpoint's
    (same grid), or the uniform grid."""
    from executor.inputs.train_options import grid_of
    from planner.inputs.limits import load_spec
    g, svc, plan = run.grid, run.service, run.plan
    spec = load_spec(g.job) if g.job else None
    grid = (g.replicas, g.stages, g.microbatches)
    if resumed and resumed.job and not g.job and grid == (
            resumed.replicas, resumed.stages, resumed.microbatches):
        spec = JobSpec.model_validate(resumed.job)  # (another grid is refused later)
    replicas, stages, microbatches = grid_of(spec, g.job, *grid)
    watch = None
    if svc.service:  # workers poll, heartbeat and report to the service themselves
        from executor.sources.service_source import ServiceWatch
        if not (svc.job_id and token):
            raise ValueError("--service needs --job-id and --token")
        if plan.sync or plan.no_split:  # the service plans every job with I/W split, staggered
            raise ValueError(f"{'--sync' if plan.sync else '--no-split'} cannot apply with "
                             f"--service: the service's plans split I/W and stagger")
        watch = ServiceWatch(svc.service, svc.job_id, token,
                             timeout_s=max(30.0, run.comm.timeout))
        spec = spec or watch.plan.job
    return spec or JobSpec.uniform(replicas, stages, microbatches), watch


def faults_of(run: RunConfig, job: JobSpec) -> Faults:
    f = run.faults
    faults = Faults.from_flags(f.kill, f.rejoin, f.restart, f.stall, f.slow)
    if f.trace:
        from executor.launch.faults.trace_replay import trace_faults
        faults = trace_faults(faults, f.trace, job.replicas, job.stages, f.trace_start,
                              f.trace_hours, f.gpus_per_node, f.placement, f.time_scale,
                              run.comm.external, run.service.service is not None)
    return faults


def resolve(run: RunConfig, *, resumed=None, token: Optional[str] = None) -> Resolved:
    """The run `run` asks for. `resumed`: the --resume checkpoint's manifest (its settings
    are in `run` already; here its job and stage split); `token`: the service's worker
    token (never in a file)."""
    from executor.checkpoint import read_checkpoint
    from executor.inputs.train_options import resume_changes

    cfg = model_config(run.model, lr=run.optimizer.lr)
    arch_vocab = cfg.vocab  # the flag's or the flavour's (run.toml keeps it, not the data's)
    training = training_settings(run, min_lr_ratio=run.schedule.min_lr_ratio)
    data = run.data.data
    if data:  # the model's vocab is the token file's (its header or sidecar)
        from executor.data.token_file import data_vocab
        cfg = dataclasses.replace(cfg, vocab=data_vocab(data, run.model.vocab))
    job, watch = job_of(run, resumed, token)
    from executor.inputs.train_options import checkpointing_of  # the flag, else the --job's
    training = dataclasses.replace(training, activation_checkpointing=checkpointing_of(
        run.model.activation_checkpointing, job))
    faults = faults_of(run, job)
    ck, comm, plan, out = run.checkpoint, run.comm, run.plan, run.output
    # the run as one value, checked here once (before the model is loaded: cheap first)
    launch = LaunchSpec(
        cfg, job, run.grid.iterations, faults=faults, training=training,
        detect_stragglers=run.faults.detect_stragglers, solver=plan.solver,
        mode=Mode(split_backward=not plan.no_split, staggered=not plan.sync),
        checkpoint=run.checkpoint, comm=run.comm, run_dir=out.run_dir,
        model=run.model.model, summary_path=out.summary, shape=plan.shape)
    from executor.models.balance import split_config
    cfg = split_config(cfg, run.model.split, job, run.grid.job, run.service.service)
    if resumed and run.model.split is None and not run.grid.job and job.stages == resumed.stages:
        # the checkpoint's stage split (the job's per-layer costs need not be at hand)
        cfg = dataclasses.replace(cfg, boundaries=tuple(resumed.model.get("boundaries", ())))
    from executor.inputs.workload_name import check_workload  # after the cheap checks
    warnings: list = []
    workload = check_workload(run.model.model, cfg, job.stages, warnings)  # loads, builds twice
    if data:
        from executor.data.token_file import check_data, with_data
        check_data(data, cfg.vocab, cfg.micro_batch_size, cfg.seq_len,
                   job.replicas * job.microbatches)
        workload = with_data(workload, training.data)
    if out.reference or not comm.external:  # this machine's memory holds the model's state
        from executor.models.footprint import check_fits
        check_fits(run.model.model, workload, cfg, job.stages, replicas=job.replicas,
                   device=comm.device, mode="reference" if out.reference else "workers")
    notes = ()
    if ck.resume:
        where, man = read_checkpoint(ck.resume, job, cfg, training, run.grid.iterations,
                                     run.model.model)
        notes = tuple(f"resuming {where} with {n}" for n in resume_changes(man.training, training))
    # the flag tree as resolved, for RUN_DIR/run.toml (`recycle train --config` repeats it)
    tree = dataclasses.replace(run, grid=dataclasses.replace(
        run.grid, replicas=job.replicas, stages=job.stages, microbatches=job.microbatches),
        model=dataclasses.replace(run.model, d_model=cfg.d_model, layers=cfg.n_layers,
                                  heads=cfg.n_heads, seq_len=cfg.seq_len, vocab=arch_vocab),
        schedule=dataclasses.replace(run.schedule, min_lr_ratio=training.min_lr_ratio
                                     if run.schedule.lr_schedule == "cosine" else None))
    launch = dataclasses.replace(launch, cfg=cfg, run_config=tree)
    return Resolved(launch, workload, watch, notes, tuple(warnings))
