"""`train`: one process per (replica, stage) and the in-process coordinator.

A run is one LaunchSpec (executor/inputs/launch_spec.py: the model, its training
settings, the job, faults, checkpoints, comm), made and validated by `recycle train`; the
coordinator takes it whole.

The coordinator hosts the TCPStore (rendezvous.py), watches its workers and drives the
run's membership (planner/control/membership.py decides; publishing.py plans and publishes, or
follows the plan service with --service). Deaths are seen, fastest first, as a process
exit, a peer's suspect (a re-published version if nobody died), or, for external
(torchrun'd) workers, a stopped heartbeat. A death is a failure event at once; a due
--rejoin/--restart brings the worker back later (admission.py, rejoins.py). Injected
faults are faults.py's, the workers' messages messages.py's, losses losses.py's, and the
end of a run, complete or halted with the newest checkpoint, ending.py's. The rules are in
docs/executor.md ("Who is in which plan version").
"""
from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
import uuid
from typing import Optional

from rich.console import Console

from executor.launch.faults import Injector
from executor.inputs.run_config import save_config
from executor.inputs.worker_settings import WorkerSettings
from executor.launch.admission import Admission
from executor.launch.ending import RunEnd, TrainResult
from executor.launch.messages import HANDLERS
from executor.launch.processes import Processes
from executor.launch.publishing import Halted, Publishing
from executor.launch.trace_faults import TraceFaults
from executor.launch.rejoins import RejoinBook
from executor.launch.run_record import RunRecord
from executor.launch.snapshot_figures import SnapshotFigures
from executor.inputs.launch_spec import LaunchSpec
from executor.launch.progress_lines import ProgressLines
from executor import protocol as P
from executor.protocol import wkey
from executor.timeouts import Timeouts
from executor.runtime.rendezvous import set_counter
from planner.failures import NoPlanError
from planner.control.elastic import LOCAL_HORIZON
from planner.control.membership import Membership
from planner.speeds import SpeedDetector

Worker = tuple[int, int]


