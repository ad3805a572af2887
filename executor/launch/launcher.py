"""`train`: one process per (replica, stage) and the in-process coordinator.

A run is one LaunchSpec (executor/inputs/launch_spec.py: the model, its training
settings, the job, faults, checkpoints, comm), made and validated by `recycle train`; the
coordinator takes it whole.

The coordinator hosts the TCPStore (coordinator/processes.py), watches its workers and
drives the run's membership: planner/control/membership.py decides what changes,
planner/control/timing.py when, and coordinator/publishing.py plans and publishes (or follows
the plan service with --service). Deaths are seen, fastest first, as a process exit, a peer's
suspect (a re-published version if nobody died), or, for external (torchrun'd) workers, a
stopped heartbeat. A death is a failure event at once; a due --rejoin/--restart brings the
worker back later (coordinator/admission.py, faults/rejoins.py). Injected faults are
faults/injector.py's, the workers' messages coordinator/messages.py's, what the run reports
report/'s, and the end of a run, complete or halted with the newest checkpoint,
coordinator/ending.py's. The rules are in docs/executor.md ("Who is in which plan version").
"""
from __future__ import annotations

import os
import tempfile
import time
import uuid
from typing import Optional

from rich.console import Console

from executor import protocol as P
from executor.inputs.launch_spec import LaunchSpec
from executor.inputs.run_config import save_config
from executor.inputs.worker_settings import WorkerSettings
from executor.launch.coordinator.admission import Admission
from executor.launch.coordinator.ending import RunEnd, TrainResult
from executor.launch.coordinator.messages import HANDLERS
from executor.launch.coordinator.processes import Processes
from executor.launch.coordinator.publishing import Halted, Plans
from executor.launch.coordinator.progress import Progress
from executor.launch.coordinator.trace_faults import TraceFaults
from executor.launch.faults.injector import Injector
from planner.control.cut_links import LinkReports
from executor.launch.faults.rejoins import RejoinBook
from executor.launch.report.progress_lines import ProgressLines
from executor.launch.report.run_record import RunRecord
from executor.launch.report.snapshot_figures import SnapshotFigures
from executor.protocol import wkey
from executor.runtime.transport.rendezvous import set_counter
from executor.timeouts import Timeouts
from planner.control.elastic import LOCAL_HORIZON
from executor.inputs.workload_name import reshapes
from planner.control.membership import Membership
from planner.control.timing import resync_due
from planner.failures import NoPlanError
from planner.speeds import SpeedDetector

Worker = tuple[int, int]


