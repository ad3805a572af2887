"""`recycle simulate`: recovery policies compared on one failure trace."""
from __future__ import annotations

import math
import os
import sys
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from planner.inputs.limits import check_plannable, load_spec
from recycle.commands.errors import user_errors

console = Console()

# A spec the simulator plans for is held to the planner's limits (planner/inputs/limits.py):
# each failed set is planned in seconds at most, and a 50 MB spec of millions of stages is
# refused by its size before it is parsed.


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)


def _finite(name: str, value: float, low: float = 0.0, strict: bool = True) -> None:
    ok = math.isfinite(value) and (value > low if strict else value >= low)
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, "
                         f"got {value}")


def simulate_cmd(
    spec: Optional[str] = typer.Argument(None, help="job spec JSON (or --preset)"),
    preset: Optional[str] = typer.Option(None, help="gpt3-medium | gpt3-2.7b | gpt3-6.7b | "
                                         "llama3-405b (per-stage times from FLOPs: estimates)"),
    replicas: int = typer.Option(16, "--replicas", "-d", help="with --preset: replicas"),
    stages: int = typer.Option(8, "--stages", "-s", help="with --preset: stages"),
    microbatches: int = typer.Option(16, "--microbatches", "-m", help="with --preset: micro-batches per replica"),
    gpu_tflops: float = typer.Option(150.0, help="with --preset: sustained TFLOP/s of a GPU"),
    gpu_memory_gb: float = typer.Option(80.0, help="with --preset: memory of a GPU"),
    trace: Optional[str] = typer.Option(None, help="trace file: spot format t_ms,add|remove,nodeN "
                                        "or fail-stop t_s,fail|recover,R:S"),
    trace_format: str = typer.Option("auto", help="auto | spot | failstop"),
    every: Optional[str] = typer.Option(None, help="synthetic: one node failure every 6h, 30m, ..."),
    spot: bool = typer.Option(False, "--spot", help="synthetic: bursty spot preemptions"),
    failure_model: Optional[str] = typer.Option(
        None, help="a dedicated cluster's failures, drawn with --seed: llama3-405b (Meta's "
        "54-day record on 16,384 GPUs; a worker is a host of 8 GPUs, so --gpu-* figures are "
        "multiplied by 8; default --hours: the record's 1,296)"),
    hours: Optional[float] = typer.Option(None, help="simulated hours (default: a trace file's "
                                          "length, else 12)"),
    mtbf_hours: float = typer.Option(10_000.0, help="exponential trace: MTBF of one GPU"),
    repair_hours: float = typer.Option(1.0, help="synthetic traces: time until a failed node is back"),
    seed: int = typer.Option(0, help="synthetic trace seed"),
    gpus_per_node: int = typer.Option(1, help="GPUs (workers) a node of the trace holds"),
    placement: str = typer.Option("stages", help="stages: a node holds G stages of one replica; "
                                  "replicas: one stage of G replicas"),
    write_trace: Optional[str] = typer.Option(None, help="write the node trace used (spot format)"),
    policies: List[str] = typer.Option([], "--policy", "-p", help="policies to run (default: all)"),
    unit_s: Optional[float] = typer.Option(None, help="seconds per time unit of the spec "
                                           "(default 1e-3; presets: 1e-6)"),
    detect_seconds: float = typer.Option(5.0, help="failure to detection"),
    checkpoint_minutes: float = typer.Option(30.0, help="checkpoint interval (0: none)"),
    checkpoint_seconds: float = typer.Option(0.0, help="stall per checkpoint, every policy"),
    restart_minutes: float = typer.Option(5.0, help="restart from a checkpoint"),
    spares: int = typer.Option(0, help="checkpoint-restart: spare workers"),
    rejoin_seconds: float = typer.Option(10.0, help="rollback/lossy-forward: stall while a replica rejoins"),
    oobleck_reconfig_seconds: Optional[float] = typer.Option(None, help="default 5 (presets 2-10)"),
    oobleck_min_stages: int = typer.Option(0, help="shallowest template (0: from memory)"),
    bamboo_failover_seconds: float = typer.Option(5.0, help="Bamboo's switch to the shadow"),
    bamboo_rc_hidden: float = typer.Option(0.0, help="share of Bamboo's redundant forward hidden in bubbles"),
    swift_log_overhead: float = typer.Option(0.01, help="share of throughput logging boundary tensors costs (swift-replay's, and recycle's, which replays a lost stage from them; measured: benchmarks/results/swift.md)"),
    checkpoint_shrink: bool = typer.Option(False, "--checkpoint-shrink", help="checkpoint-restart: "
                                           "restart on the replicas left whole (no waiting for repairs)"),
    bamboo_placement: str = typer.Option("own", help="own: Bamboo places a stage and its shadow "
                                         "on different nodes; trace: as the trace packs nodes"),
    snapshot_every: int = typer.Option(5, help="recycle: iterations between peer-memory snapshots"),
    horizon_seconds: Optional[float] = typer.Option(None, help="recycle: time a move is amortised "
                                                    "over (default: the trace's mean time between events)"),
    db: Optional[str] = typer.Option(None, help="SQLite plan cache to read and fill"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    png: Optional[str] = typer.Option(None, help="write throughput over time (PNG)"),
    html_out: Optional[str] = typer.Option(None, "--html", help="write the same plot as HTML"),
    markdown_out: Optional[str] = typer.Option(None, "--markdown", help="append the table (markdown)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar on stderr"),
    jobs: int = typer.Option(min(4, os.cpu_count() or 1), "--jobs", "-j",
                             help="processes that plan the trace's failed sets ahead"),
):
    """Compare recovery policies (ReCycle and its peers) on the same failure trace."""
    from planner.simulation.policies import POLICIES, Params
    from planner.simulation.trace import MAX_HOURS, Placement

    with user_errors("simulate"):
        if (spec is None) == (preset is None):
            raise ValueError("give a job spec or --preset, one of the two")
        for name, v in (("--detect-seconds", detect_seconds), ("--checkpoint-minutes", checkpoint_minutes),
                        ("--checkpoint-seconds", checkpoint_seconds), ("--restart-minutes", restart_minutes),
                        ("--rejoin-seconds", rejoin_seconds), ("--repair-hours", repair_hours),
                        ("--bamboo-failover-seconds", bamboo_failover_seconds)):
            _finite(name, v, strict=False)
        _finite("--mtbf-hours", mtbf_hours)
        for name, v in (("--bamboo-rc-hidden", bamboo_rc_hidden), ("--swift-log-overhead", swift_log_overhead)):
            if not (0 <= v <= 1):
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        if swift_log_overhead >= 1:
            raise ValueError("--swift-log-overhead must be below 1")
        if hours is not None and not (math.isfinite(hours) and 0 < hours <= MAX_HOURS):
            raise ValueError(f"--hours must be a number in (0, {MAX_HOURS:g}], got {hours}")
        if unit_s is not None:
            _finite("--unit-s", unit_s)
        if oobleck_reconfig_seconds is not None:
            _finite("--oobleck-reconfig-seconds", oobleck_reconfig_seconds, strict=False)
        if bamboo_placement not in ("own", "trace"):
            raise ValueError(f"--bamboo-placement must be own or trace, got {bamboo_placement!r}")
        if snapshot_every < 1:
            raise ValueError("--snapshot-every must be at least 1")
        if horizon_seconds is not None:
            _finite("--horizon-seconds", horizon_seconds)
        if spares < 0 or oobleck_min_stages < 0:
            raise ValueError("--spares and --oobleck-min-stages must be >= 0")
        if not 1 <= jobs <= 256:
            raise ValueError("--jobs must be between 1 and 256")
        unknown = [p for p in policies if p not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}")
        if sum(x is not None and x is not False
               for x in (trace, every, spot or None, failure_model)) > 1:
            raise ValueError("give at most one of --trace, --every, --spot, --failure-model")
        fm = None
        if failure_model is not None:
            from planner.simulation.failure_model import preset as failure_preset
            fm = failure_preset(failure_model)
            if gpus_per_node != 1 or placement != "stages":
                raise ValueError("--gpus-per-node and --placement apply to node traces; a "
                                 "failure model places its own units")
            gpu_tflops, gpu_memory_gb = (gpu_tflops * fm.gpus_per_worker,
                                         gpu_memory_gb * fm.gpus_per_worker)
        if trace is None and trace_format != "auto":
            raise ValueError("--trace-format applies to --trace")
        from planner.simulation.report import check_writable
        for path in (write_trace, png, html_out, markdown_out):
            check_writable(path)
        job, model = _load_job(spec, preset, replicas, stages, microbatches, gpu_tflops,
                               gpu_memory_gb, 1 if fm is None else fm.gpus_per_worker)
        if unit_s is None:
            unit_s = 1e-6 if preset else 1e-3
        where = Placement(job.replicas, job.stages, gpus_per_node, placement)
        if fm is not None:
            from planner.simulation.failure_model import sample
            duration = (hours if hours is not None else fm.hours) * 3600
            tr = sample(fm, job.replicas, job.stages, duration / 3600, seed)
        else:
            tr, duration = _trace(trace, trace_format, every, spot, hours, mtbf_hours,
                                  repair_hours, seed, where)
        reconfig = oobleck_reconfig_seconds
        if reconfig is None:
            from planner.simulation.presets import PRESETS
            reconfig = PRESETS[preset].reconfig_s if preset else 5.0
        params = Params(detect_s=detect_seconds, restart_s=restart_minutes * 60, spares=spares,
                        rejoin_s=rejoin_seconds, oobleck_reconfig_s=reconfig,
                        oobleck_min_stages=oobleck_min_stages,
                        bamboo_failover_s=bamboo_failover_seconds,
                        bamboo_rc_hidden=bamboo_rc_hidden, swift_log_overhead=swift_log_overhead,
                        checkpoint_shrink=checkpoint_shrink,
                        bamboo_own_placement=bamboo_placement == "own",
                        snapshot_every=snapshot_every, horizon_s=horizon_seconds)
    if write_trace:
        from planner.simulation.trace import write_spot
        if not tr.node_events:
            with user_errors("simulate"):
                raise ValueError("--write-trace writes node traces; a fail-stop trace is "
                                 "already in its own format")
        write_spot(write_trace, tr.node_events)
    result = _run(job, model, tr, duration, unit_s, params, policies or list(POLICIES),
                  checkpoint_minutes * 60, checkpoint_seconds, db, progress, jobs)
    command = "recycle simulate " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else ""
    from planner.simulation import report

    if png:
        report.write_png(result, png)
    if html_out:
        report.write_html(result, html_out)
    if markdown_out:
        with open(markdown_out, "a") as fh:
            fh.write(f"\n### {report.heading(result)}\n\n`{command}`\n\n{report.markdown(result)}\n")
    if as_json:
        typer.echo(report.to_json(result, command))
        return
    _print(result, report)


def _load_job(spec, preset, replicas, stages, microbatches, tflops, memory_gb, gpus=1):
    """The job and its model; `gpus`: GPUs a worker is (their network with them)."""
    from planner.simulation.costs import Model

    if preset:
        from planner.simulation.presets import PRESETS, preset_job, preset_model

        for name, v in (("--replicas", replicas), ("--stages", stages),
                        ("--microbatches", microbatches)):
            if v < 1:
                raise ValueError(f"{name} must be at least 1")
        check_plannable(replicas, stages, microbatches)
        _finite("--gpu-tflops", tflops)
        _finite("--gpu-memory-gb", memory_gb)
        from planner.simulation.presets import BANDWIDTH
        model = preset_model(preset, replicas, 1, tflops, memory_gb, BANDWIDTH * gpus)
        sh = PRESETS[preset]
        return preset_job(model, replicas, stages, microbatches, sh.seq, sh.d_model, 1,
                          BANDWIDTH * gpus), model
    job = load_spec(spec)  # refused by size before parsing, then by grid
    return job, Model.of_spec(job)


def _trace(path, fmt, every, spot, hours, mtbf_hours, repair_hours, seed, where):
    from planner.simulation import trace as tr

    if path:
        t = tr.read_trace(path, where, fmt)
        duration = hours * 3600 if hours is not None else (t.end or 0.0)
        if duration <= 0:
            raise ValueError(f"{path} spans no time: give --hours")
        return t, duration
    duration = (hours if hours is not None else 12.0) * 3600
    if every:
        return tr.fixed_interval_trace(where, duration, tr.parse_duration(every),
                                       repair_hours * 3600, seed), duration
    if spot:
        return tr.spot_like_trace(where, duration, seed), duration
    return tr.exponential_trace(where, duration, mtbf_hours * 3600, repair_hours * 3600,
                                seed), duration


def _run(job, model, trace, duration, unit_s, params, policies, ckpt_every, ckpt_cost, db,
         progress, jobs):
    from rich.progress import Progress

    from planner.simulation.compare import simulate
    from planner.simulation.engine import batches

    cache = None
    if db:
        from planner.cache import PlanCache
        with user_errors("plan cache"):
            cache = PlanCache(db)
    total = len(batches(trace.events)) * len(policies)
    err = Console(stderr=True)
    with Progress(console=err, transient=True, disable=not progress) as bar:
        task = bar.add_task("simulating", total=total)
        return simulate(job, trace, duration, unit_s, params, policies, ckpt_every, ckpt_cost,
                        model, cache, tick=lambda: bar.advance(task), jobs=jobs)


def _print(result, report) -> None:
    j, tr = result.job, result.trace
    console.print(f"{tr.failures} failures over {result.duration_s / 3600:g} h on "
                  f"{j.replicas}x{j.stages} workers ({tr.source}); failure-free "
                  f"{result.base_rate * result.model.samples_per_microbatch:.4g} samples/s, "
                  f"{result.plans_made} failed sets planned")
    shares = report.limit_shares(result)
    table = Table("policy", "kept", "samples", "stalled h", "lost samples", "failures",
                  "restarts", "ReCycle/x", *(["of limit"] if shares else []))
    for r in report.rows(result):
        ratio = r["recycle_ratio"]
        table.add_row(r["policy"], f"{r['kept']:.1%}", f"{r['samples']:.4g}",
                      f"{r['stalled_h']:.2f}", f"{r['lost_samples']:.3g}", str(r["failures"]),
                      str(r["restarts"]), "-" if ratio is None else f"{ratio:.3f}x",
                      *([f"{shares[r['policy']]:.1%}"] if shares else []))
    console.print(table)