class Coordinator(Processes, Admission, Publishing, RunEnd, TraceFaults):
    def __init__(self, spec: LaunchSpec, *, console: Optional[Console] = None,
                 service=None):
        """`spec`: the run (executor/inputs/launch_spec.py, validated when made);
        `console`: where progress goes (default stderr); `service`: a ServiceWatch whose
        plans to follow."""
        self.spec = spec
        cfg, job, iterations = spec.cfg, spec.job, spec.iterations
        self.cfg, self.job, self.iterations = cfg, job, iterations
        self.training = spec.training
        self.mode = spec.mode  # split backward / staggered optimizer, as the planner's Mode
        self.D, self.S, self.n = job.replicas, job.stages, job.num_microbatches
        self.solver, self.timeout, self.external = spec.solver, spec.timeout, spec.external
        self.timeouts = Timeouts(spec.timeout)  # every limit of the run (executor/timeouts.py)
        self.service = service  # ServiceWatch: the service plans, the coordinator follows
        if service is not None and service.plan.job.identity_hash() != job.identity_hash():
            raise ValueError(f"job {service.job_id} at the service has another spec than this run")
        self.run_dir = spec.run_dir or tempfile.mkdtemp(prefix="recycle-run-")
        # The workers' logs go here: with --checkpoint-dir elsewhere nothing else creates it
        os.makedirs(self.run_dir, exist_ok=True)
        if spec.run_config is not None:  # RUN_DIR/run.toml: `recycle train --config` repeats it
            save_config(spec.run_config, self.run_dir)
        self._ck_checked = 0.0
        self.console = console or Console(stderr=True)
        self.deadline = time.monotonic() + spec.deadline_s if spec.deadline_s else None
        resume = self.open_checkpoints(spec.checkpoint_dir, spec.model, spec.resume)
        self.workers = [(r, s) for r in range(self.D) for s in range(self.S)]
        faults = spec.faults
        self.open_store(spec.store_port, WorkerSettings(
            cfg, spec.training, job, iterations, uuid.uuid4().hex[:8], workload=spec.model,
            timeout=spec.timeout, ckpt_dir=self.ckpt_dir, ckpt_every=spec.checkpoint_every,
            resume=resume, device=spec.device,
            local_workers=None if spec.external else len(self.workers),
            kills=[list(k) for k in faults.kills], stalls=[list(k) for k in faults.stalls],
            snapshot_every=spec.snapshot_every, snapshot_memory=spec.snapshot_memory,
            slows=[list(k) for k in faults.slows],
            service=service.worker_config() if service else None))
        self.procs: dict[Worker, multiprocessing.Process] = {}
        self.reaped: set[int] = set()  # pids whose exit has been handled
        self.lost_worker: Optional[Worker] = None
        # service mode: deaths told (the incarnation that died) that no plan has yet
        self.reported: dict[Worker, int] = {}
        self.fatal: Optional[str] = None  # a worker found the model itself wrong (one line)
        self.no_copy: Optional[str] = None  # a worker found no live copy of some stage
        self.model_exception = False  # the fatal is an exception the model's code raised
        # Who is in which version (planner/control/membership.py): the failed set, the incarnation
        # each worker's newest plan admits, the speeds planned for. Decided there; here
        # carried out (local) or followed (with a service, whose plans say it).
        # Elastic: a worker changes stage when the live set leaves a stage short (moves are
        # weighed over the run's length; planner/control/elastic.py).
        trace = self.trace = faults.trace  # a failure trace replayed (trace_replay.py)
        self.members = Membership.start(
            self.D, self.S, trace.initial_failed if trace else (), job=job,
            snapshots=spec.snapshot_every != 0, horizon=LOCAL_HORIZON,
            pause=True).with_speeds(job.speed)
        self.paused_since: Optional[float] = None  # fewer live workers than stages (admission.py)
        self.asking: dict[Worker, int] = {}  # newer processes waiting to be admitted
        # --rejoin/--restart (rejoins.py); through a service, admission may wait for it to
        # come back from an outage.
        self.rejoins = RejoinBook(faults.rejoin_entries, spec.external,
                                  self.timeouts.rejoin_limit(service is not None))
        self.record = RunRecord()  # what the run did, for the summary (run_record.py)
        self.snapshots = SnapshotFigures(spec.snapshot_every, self.event)
        self.done: dict[Worker, tuple[int, int]] = {}  # worker -> (iteration, version)
        self.byes: set[Worker] = set()  # external workers that said they are leaving
        self.final_checks: dict[int, float] = {}
        self.version, self.plan, self.committed = -1, None, -1
        self.suspect_since: Optional[float] = None
        self.lines = ProgressLines(self.console, self.n * cfg.micro_batch_size * cfg.seq_len,
                                   self.start, iterations - 1)
        self.iteration_end: dict[int, float] = {}
        self.began = time.monotonic()  # the summary's wall time
        self.retrained = 0  # iterations trained again after a rollback to a snapshot
        self.events: list[str] = []
        self.faults = Injector(faults.kills, faults.stalls, self.event)
        # Stragglers (planner/speeds.py): the detector fed by the workers' compute times,
        # which re-plans (Membership.measured) when they change.
        # persist 2: a change must be asked for by 2 iterations in a row (planner/speeds.py:
        # beside CPU hogs, noise alone re-planned 4-8 times in 40-80 iterations).
        self.detector = (SpeedDetector(self.D, self.S, persist=2) if spec.detect_stragglers
                         else None)

    def event(self, msg: str) -> None:
        self.events.append(msg)
        self.console.print(f"[yellow]{msg}[/]")

    def died(self, w: Worker, why: str) -> None:
        """A process of `w` is gone (exit seen, its heartbeat stopped, or a newer process
        of it asked in). A death is a failure event as soon as it is known, even when a
        restart is due: the survivors train re-routed until the worker is back."""
        self.event(f"worker {wkey(w)} failed ({why})")
        self.mailbox.forget(w)  # its next process's messages must be told from this one's
        if self.rejoins.drop(w):
            self.update_hold()  # it died before it was admitted: nothing to hold for
        if self.detector is not None:
            self.detector.forget(*w)  # a new process on a new machine says nothing yet
        if self.service is not None:
            if self.service.lost:
                self.lost_worker = w  # nobody can plan around it now: run() halts
            elif w not in self.failed:  # the plan in force admits a process that is gone
                self.service.report_failure(w, self.plan.incarnation(*w), self.run_id, why)
                # a paused job publishes no plan with w failed: its restart may start now
                self.reported[w] = self.plan.incarnation(*w)
        elif w not in self.failed:
            self.done.pop(w, None)
            self.decide(*self.members.fail(w))
        self.restart(w)

    # ---- main loop ---------------------------------------------------------------------
    def run(self) -> TrainResult:
        try:
            self.publish()
            if self.trace is not None:
                self.trace_start()
            if not self.external:
                for w in self.workers:
                    if w not in self.failed:
                        self.spawn(w)
            while True:
                if self.service is not None and self.service.halted:
                    return self.halt(self.service.halted)
                if self.lost_worker is not None:
                    return self.halt(f"worker {wkey(self.lost_worker)} failed while the plan "
                                     f"service had lost the job ({self.service.lost})")
                began = time.monotonic()
                self.tick()
                if self.fatal is not None:
                    return self.halt(self.fatal)
                if self.no_copy is not None:
                    return self.halt(self.no_copy)
                if (why := self.pause_over()) is not None:
                    return self.halt(why)
                if self.complete():
                    if self.service is not None:  # the page's last word: every worker's
                        self.service.amend_progress(self.snapshots.report())  # figures
                    self.publish(final=True)
                    self.reap(self.timeouts.workers_exit)
                    self.final_checkpoint()
                    summary = self.summary()
                    return TrainResult(summary, versions=len(summary.plans),
                                       run_dir=self.run_dir, events=self.events,
                                       iteration_end=self.iteration_end)
                if self.deadline and time.monotonic() > self.deadline:
                    raise TimeoutError(
                        f"training did not finish in time (logs in {self.run_dir}); plan "
                        f"v{self.version}, failed {sorted(self.failed)}, last steps {self.done}, "
                        f"losses {self.losses.counts(self.iterations)}")
                # Every 20 ms, or as soon as a message comes, but at most one tick per
                # 5 ms: with many workers each message would otherwise cost a whole tick.
                self.mailbox.wait(0.02)
                time.sleep(max(0.0, began + 0.005 - time.monotonic()))
        except (NoPlanError, Halted) as exc:
            return self.halt(str(exc))
        finally:
            self.mailbox.close()
            self.faults.release_all()
            for p in self.procs.values():
                if p.exitcode is None:
                    p.kill()
                p.join()
            if self.service is not None:
                self.service.close()

    def stop(self) -> None:
        """From another thread: make run() end now (it kills its workers on the way out)."""
        self.deadline = time.monotonic()

    def tick(self) -> None:
        for msg in self.mailbox.drain():
            self.handle(msg)
        self.faults.tick()
        now = time.monotonic()
        # With a service a worker may exit after it was declared failed (a stalled worker
        # that found itself fenced out): its exit still counts, a due rejoin restarts it.
        for w, p in list(self.procs.items()):
            if p.exitcode is not None and p.pid not in self.reaped:
                self.reaped.add(p.pid)  # each process's exit is handled exactly once
                self.died(w, f"process exited with code {p.exitcode}")
        if self.external:
            self.check_heartbeats()
        if self.trace is not None:
            self.trace_tick(now)
        if self.rejoins.pending:
            self.spawn_due()
            self.update_hold()
        for w, inc in list(self.asking.items()):
            self.admit(w, inc)
        if self.service is not None:
            self.publish()
        elif (self.suspect_since is not None
              and now - self.suspect_since > self.timeouts.resync_after
              and self.paused_since is None):
            # Comm trouble with nobody dead: a new version makes every worker re-sync. Wait
            # out one comm timeout first, so a worker still blocked in the old version can
            # reach the new one; re-publishing sooner let workers chase versions forever.
            self.event(f"suspect reported under plan v{self.version} but no worker died: re-publishing")
            self.decide(*self.members.resync(self.version))
        if self.detector is not None and self.service is None:
            grid = self.detector.update()
            if grid is not None:
                slow = {f"{d}:{s}": v for d, row in enumerate(grid) for s, v in enumerate(row)
                        if v != 1.0}
                self.event(f"measured speeds changed: {slow or 'all nominal'}: re-planning")
                self.decide(*self.members.measured(grid))
        if self.members.moving and self.service is None and self.reached(-1):
            self.members = self.members.entered(self.version)  # the movers hold their stages
        vals = [self.done[w][0] for w in self.live() if w in self.done]
        if (vals and len(vals) == len(self.live()) and min(vals) < self.committed
                and all(self.done[w][1] == self.version for w in self.live())):
            # every worker entered a version that rolled back to a snapshot: count again
            self.retrained += self.committed - min(vals)
            self.committed = min(vals)
            set_counter(self.store, P.COMMITTED, self.committed)
        if vals and len(vals) == len(self.live()) and min(vals) > self.committed:
            # only the coordinator moves the counter: add the difference (one round trip)
            self.store.add(P.COMMITTED, min(vals) - self.committed)
            self.committed = min(vals)
        if now - self._ck_checked > 0.25:
            self._ck_checked = now
            self.checkpoints.collect(self.losses.upto)
        self.progress()

    def handle(self, m) -> None:
        handler = HANDLERS.get(type(m))  # messages.py
        if handler is not None:
            handler(self, m.worker, m)

    @property
    def printed(self) -> int:
        """The newest iteration whose losses are all in (and printed)."""
        return self.losses.printed

    def progress(self) -> None:
        for i in self.losses.newly_complete():
            now = time.monotonic()
            self.iteration_end[i] = now
            v, failed = self.record.trained_under(i, self.version, self.failed)
            self.lines.completed(i, self.losses.loss(i), v, failed, now)
            if self.service is not None:  # the live page's progress (service_source.py)
                self.service.report_progress(i, self.losses.loss(i), self.lines.tokens,
                                             self.iterations, now, self.snapshots.report())



def train(spec: LaunchSpec, *, console: Optional[Console] = None,
          service=None) -> TrainResult:
    """Run `spec` on a grid of worker processes (Coordinator); writes spec.summary_path
    when training completes."""
    result = Coordinator(spec, console=console, service=service).run()
    if result.summary is not None and spec.summary_path:
        result.summary.save(spec.summary_path)
    return result