class Coordinator:
    """The run's hub: its parts own their state (processes.py: the store and the processes;
    publishing.py: the membership and the plan in force; progress.py: how far each worker got;
    admission.py: rejoins and returning processes; ending.py: losses, checkpoints and the
    end; trace_faults.py: a replayed trace); the coordinator routes deaths and messages
    between them, one tick at a time."""

    def __init__(self, spec: LaunchSpec, *, console: Optional[Console] = None,
                 service=None):
        """`spec`: the run (executor/inputs/launch_spec.py, validated when made);
        `console`: where progress goes (default stderr); `service`: a ServiceWatch whose
        plans to follow."""
        self.spec, self.job, self.iterations = spec, spec.job, spec.iterations
        self.D, self.S, self.n = spec.job.replicas, spec.job.stages, spec.job.num_microbatches
        self.external = spec.external
        self.timeouts = Timeouts(spec.comm.timeout)  # every limit of the run (executor/timeouts.py)
        self.patience = self.timeouts.patience(service is not None)
        self.service = service  # ServiceWatch: the service plans, the coordinator follows
        if service is not None and service.plan.job.identity_hash() != spec.job.identity_hash():
            raise ValueError(f"job {service.job_id} at the service has another spec than this run")
        if service is not None and service.shape != "fixed" and not (
                spec.shape != "fixed" and reshapes(spec.model)):
            why = ("was run with --shape fixed" if spec.shape == "fixed" else
                   f"cannot (model {spec.model!r} builds its stages by count)")
            raise ValueError(f"job {service.job_id} at the service may change the pipeline's "
                             f"shape (registered with shape={service.shape}) but this run "
                             f"{why}; register it with ?shape=fixed")
        self.run_dir = spec.run_dir or tempfile.mkdtemp(prefix="recycle-run-")
        # The workers' logs go here: with --checkpoint-dir elsewhere nothing else creates it
        os.makedirs(self.run_dir, exist_ok=True)
        if spec.run_config is not None:  # RUN_DIR/run.toml: `recycle train --config` repeats it
            save_config(spec.run_config, self.run_dir)
        self.console = console or Console(stderr=True)
        self.deadline = time.monotonic() + spec.deadline_s if spec.deadline_s else None
        self.events: list[str] = []
        self.record = RunRecord()  # what the run did, for the summary (run_record.py)
        self.end = RunEnd(spec, self.run_dir, console=self.console)
        self.processes = Processes(
            spec.comm.store_port,
            WorkerSettings.of(spec, uuid.uuid4().hex[:8], self.end.checkpoint_dir,
                              self.end.resume, service),
            external=spec.external, timeout=spec.comm.timeout, run_dir=self.run_dir,
            token=service.token if service else None, console=self.console)
        self.store, self.mailbox = self.processes.store, self.processes.mailbox
        self.progress = Progress(self.store)
        trace = spec.faults.trace  # a failure trace replayed (trace_replay.py)
        # Elastic: a worker changes stage when the live set leaves a stage short (moves are
        # weighed over the run's length; planner/control/elastic.py).
        members = Membership.start(
            self.D, self.S, trace.initial_failed if trace else (), job=spec.job,
            snapshots=spec.checkpoint.snapshot_cadence != 0, horizon=LOCAL_HORIZON,
            disk=True,  # a stage lost whole restores from a disk checkpoint or the start
            pause=True, shapes=spec.shape != "fixed" and reshapes(spec.model),
            speed_cuts=spec.shape == "speed"
        ).with_speeds(spec.job.speed)
        self.plans = Plans(self.store, spec.job, members, solver=spec.solver, mode=spec.mode,
                           record=self.record, event=self.event)
        # --rejoin/--restart (rejoins.py); through a service, admission may wait for it to
        # come back from an outage.
        self.admission = Admission(
            RejoinBook(spec.faults.rejoin_entries, spec.external, self.patience.pause_limit),
            self.processes, self.plans, self.progress, patience=self.patience,
            record=self.record, event=self.event, service=service)
        self.trace = None if trace is None else TraceFaults(
            trace, self.processes, self.plans, self.progress, self.admission, record=self.record,
            event=self.event)
        self.snapshots = SnapshotFigures(spec.checkpoint.snapshot_cadence, self.event)
        self.lines = ProgressLines(self.console, self.n * spec.cfg.micro_batch_size * spec.cfg.seq_len,
                                   self.end.start, spec.iterations - 1)
        self.iteration_end: dict[int, float] = {}
        self.began = time.monotonic()  # the summary's wall time
        self.faults = Injector(spec.faults.kills, spec.faults.stalls, self.event)
        # Stragglers (planner/speeds.py): the detector fed by the workers' compute times,
        # which re-plans (Membership.measured) when they change.
        # persist 3: a change must be asked for by 3 iterations in a row (planner/speeds.py:
        # beside CPU hogs, noise alone re-planned 4-8 times in 40-80 iterations).
        self.detector = (SpeedDetector(self.D, self.S, persist=3) if spec.detect_stragglers
                         else None)
        self.lost_worker: Optional[Worker] = None  # died while the service had lost the job
        self.fatal: Optional[str] = None  # a worker found the model itself wrong (one line)
        self.model_exception = False  # the fatal is an exception the model's code raised
        self.no_copy: Optional[str] = None  # a worker found no live copy of some stage
        self.links = LinkReports()  # cut links between live workers (planner/control/cut_links.py)
        # (worker, incarnation) -> messages ignored: sent by a process declared failed
        self.fenced_messages: dict[tuple[Worker, int], int] = {}

    # ---- the parts' state, as the rest of the run reads it -------------------------------
    @property
    def version(self) -> int:
        return self.plans.version

    @property
    def failed(self) -> frozenset:
        return self.plans.failed

    def live(self) -> list[Worker]:
        return self.plans.live()

    def event(self, msg: str) -> None:
        self.events.append(msg)
        self.console.print(f"[yellow]{msg}[/]")

    def died(self, w: Worker, why: str) -> None:
        """A process of `w` is gone (exit seen, its heartbeat stopped, or a newer process
        of it asked in). A death is a failure event as soon as it is known, even when a
        restart is due: the survivors train re-routed until the worker is back."""
        self.event(f"worker {wkey(w)} failed ({why})")
        self.mailbox.forget(w)  # its next process's messages must be told from this one's
        if self.admission.rejoins.drop(w):
            self.admission.update_hold()  # it died before it was admitted: nothing to hold for
        if self.detector is not None:
            self.detector.forget(*w)  # a new process on a new machine says nothing yet
        plan = self.plans.plan
        if self.service is not None:
            if self.service.lost:
                self.lost_worker = w  # nobody can plan around it now: run() halts
            elif w not in self.failed:  # the plan in force admits a process that is gone
                self.service.report_failure(w, plan.incarnation(*w), self.processes.run_id, why)
                # a paused job publishes no plan with w failed: its restart may start now
                self.admission.reported[w] = plan.incarnation(*w)
        elif w not in self.failed:
            self.progress.forget(w)
            self.plans.decide(*self.plans.members.fail(w))
        self.admission.restart(w)

    # ---- main loop ---------------------------------------------------------------------
    def run(self) -> TrainResult:
        try:
            self.publish()
            if self.trace is not None:
                self.trace.start()
            if not self.external:
                for w in ((r, s) for r in range(self.D) for s in range(self.S)):
                    if w not in self.failed:
                        self.processes.spawn(w)
            while True:
                if (why := self.halt_reason()) is not None:
                    return self.halt(why)
                began = time.monotonic()
                self.tick()
                if (why := self.fatal or self.no_copy or self.admission.pause_over(
                        self.trace and self.trace.trace)) is not None:
                    return self.halt(why)
                if self.end.complete(self.progress, self.plans):
                    return self.finish()
                if self.deadline and time.monotonic() > self.deadline:
                    raise TimeoutError(
                        f"training did not finish in time (logs in {self.run_dir}); plan "
                        f"v{self.version}, failed {sorted(self.failed)}, last steps "
                        f"{self.progress.done}, losses {self.end.losses.counts(self.iterations)}")
                # Every 20 ms, or as soon as a message comes, but at most one tick per
                # 5 ms: with many workers each message would otherwise cost a whole tick.
                self.mailbox.wait(0.02)
                time.sleep(max(0.0, began + 0.005 - time.monotonic()))
        except (NoPlanError, Halted) as exc:
            return self.halt(str(exc))
        finally:
            self.faults.release_all()
            self.processes.close()
            if self.service is not None:
                self.service.close()

    def halt_reason(self) -> Optional[str]:
        """Before a tick: the service halted the job, or lost it while a worker died."""
        if self.service is not None and self.service.halted:
            return self.service.halted
        if self.lost_worker is not None:
            return (f"worker {wkey(self.lost_worker)} failed while the plan service had lost "
                    f"the job ({self.service.lost})")
        return None

    def stop(self) -> None:
        """From another thread: make run() end now (it kills its workers on the way out)."""
        self.deadline = time.monotonic()

    def publish(self, final: bool = False) -> None:
        """The first (or the final) version: decided here, or followed from the service."""
        if self.service is None:
            return self.plans.final() if final else self.plans.first()
        if final:  # first the service (so exiting workers are not declared failed)
            self.service.finish(self.console)
            return self.store.set(P.FINISHED, "1")
        if self.plans.follow(self.service.plan):
            for w in self.failed:
                self.progress.forget(w)
            self.admission.followed(self.plans.plan)

    def tick(self) -> None:
        for msg in self.mailbox.drain():
            self.handle(msg)
        self.faults.tick()
        now = time.monotonic()
        # With a service a worker may exit after it was declared failed (a stalled worker
        # that found itself fenced out): its exit still counts, a due rejoin restarts it.
        for w, code in self.processes.new_exits():
            if self.processes.declared(w):  # failed already (silent, cut off): a rejoin may start
                self.event(f"worker {wkey(w)}: its process declared failed exited "
                           f"(code {code})")
                continue
            self.died(w, f"process exited with code {code}")
        # Silence is death for workers on other hosts: torchrun'd ones, and local ones
        # placed on hosts (processes.py RECYCLE_HOSTS), which a partition leaves alive but
        # cut off. Local workers here die only by exiting (a SIGSTOP is a stall).
        watched = self.live() if self.external else [
            w for w in self.live() if w in self.processes.hosts]
        if watched:
            for w, why in self.processes.silent(watched, self.plans.members.incarnation,
                                                self.patience, self.plans.suspect_since is not None):
                self.processes.declare(w)  # alive, maybe: its exit is no second death
                self.died(w, why)
        if self.trace is not None:
            self.trace.tick(now)
        self.admission.tick()
        if self.service is None and (cut := self.links.verdict(now, self.live())) is not None:
            self.processes.declare(cut[0])  # alive and connected: fenced, it stops
            self.died(*cut)
        if self.service is not None:
            self.publish()
        elif (resync_due(self.plans.suspect_since, now, self.patience)
              and self.plans.paused_since is None and not self.links.pending):
            # Comm trouble with nobody dead: a new version makes every worker re-sync
            # (planner/control/timing.py says when).
            self.event(f"suspect reported under plan v{self.version} but no worker died: "
                       "re-publishing")
            self.plans.decide(*self.plans.members.resync(self.version))
        if self.detector is not None and self.service is None:
            grid = self.detector.update()
            if grid is not None:
                slow = {f"{d}:{s}": v for d, row in enumerate(grid) for s, v in enumerate(row)
                        if v != 1.0}
                self.event(f"measured speeds changed: {slow or 'all nominal'}: re-planning")
                self.plans.decide(*self.plans.members.measured(grid))
        if self.plans.members.moving and self.service is None and self.admission.reached(-1):
            self.plans.members = self.plans.members.entered(self.version)  # movers hold stages
        self.progress.commit(self.live(), self.version)
        self.end.collect(now)
        self.report_progress()

    def handle(self, m: P.Message) -> None:
        if not isinstance(m, P.Message):
            raise TypeError(f"not a worker message: {m!r}")
        if self.fenced(m):
            return
        if isinstance(m, P.Suspect):  # a link down between live workers (planner/control/cut_links.py)
            self.links.suspect(m.worker, m.reason, time.monotonic())
        handler = HANDLERS.get(type(m))  # messages.py; `Bye` is read only at the end
        if handler is not None:
            handler(self, m.worker, m)

    def fenced(self, m: P.Message) -> bool:
        """The plan version is the fence (docs/design.md section 6): a process declared
        failed (cut off, or silent, while it may still live) is heard no more, whatever it
        believes: not its losses, suspects, faults or halts. Its successor (a newer
        incarnation asking in) is another process. Once per process, an event says so."""
        w = m.worker
        if w not in self.failed or m.inc > self.plans.members.incarnation(w):
            return False
        key = (w, m.inc)
        self.fenced_messages[key] = self.fenced_messages.get(key, 0) + 1
        if self.fenced_messages[key] == 1:
            self.event(f"ignoring worker {wkey(w)} (incarnation {m.inc}): declared failed, "
                       f"fenced out of plan v{self.version}; its {m.kind} of plan v{m.v} "
                       "and all it sends after are not acted on")
        return True

    @property
    def printed(self) -> int:
        """The newest iteration whose losses are all in (and printed)."""
        return self.end.losses.printed

    def report_progress(self) -> None:
        losses = self.end.losses
        for i in losses.newly_complete():
            now = time.monotonic()
            self.iteration_end[i] = now
            v, failed = self.record.trained_under(i, self.version, self.failed)
            self.lines.completed(i, losses.loss(i), v, failed, now)
            if self.service is not None:  # the live page's progress (service_source.py)
                self.service.report_progress(i, losses.loss(i), self.lines.tokens,
                                             self.iterations, now, self.snapshots.report())

    # ---- the end -------------------------------------------------------------------------
    def finish(self) -> TrainResult:
        if self.service is not None:  # the page's last word: every worker's figures
            self.service.amend_progress(self.snapshots.report())
        self.publish(final=True)
        self.end.reap(self.processes, self.live(), self.timeouts.workers_exit, self.handle)
        self.end.final_checkpoint(self.timeouts)
        summary = self.end.summary(self.record, self.faults.log, self.elastic_extra())
        return TrainResult(summary, versions=len(summary.plans), run_dir=self.run_dir,
                           events=self.events, iteration_end=self.iteration_end)

    def elastic_extra(self) -> dict:
        """The summary's elastic counts the coordinator keeps (ending.py adds the plans')."""
        out = {"retrained_iterations": self.progress.retrained, **self.snapshots.counts(),
               "samples": (self.iterations - self.end.start) * self.n
               * self.spec.cfg.micro_batch_size,
               "wall_s": round(time.monotonic() - self.began, 3)}
        if self.fenced_messages:  # what processes declared failed sent, ignored
            out["fenced_messages"] = sum(self.fenced_messages.values())
        if self.trace is not None:
            t = self.trace.trace
            out.update(trace_events=t.applied(), trace_kills=t.kills, trace_restarts=t.restarts)
        return out

    def halt(self, reason: str) -> TrainResult:
        self.store.set(P.HALTED, reason)
        set_counter(self.store, P.HOLD, 1)  # every worker between iterations looks now
        self.end.reap(self.processes, self.live(), self.timeouts.workers_exit, self.handle)
        time.sleep(0.1)
        for msg in self.mailbox.drain():
            self.handle(msg)  # last reports: losses of the newest complete iteration
        fatal = reason == self.fatal
        path = self.end.halted(reason, fatal)
        return TrainResult(None, halted=reason, checkpoint=path, versions=self.version,
                           run_dir=self.run_dir, events=self.events, model_error=fatal,
                           model_exception=fatal and self.model_exception)


def train(spec: LaunchSpec, *, console: Optional[Console] = None,
          service=None) -> TrainResult:
    """Run `spec` on a grid of worker processes (Coordinator); writes spec.summary_path
    when training completes."""
    result = Coordinator(spec, console=console, service=service).run()
    if result.summary is not None and spec.summary_path:
        result.summary.save(spec.summary_path)
    return result
