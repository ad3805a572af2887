"""How a run ends: complete (every loss and checksum in), the workers reaped (external
ones say `bye`), the last checkpoint, the summary; or halted, with the newest checkpoint to
resume from and a line that says why."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Optional

from rich.console import Console

from executor.checkpoint import CheckpointStore, read_checkpoint
from executor.compute.one_process.reference import Summary
from executor.inputs.launch_spec import LaunchSpec
from executor.launch.report.losses import LossBook
from executor.launch.coordinator.processes import Processes
from executor.launch.coordinator.publishing import Plans
from executor.launch.report.run_record import RunRecord
from executor.launch.coordinator.progress import Progress
from executor.protocol import Bye, Done
from executor.runtime.transport.waiting import WaitEnded, wait_until
from executor.timeouts import Timeouts


@dataclass
class TrainResult:
    summary: Optional[Summary]
    halted: Optional[str] = None
    model_error: bool = False  # halted because a worker found the model itself wrong
    model_exception: bool = False  # ... because the model's own code raised (exit 4)
    checkpoint: Optional[str] = None
    versions: int = 0
    run_dir: str = ""
    events: list = field(default_factory=list)
    iteration_end: dict = field(default_factory=dict)  # iteration -> monotonic time it completed


class RunEnd:
    """Owns the checkpoints, the losses and the final checksums: what a run ends with."""

    def __init__(self, spec: LaunchSpec, run_dir: str, *, console: Console):
        """Where checkpoints go, and, resuming, the checkpoint's losses and first iteration
        (`resume`: the checkpoint resumed from, absolute, or None)."""
        job, cfg, training = spec.job, spec.cfg, spec.training
        self.iterations, self.S, self.console = spec.iterations, job.stages, console
        self.external = spec.external
        self.checkpoint_dir = os.path.abspath(spec.checkpoint.checkpoint_dir
                                              or os.path.join(run_dir, "checkpoints"))
        self.checkpoints = CheckpointStore(self.checkpoint_dir,
                                           (job.replicas, job.stages, job.microbatches),
                                           dict(cfg.to_dict(), workload=spec.model),
                                           job=job.model_dump(mode="json"),
                                           training=training.to_dict())
        self.start, losses, self.resume = 0, {}, None
        if spec.checkpoint.resume:
            resume, man = read_checkpoint(spec.checkpoint.resume, job, cfg, training,
                                          spec.iterations, spec.model)
            self.resume = os.path.abspath(resume)
            self.start = man.iteration + 1
            losses = {i: {g: v for g, v in enumerate(row)} for i, row in enumerate(man.losses)}
        self.losses = LossBook(job.num_microbatches, self.start, losses)
        self.final_checks: dict[int, float] = {}  # stage -> its last checksum
        # stage -> its checksums per stage of the job's own split (after a change of shape)
        self.final_parts: dict[int, Optional[list[float]]] = {}
        self.final_version = -1  # the plan version the final checksums were trained under
        self.byes: set = set()  # external workers that said they are leaving
        self._ck_checked = 0.0

    def final(self, stage: int, version: int, checksum, parts) -> None:
        """A worker's checksums after the last iteration. Only one version's count: a
        stage of an older shape that finished the last iteration before a failure sent
        the job back would be counted twice (chaos: a 3-stage report beside a 2-stage
        version's, base stage 2 summed twice)."""
        if version < self.final_version:
            return
        if version > self.final_version:
            self.final_checks.clear()
            self.final_parts.clear()
            self.final_version = version
        self.final_checks[stage] = checksum
        self.final_parts[stage] = parts

    def collect(self, now: float) -> None:
        """Complete checkpoints, at most every 0.25 s."""
        if now - self._ck_checked > 0.25:
            self._ck_checked = now
            self.checkpoints.collect(self.losses.upto)

    def complete(self, progress: Progress, plans: Plans) -> bool:
        """Every iteration's losses are in, and every live worker reported the last one
        under the plan in force, with its stage's checksum."""
        if self.losses.complete_through() < self.iterations - 1:
            return False
        stages = plans.plan.job.stages  # the shape in force (the job's own, or a cut)
        return (progress.at(plans.live(), self.iterations - 1, plans.version)
                and all(s in self.final_checks for s in range(stages)))

    def reap(self, processes: Processes, live: list, timeout: float, handle) -> None:
        end = time.monotonic() + timeout
        processes.join(timeout)
        if self.external:
            self.await_byes(processes, set(live), end, handle)

    def await_byes(self, processes: Processes, want: set, end: float, handle) -> None:
        """External workers (torchrun'd, node agents') have no process here to join, but
        they read this store until they have seen the end: closing it before they say
        `bye` crashed them (and their agents took that for failures, even restarted them).
        Only `done` (the last losses, for a halt) is handled meanwhile: nothing may
        publish a plan after the end."""
        def said_bye() -> bool:
            processes.mailbox.wait(0.05)
            for m in processes.mailbox.drain():
                if isinstance(m, Bye):
                    self.byes.add(m.worker)
                elif isinstance(m, Done):
                    handle(m)
            return want <= self.byes
        try:
            wait_until(said_bye, "the workers' byes", limit_s=max(0.0, end - time.monotonic()),
                       poll_s=0.0, max_poll_s=0.0)
        except WaitEnded:  # gone without a word: the store closes anyway
            pass

    def summary(self, record: RunRecord, faults_log, elastic: dict) -> Summary:
        plans = record.plans_used(self.iterations)
        return Summary(losses=[self.losses.loss(i) for i in range(self.iterations)],
                       param_checksums=self._checksums(),
                       recovery=record.recovery(faults_log), plans=plans,
                       elastic=elastic_counts(plans, record, elastic))

    def _checksums(self) -> list[float]:
        """Per stage of the job's own split: as reported, or, after a change of shape,
        summed from every stage's parts."""
        if all(p is None for p in self.final_parts.values()):
            return [self.final_checks[s] for s in range(self.S)]
        # a stage that sent none runs the job's own stage of its number (a worker that
        # never changed shape, in a version on the job's own cut)
        parts = [p if p is not None else [self.final_checks[s] if b == s else 0.0
                                          for b in range(self.S)]
                 for s, p in self.final_parts.items()]
        return [sum(p[b] for p in parts) for b in range(self.S)]

    def halted(self, reason: str, fatal: bool) -> Optional[str]:
        """The run halts: collect what checkpoints are complete, print why and where to
        resume; the newest checkpoint."""
        self.checkpoints.collect(self.losses.upto)
        path = self.checkpoints.newest()
        where = (f"newest checkpoint {path}; continue with `recycle train --resume {path}`"
                 if path else "no complete checkpoint yet")
        if fatal:  # the same code would raise again on resume
            where = "fix the model first; " + where
        # one line, never wrapped: a log or checkpoint path must stay whole to be copied
        self.console.print(f"[red bold]training halted:[/] {reason}; {where}", soft_wrap=True)
        return path

    def final_checkpoint(self, timeouts: Timeouts) -> None:
        """The last iteration's checkpoint: local workers have exited (their parts are
        written); torchrun'd ones may still be writing, so wait for them a little."""
        try:
            wait_until(lambda: self.checkpoints.collect(self.losses.upto) == self.iterations - 1,
                       "the last checkpoint", poll_s=0.1, max_poll_s=0.1,
                       limit_s=timeouts.workers_exit if self.external else 0.0)
        except WaitEnded:  # the newest complete checkpoint stands
            pass


def _shape(plan: dict) -> Optional[tuple]:
    part = plan.get("partition")
    return None if part is None or part["bounds"] == list(range(len(part["bounds"]))) \
        and part["unit"] == "stage" else tuple(part["bounds"])


def elastic_counts(plans: list[dict], record: RunRecord, extra: dict) -> dict:
    """Moves and snapshot restores of the plan versions trained under, the pauses (fewer
    live workers than stages) and their wall time, and what the coordinator adds (`extra`:
    iterations retrained after rollbacks, snapshot figures, samples, wall time, a trace's
    counts)."""
    moves = [m for p in plans for m in p.get("moves", [])]
    replays = [r for r in record.recoveries if r["kind"] == "replay"]
    return {"moves": sum(1 for m in moves if m["from_stage"] is not None),
            "joins": sum(1 for m in moves if m["from_stage"] is None),
            "snapshot_restores": sum(1 for m in moves if m["source"] == "snapshot"),
            "retrained_iterations": extra.pop("retrained_iterations"),
            # stages lost whole rebuilt from a snapshot and the boundary logs, the others
            # keeping their work (the rest of the snapshot restores rolled the job back)
            "replays": len(replays),
            "replayed_iterations": sum(r["last"] - r["first"] + 1 for r in replays),
            "replay_s": round(sum(r["seconds"] for r in replays), 4),
            # each stage lost whole, in order: replayed alone, or the job rolled back (why)
            "lost_stages": list(record.recoveries),
            # plan versions trained under whose shape (stages and their units) differs
            # from the one before (docs/executor.md, "Shapes")
            "shape_changes": sum(1 for a, b in zip([None, *plans], plans) if a is not None
                                 and _shape(a) != _shape(b)),
            "pauses": record.pauses, "paused_s": round(record.paused_s, 3), **extra}
