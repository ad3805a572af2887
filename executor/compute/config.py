"""A model's configuration (shape, seed, and, for now, its training settings): plain data
every part reads (the compute, the data loaders, the checkpoint manifest)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 64
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 4
    micro_batch_size: int = 4
    seed: int = 0
    lr: float = 3e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    # Architecture extras (families that use them; 0 = the family's default).
    n_kv_heads: int = 0  # grouped-query attention: key/value heads (0: n_heads)
    ffn_hidden: int = 0  # MLP hidden width (0: the family's rule)
    # Stage boundaries: first layer of stages 1..S-1 (empty: by layer count, layer_range).
    boundaries: tuple[int, ...] = ()
    # Training (executor/runtime/stepper.py, executor/compute/reference.py).
    precision: str = "fp32"  # fp32 or bf16 (autocast; fp32 master weights and gradients)
    lr_schedule: str = "constant"  # constant or cosine (after warmup_iters of linear warm-up)
    warmup_iters: int = 0
    total_iters: int = 0  # cosine horizon (`recycle train` sets it to --iterations)
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of lr
    clip: float = 0.0  # clip gradients to this global norm over the whole model (0: off)
    data: str = ""  # token file (`recycle data prepare`); empty: the workload's own data

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        d["boundaries"] = list(self.boundaries)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        for key in ("betas", "boundaries"):
            if key in d:
                d[key] = tuple(d[key])
        return cls(**d)
