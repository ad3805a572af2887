"""One stage as a worker runs it: its module and optimizer, the compute of its F/I/W, the
stepper (rollback copies, clipping, tied weights), its checkpoint parts and its data
loader. Built at start and again when a plan moves the worker to another stage (the state
then comes from a holder: stage_state/sync.py)."""
from __future__ import annotations

from typing import Callable

from executor.checkpoint import load_by_name
from executor.checkpoint.part_writer import PartWriter
from executor.compute.stage import StageCompute
from executor.runtime.steps.batches import Batches
from executor.runtime.steps.stepper import StageStepper
from executor.runtime.worker_config import WorkerConfig


class StageRuntime:
    def __init__(self, conf: WorkerConfig, stage: int, store, log: Callable[[str], None]):
        self.conf, self.stage, self.log = conf, stage, log
        wl, cfg, S = conf.workload, conf.model, conf.stages
        self.module = wl.build_stage(cfg, stage, S).to(conf.device)
        self.opt = wl.make_optimizer(conf.training, self.module.parameters())
        self.params = list(self.module.parameters())  # walking the module tree costs 0.1 ms
        self.names = [n for n, _ in self.module.named_parameters()]
        self.compute = StageCompute(self.module, stage == 0, stage == S - 1,
                                    1.0 / conf.job.num_microbatches, wl.loss_fn,
                                    precision=conf.training.precision, stage=stage,
                                    seed=cfg.seed,
                                    checkpointing=conf.training.activation_checkpointing)
        self.stepper = StageStepper(self.module, self.opt, conf.training, stage, S, store,
                                    log=log)
        ck = conf.checkpoint
        self.parts = PartWriter(ck.checkpoint_dir, ck.checkpoint_every, conf.iterations, stage,
                                log, shape=conf.part_shape, run=conf.run_id)
        # Micro-batches of the next iteration, loaded on a thread while this one computes
        # (a loader's work off the critical path). Only the first and last stage load data.
        self.batches = Batches(lambda it, g: wl.microbatch(cfg, it, g), stage in (0, S - 1))

    def load_parts(self, parts) -> None:
        """This stage's state from a checkpoint's parts, written under any shape (by name)."""
        load_by_name(self.module, self.opt, list(parts), lr=self.conf.training.lr)

    def state(self) -> dict:
        """Module and optimizer state dicts, and the parameter names in the optimizer's
        order (a shape change moves the state by name: stage_state/by_name.py)."""
        return {"names": self.names, "model": self.module.state_dict(),
                "optim": self.opt.state_dict()}

    def load_state(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])

    def initial_state(self, stage: int, parts=()) -> dict:
        """Stage `stage`'s parameters and optimizer state before the run's first step, or,
        given a checkpoint's `parts`, as that checkpoint holds them (by name)."""
        wl, conf = self.conf.workload, self.conf
        module = wl.build_stage(conf.model, stage, conf.stages)
        opt = wl.make_optimizer(conf.training, module.parameters())
        if parts:
            load_by_name(module, opt, list(parts), lr=conf.training.lr)
        return {"names": [n for n, _ in module.named_parameters()],
                "model": module.state_dict(), "optim": opt.state_dict()}

    def close(self) -> None:
        """Before it is replaced (a move) or the process ends: the last step settled where
        possible, the loader stopped, the last checkpoint part written."""
        self.batches.close()
        self.parts.finish()
