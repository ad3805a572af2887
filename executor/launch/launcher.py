"""`train`: one process per (replica, stage) and the in-process coordinator.

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
from typing import Optional, Sequence

from rich.console import Console

from executor.launch.faults import Injector
from executor.compute.model import ModelConfig
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
from executor.launch.progress_lines import ProgressLines
from executor.runtime.rendezvous import wkey
from planner.failures import NoPlanError
from planner.job import JobSpec
from planner.control.membership import Membership
from planner.speeds import SpeedDetector
from planner.plan import Mode

Worker = tuple[int, int]


# Time units a move is weighed over: local runs are short and their moves cost milliseconds
# (the job spec gives no state_bytes), so any move that lowers the period pays.
ELASTIC_HORIZON = 1e9


class Coordinator(Processes, Admission, Publishing, RunEnd, TraceFaults):
    def __init__(self, cfg: ModelConfig, job: JobSpec, iterations: int, *, kills=(), rejoins=(),
                 stalls=(), slows=(), detect_stragglers=True, solver="greedy", timeout=5.0,
                 run_dir=None, checkpoint_dir=None,
                 resume=None, external=False, store_port=0, console=None, ckpt_every=1,
                 deadline_s=None, service=None, mode: Mode = Mode(), device="auto",
                 model: str = "gpt", run_config=None, trace=None, snapshots: bool = False):
        self.cfg, self.job, self.iterations = cfg, job, iterations
        self.mode = mode  # split backward / staggered optimizer, as the planner's Mode
        self.D, self.S, self.n = job.replicas, job.stages, job.num_microbatches
        self.solver, self.timeout, self.external = solver, timeout, external
        self.service = service  # ServiceWatch: the service plans, the coordinator follows
        if service is not None and service.plan.job.identity_hash() != job.identity_hash():
            raise ValueError(f"job {service.job_id} at the service has another spec than this run")
        self.run_dir = run_dir or tempfile.mkdtemp(prefix="recycle-run-")
        # The workers' logs go here: with --checkpoint-dir elsewhere nothing else creates it
        os.makedirs(self.run_dir, exist_ok=True)
        if run_config is not None:  # RUN_DIR/run.toml: `recycle train --config` repeats it
            save_config(run_config, self.run_dir)
        self._ck_checked = 0.0
        self.console = console or Console(stderr=True)
        self.deadline = time.monotonic() + deadline_s if deadline_s else None
        resume = self.open_checkpoints(checkpoint_dir, model, resume)
        self.workers = [(r, s) for r in range(self.D) for s in range(self.S)]
        self.open_store(store_port, WorkerSettings(
            cfg, job, iterations, uuid.uuid4().hex[:8], workload=model, timeout=timeout,
            ckpt_dir=self.ckpt_dir, ckpt_every=ckpt_every, resume=resume, device=device,
            local_workers=None if external else len(self.workers),
            kills=[list(k) for k in kills], stalls=[list(k) for k in stalls],
            slows=[list(k) for k in slows],
            service=service.worker_config() if service else None))
        self.procs: dict[Worker, multiprocessing.Process] = {}
        self.reaped: set[int] = set()  # pids whose exit has been handled
        self.lost_worker: Optional[Worker] = None
        self.fatal: Optional[str] = None  # a worker found the model itself wrong (one line)
        self.model_exception = False  # the fatal is an exception the model's code raised
        # Who is in which version (planner/control/membership.py): the failed set, the incarnation
        # each worker's newest plan admits, the speeds planned for. Decided there; here
        # carried out (local) or followed (with a service, whose plans say it).
        # Elastic: a worker changes stage when the live set leaves a stage short (moves are
        # weighed over the run's length; planner/control/elastic.py).
        self.trace = trace  # a failure trace replayed on the processes (trace_replay.py)
        self.members = Membership.start(
            self.D, self.S, trace.initial_failed if trace else (), job=job,
            snapshots=snapshots, horizon=ELASTIC_HORIZON).with_speeds(job.speed)
        self.asking: dict[Worker, int] = {}  # newer processes waiting to be admitted
        # --rejoin/--restart (rejoins.py); through a service, admission may wait for it to
        # come back from an outage.
        self.rejoins = RejoinBook(rejoins, external,
                                  4 * timeout + (60.0 if service is not None else 5.0))
        self.record = RunRecord()  # what the run did, for the summary (run_record.py)
        self.done: dict[Worker, tuple[int, int]] = {}  # worker -> (iteration, version)
        self.byes: set[Worker] = set()  # external workers that said they are leaving
        self.final_checks: dict[int, float] = {}
        self.version, self.plan, self.committed = -1, None, -1
        self.suspect_since: Optional[float] = None
        self.lines = ProgressLines(self.console, self.n * cfg.micro_batch_size * cfg.seq_len,
                                   self.start, iterations - 1)
        self.iteration_end: dict[int, float] = {}
        self.events: list[str] = []
        self.faults = Injector(kills, stalls, self.event)
        # Stragglers (planner/speeds.py): the detector fed by the workers' compute times,
        # which re-plans (Membership.measured) when they change.
        # persist 2: a change must be asked for by 2 iterations in a row (planner/speeds.py:
        # beside CPU hogs, noise alone re-planned 4-8 times in 40-80 iterations).
        self.detector = SpeedDetector(self.D, self.S, persist=2) if detect_stragglers else None

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
                if self.complete():
                    self.publish(final=True)
                    self.reap(self.timeout * 2)
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
        elif self.suspect_since is not None and now - self.suspect_since > self.timeout + 0.3:
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
        vals = [self.done[w][0] for w in self.live() if w in self.done]
        if vals and len(vals) == len(self.live()) and min(vals) > self.committed:
            # only the coordinator moves the counter: add the difference (one round trip)
            self.store.add("committed", min(vals) - self.committed)
            self.committed = min(vals)
        if now - self._ck_checked > 0.25:
            self._ck_checked = now
            self.checkpoints.collect(self.losses.upto)
        self.progress()

    def handle(self, m: dict) -> None:
        handler = HANDLERS.get(m["t"])  # messages.py
        if handler is not None:
            handler(self, (m["r"], m["s"]), m)

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
                                             self.iterations, now)



def train(cfg: ModelConfig, replicas: int, stages: int, microbatches: int, iterations: int,
          kills: Sequence[tuple[int, int, int]] = (), rejoins: Sequence[tuple[int, int, int]] = (),
          summary_path: Optional[str] = None, *, job: Optional[JobSpec] = None,
          **options) -> TrainResult:
    """Train `iterations` iterations on a replicas x stages grid of worker processes
    (options: see Coordinator). Writes the summary JSON when training completes."""
    job = job or JobSpec.uniform(replicas, stages, microbatches)
    if (job.replicas, job.stages, job.microbatches) != (replicas, stages, microbatches):
        raise ValueError("job spec grid does not match --replicas/--stages/--microbatches")
    result = Coordinator(cfg, job, iterations, kills=kills, rejoins=rejoins, **options).run()
    if result.summary is not None and summary_path:
        result.summary.save(summary_path)
    return result
