"""Model presets: GPT-3 shapes the papers evaluate, turned into a job spec by FLOP counts.

Estimates, not measurements (docs/simulator.md says how to use a profiled spec instead):
  - a transformer layer of width d on a micro-batch of b sequences of length L does
    24*b*L*d^2 matmul FLOPs forward plus 4*b*L^2*d in attention; `I` costs as much as `F`,
    `W` the matmul part only (attention has no weights);
  - the LM head does 2*b*L*d*V each of F, I and W; the embedding lookup costs nothing;
  - a GPU sustains `tflops` (default 150: half an A100's bf16 peak) and holds
    `memory_gb` (80);
  - OPT: the stage's gradients all-reduced across D replicas (ring, 2 bytes a parameter,
    25 GB/s) plus Adam's update (16 bytes a parameter read and written at 1.5 TB/s);
  - activation memory per micro-batch: 34*b*L*d bytes per layer (flash attention, no
    recomputation, Korthikanti et al.); parameters with Adam state: 16 bytes each;
  - p2p: one activation (2*b*L*d bytes) at 25 GB/s, within and across replicas;
  - a stage's state (what a worker that changes stage loads): its parameters with Adam
    state, 16 bytes each, at the same 25 GB/s.
Durations are in microseconds (unit_s = 1e-6), memory in MB.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.job import Cost, JobSpec, Memory, P2P
from planner.simulation.costs import Model, Unit, group


@dataclass(frozen=True)
class Shape:
    layers: int
    d_model: int
    heads: int
    seq: int = 2048
    vocab: int = 50257
    reconfig_s: float = 5.0  # Oobleck's reconfiguration time for this size (its artifact: 2-10 s)


PRESETS = {
    "gpt3-medium": Shape(24, 1024, 16, reconfig_s=2.0),
    "gpt3-2.7b": Shape(32, 2560, 32, reconfig_s=5.0),
    "gpt3-6.7b": Shape(32, 4096, 32, reconfig_s=10.0),
    # Llama 3 405B's shape (126 layers, width 16,384, 128 heads, 8K sequences, a 128K
    # vocabulary), its 12*d^2 parameters a layer as GPT's (3.2B: 405B in all); its
    # grouped-query attention and SwiGLU are not modelled apart
    "llama3-405b": Shape(126, 16384, 128, seq=8192, vocab=128256, reconfig_s=10.0),
}
UNIT_S = 1e-6
BANDWIDTH = 25e9  # bytes/s, network
HBM = 1.5e12  # bytes/s


def preset_model(name: str, replicas: int, microbatch_size: int = 1, tflops: float = 150.0,
                 memory_gb: float = 80.0, bandwidth: float = BANDWIDTH) -> Model:
    """`tflops`, `memory_gb` and `bandwidth` (bytes/s) are a worker's: a GPU's, or a host's
    when a worker is a host's GPUs (tensor parallel inside it)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    if not (tflops > 0 and memory_gb > 0 and microbatch_size >= 1):
        raise ValueError("--gpu-tflops, --gpu-memory-gb and the micro-batch size must be positive")
    sh = PRESETS[name]
    b, L, d, V = microbatch_size, sh.seq, sh.d_model, sh.vocab
    rate = tflops * 1e12

    def us(flops: float) -> int:
        return max(1, round(flops / rate / UNIT_S))

    def opt_us(params: float) -> int:
        allreduce = 2 * params * 2 * (replicas - 1) / max(replicas, 1) / bandwidth
        adam = 16 * params * 2 / HBM
        return max(1, round((allreduce + adam) / UNIT_S))

    mb = 1 / 2**20
    matmul, attn = 24 * b * L * d * d, 4 * b * L * L * d
    layer_params = 12 * d * d
    layer = Unit(F=us(matmul + attn), I=us(matmul + attn), W=us(matmul),
                 OPT=opt_us(layer_params), activation=max(1, round(34 * b * L * d * mb)),
                 params=round(16 * layer_params * mb),
                 state_bytes=round(16 * layer_params * mb) * 2**20)
    embed = Unit(F=0, I=0, W=0, OPT=opt_us(V * d), activation=round(2 * b * L * d * mb),
                 params=round(16 * V * d * mb), state_bytes=round(16 * V * d * mb) * 2**20)
    head_flops = 2 * b * L * d * V
    head = Unit(F=us(head_flops), I=us(head_flops), W=us(head_flops), OPT=opt_us(V * d),
                activation=round(4 * b * L * V * mb), params=round(16 * V * d * mb),
                state_bytes=round(16 * V * d * mb) * 2**20)
    units = (embed,) + (layer,) * sh.layers + (head,)
    return Model(units, capacity=round(memory_gb * 1024), samples_per_microbatch=b, name=name)


def preset_job(model: Model, replicas: int, stages: int, microbatches: int,
               seq: int, d_model: int, microbatch_size: int,
               bandwidth: float = BANDWIDTH) -> JobSpec:
    """The D x S job whose stages group the model's units (balanced F+I+W)."""
    if stages > len(model.units) - 2:
        raise ValueError(f"{model.name} has {len(model.units) - 2} layers: at most that many stages")
    groups = group(model.units, stages)
    sums = {op: [sum(getattr(u, op) for u in g) for g in groups] for op in ("F", "I", "W", "OPT")}
    act = [sum(u.activation for u in g) for g in groups]
    cap = [model.capacity - sum(u.params for u in g) for g in groups]
    if any(c < a for a, c in zip(act, cap)):
        raise ValueError(f"{model.name} does not fit in {stages} stages of "
                         f"{model.capacity / 1024:g} GB: use more stages")
    hop = max(1, round(2 * microbatch_size * seq * d_model / bandwidth / UNIT_S))
    # a worker that takes a stage loads its parameters and Adam state over the network
    state = [sum(u.params for u in g) * 2**20 for g in groups]
    return JobSpec(replicas=replicas, stages=stages, microbatches=microbatches,
                   cost=Cost(**sums), p2p=P2P(intra=hop, cross=hop),
                   memory=Memory(activation=act, capacity=cap),
                   state_bytes=state, bandwidth=bandwidth * UNIT_S)
