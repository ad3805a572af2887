"""A model's configuration, and how it is trained, as two plain values every part reads.

ModelConfig is the model: its shape, seed, micro-batch size, stage boundaries and the
architecture extras; everything that decides which parameters exist and what data a
micro-batch holds. TrainingSettings is how those parameters are trained: the optimizer,
the learning-rate schedule, clipping, precision and the token file read. The two travel
side by side (WorkerSettings, the checkpoint manifest, LaunchSpec, the reference run), each
serialised whole.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from executor.inputs.run_config import OptimizerSection


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 64
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 4
    micro_batch_size: int = 4
    seed: int = 0
    # Architecture extras (families that use them; 0 = the family's default).
    n_kv_heads: int = 0  # grouped-query attention: key/value heads (0: n_heads)
    ffn_hidden: int = 0  # MLP hidden width (0: the family's rule)
    # Stage boundaries: first layer of stages 1..S-1 (empty: by layer count, layer_range).
    boundaries: tuple[int, ...] = ()

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["boundaries"] = list(self.boundaries)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        if "boundaries" in d:
            d["boundaries"] = tuple(d["boundaries"])
        return cls(**d)


@dataclass(frozen=True)
class TrainingSettings:
    """Optimizer, schedule, clipping, precision and data of a run (executor/runtime/
    stepper.py, executor/compute/one_process/reference.py, executor/optim/)."""
    # [optimizer]'s settings, by their names, defaulted once there (run_config.py)
    lr: float = OptimizerSection.lr
    weight_decay: float = OptimizerSection.weight_decay
    betas: tuple[float, float] = (0.9, 0.95)
    precision: str = "fp32"  # fp32 or bf16 (autocast; fp32 master weights and gradients)
    lr_schedule: str = "constant"  # constant or cosine (after warmup_iters of linear warm-up)
    warmup_iters: int = 0
    total_iters: int = 0  # cosine horizon (`recycle train` sets it to --iterations)
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of lr
    clip: float = 0.0  # clip gradients to this global norm over the whole model (0: off)
    data: str = ""  # token file (`recycle data prepare`); empty: the workload's own data
    # none, full or selective[:N]: layers whose forward is recomputed in backward
    # (executor/compute/backward/recompute.py); changes memory and time, never the numbers
    activation_checkpointing: str = "none"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingSettings":
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)


TRAINING_FIELDS = frozenset(f.name for f in fields(TrainingSettings))


def split_flat(d: dict) -> tuple[dict, dict]:
    """A dict of the one config that once held both (checkpoints, configs written before the
    split) as (model fields, training fields); other keys stay with the model's."""
    return ({k: v for k, v in d.items() if k not in TRAINING_FIELDS},
            {k: v for k, v in d.items() if k in TRAINING_FIELDS})
