"""Checkpoint-restart: every failure restores the job from its last checkpoint."""
from __future__ import annotations

from planner.simulation.engine import Decision
from planner.simulation.base import Policy


class CheckpointRestart(Policy):
    """Any failure stops the job: the work since the last checkpoint is lost, and the job
    restarts (detection + restart time) on spare workers if there are enough, else it
    waits for repairs. Pays the checkpoints in steady state (as every policy does)."""
    name = "checkpoint-restart"

    def _whole(self, failed) -> int:
        return self.ctx.job.replicas - len({d for d, _ in failed})

    def steady(self, failed, speed):
        if self.ctx.params.checkpoint_shrink:
            # the spares fill failed slots; the replicas still short of a worker are left out
            left = sorted(failed)[self.ctx.params.spares:]
            n = self._whole(left)
            s = self.ctx.slowest(frozenset(), speed)
            return Decision(n * self.ctx.M / self.ctx.P0 * s, self.ctx.P0 / s) if n else Decision(0.0)
        if len(failed) > self.ctx.params.spares:
            return Decision(0.0)
        s = self.ctx.slowest(frozenset(), speed)
        return Decision(self.ctx.base * s, self.ctx.P0 / s)

    def on_event(self, kind, workers, before, after, speed, run):
        p = self.ctx.params
        if kind == "speed":
            return None if self.halted else self.steady(after, speed)
        if kind == "recover" and p.checkpoint_shrink and not self.halted:
            # grow back when a replica is whole again: a planned restart (checkpoint first,
            # nothing lost), as an elastic launcher does on a membership change
            d = self.steady(after, speed)
            if d.rate > self.steady(before, speed).rate:
                return Decision(d.rate, d.iter_s, stall_s=p.restart_s, note="grown on repair")
            return None
        if kind == "recover":
            return self._restart(after, speed) if self.halted else None
        if self.halted:
            return None
        d = self.steady(after, speed)
        if p.checkpoint_shrink and d.rate == self.steady(before, speed).rate:
            return None  # only replicas already left out (or spares cover it)
        self.halted = d.rate <= 0
        return Decision(d.rate, d.iter_s, lose="checkpoint", stall_s=p.detect_s + p.restart_s,
                        note="restart on spares" if d.rate > 0 else "waiting for repair")
