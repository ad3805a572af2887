"""How a run ends: complete (every loss and checksum in), the workers reaped (external
ones say `bye`), the last checkpoint, the summary; or halted, with the newest checkpoint to
resume from and a line that says why."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Optional

from executor.checkpoint import CheckpointStore, read_checkpoint
from executor.compute.reference import Summary
from executor.launch.losses import LossBook
from executor import protocol as P
from executor.protocol import Bye, Done
from executor.runtime.rendezvous import set_counter


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
    """Mixed into the Coordinator (launcher.py): its store, workers, losses and record."""

    def open_checkpoints(self, checkpoint_dir: Optional[str], model: str,
                         resume: Optional[str]) -> Optional[str]:
        """Where checkpoints go, and, resuming, the checkpoint's losses and first
        iteration; returns the checkpoint resumed from (absolute) or None."""
        job, cfg, training = self.job, self.cfg, self.training
        self.ckpt_dir = os.path.abspath(checkpoint_dir or os.path.join(self.run_dir, "checkpoints"))
        self.checkpoints = CheckpointStore(self.ckpt_dir, (self.D, self.S, job.microbatches),
                                           dict(cfg.to_dict(), workload=model),
                                           job=job.model_dump(mode="json"),
                                           training=training.to_dict())
        self.start, losses = 0, {}
        if resume:
            resume, man = read_checkpoint(resume, job, cfg, training, self.iterations, model)
            resume = os.path.abspath(resume)
            self.start = man.iteration + 1
            losses = {i: {g: v for g, v in enumerate(row)} for i, row in enumerate(man.losses)}
        self.losses = LossBook(self.n, self.start, losses)
        return resume

    def complete(self) -> bool:
        """Every iteration's losses are in, and every live worker reported the last one
        under the plan in force, with its stage's checksum."""
        if self.losses.complete_through() < self.iterations - 1:
            return False
        final = (self.iterations - 1, self.version)
        return (all(self.done.get(w) == final for w in self.live())
                and len(self.final_checks) == self.S)

    def reap(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for p in self.procs.values():
            p.join(max(0.1, end - time.monotonic()))
        if self.external:
            self.await_byes(end)

    def await_byes(self, end: float) -> None:
        """External workers (torchrun'd, node agents') have no process here to join, but
        they read this store until they have seen the end: closing it before they say
        `bye` crashed them (and their agents took that for failures, even restarted them).
        Only `done` (the last losses, for a halt) is handled meanwhile: nothing may
        publish a plan after the end."""
        want = set(self.live())
        while not want <= self.byes and time.monotonic() < end:
            self.mailbox.wait(0.05)
            for m in self.mailbox.drain():
                if isinstance(m, Bye):
                    self.byes.add(m.worker)
                elif isinstance(m, Done):
                    self.handle(m)

    def summary(self) -> Summary:
        plans = self.record.plans_used(self.iterations)
        return Summary(losses=[self.losses.loss(i) for i in range(self.iterations)],
                       param_checksums=[self.final_checks[s] for s in range(self.S)],
                       recovery=self.record.recovery(self.faults.log), plans=plans,
                       elastic=self.elastic_counts(plans))

    def elastic_counts(self, plans: list[dict]) -> dict:
        """Moves and snapshot restores of the plan versions trained under, the iterations
        trained again after rollbacks to snapshots, the pauses (fewer live workers than
        stages) and their wall time, the samples trained (each global batch once) and the
        wall time; and the trace's counts."""
        moves = [m for p in plans for m in p.get("moves", [])]
        cfg = self.cfg
        out = {"moves": sum(1 for m in moves if m["from_stage"] is not None),
               "joins": sum(1 for m in moves if m["from_stage"] is None),
               "snapshot_restores": sum(1 for m in moves if m["source"] == "snapshot"),
               "retrained_iterations": self.retrained,
               "pauses": self.record.pauses, "paused_s": round(self.record.paused_s, 3),
               **self.snapshots.counts(),
               "samples": (self.iterations - self.start) * self.n * cfg.micro_batch_size,
               "wall_s": round(time.monotonic() - self.began, 3)}
        if self.trace is not None:
            out.update(trace_events=self.trace.applied(), trace_kills=self.trace.kills,
                       trace_restarts=self.trace.restarts)
        return out

    def halt(self, reason: str) -> TrainResult:
        self.store.set(P.HALTED, reason)
        set_counter(self.store, P.HOLD, 1)  # every worker between iterations looks now
        self.reap(self.timeouts.workers_exit)
        time.sleep(0.1)
        for msg in self.mailbox.drain():
            self.handle(msg)  # last reports: losses of the newest complete iteration
        self.checkpoints.collect(self.losses.upto)
        path = self.checkpoints.newest()
        where = (f"newest checkpoint {path}; continue with `recycle train --resume {path}`"
                 if path else "no complete checkpoint yet")
        if reason == self.fatal:  # the same code would raise again on resume
            where = "fix the model first; " + where
        # one line, never wrapped: a log or checkpoint path must stay whole to be copied
        self.console.print(f"[red bold]training halted:[/] {reason}; {where}", soft_wrap=True)
        return TrainResult(None, halted=reason, checkpoint=path, versions=self.version,
                           run_dir=self.run_dir, events=self.events,
                           model_error=reason == self.fatal,
                           model_exception=reason == self.fatal and self.model_exception)

    def final_checkpoint(self) -> None:
        """The last iteration's checkpoint: local workers have exited (their parts are
        written); torchrun'd ones may still be writing, so wait for them a little."""
        end = time.monotonic() + (self.timeouts.workers_exit if self.external else 0)
        while (self.checkpoints.collect(self.losses.upto) != self.iterations - 1
               and time.monotonic() < end):
            time.sleep(0.1)
