"""`--model hf:CONFIG`: a Hugging Face `transformers` causal LM, split into stages for you.

CONFIG is a local config.json (or a directory holding one) or a transformers model type
(`gpt2`, `llama`, `mistral`, `qwen2`, ...: its config class's defaults), followed by
optional overrides in query form: `hf:gpt2?n_layer=4&n_embd=64&vocab_size=256`. Nothing is
downloaded: the model is built from its config class with fresh, seeded weights.

Stages: stage 0 holds the token (and, GPT-2, position) embeddings, the last stage the final
norm and the LM head, the decoder blocks are split like the built-in models' (ModelConfig
.boundaries; `--split balanced` balances them on profiled per-layer costs). Each stage
builds the whole model under a private RNG seeded by cfg.seed and keeps its part, so every
replica, split and the reference start identical. A tied embedding and head (GPT-2, small
Llamas with tie_word_embeddings) on different stages is a tie (executor/runtime/steps/tied.py).

Between stages the hidden states travel, plus, for rotary models (Llama and kin), the
position ids (int64: no gradient): each stage computes its rotary embeddings from them.
Attention is causal through the model's own SDPA path (no padding mask: every sequence
is full length). Dropout is the config's (GPT-2's 0.1 by default): every draw is keyed by
(seed, iteration, micro-batch, layer) (executor/compute/draws.py), so a mask is the same on
whichever worker runs it and in the reference. Layers are numbered as the built-ins':
0 the embeddings (and GPT-2's embedding dropout), 1..L the blocks, L+1 the norm and head.

transformers is an optional extra (`pip install recycle[hf]`).
"""
from __future__ import annotations

import functools
import json
import os
from urllib.parse import parse_qsl

import torch
from torch import Tensor, nn

from executor.compute import data
from executor.compute.model import ModelConfig, Workload, layer_range
from executor.compute.units import layer
from executor.models.modules import seeded_build
from executor.runtime.steps.tied import declare, find_ties

PREFIX = "hf:"


def is_hf(name: str) -> bool:
    return name.startswith(PREFIX)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ValueError("--model hf:...: transformers is not installed "
                         "(pip install 'recycle[hf]')") from None
    return transformers


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def hf_config(name: str):
    """The transformers config NAME (`hf:CONFIG[?key=value&...]`) stands for; ValueError
    with one line if it cannot be had."""
    tf = _transformers()
    tf.logging.set_verbosity_error()  # a tiny vocab makes it warn about GPT-2's token ids
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    src, _, query = name[len(PREFIX):].partition("?")
    try:
        pairs = parse_qsl(query, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"--model {name}: overrides must read key=value&key=value") from None
    overrides = {k: _value(v) for k, v in pairs}
    twice = sorted({k for k, _ in pairs if sum(1 for j, _ in pairs if j == k) > 1})
    if twice:
        raise ValueError(f"--model {name}: {', '.join(twice)} given more than once")
    path = os.path.join(src, "config.json") if os.path.isdir(src) else src
    if src.endswith(".json") or os.path.isdir(src):
        try:
            with open(path) as fh:
                d = json.load(fh)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--model {name}: cannot read {path}: {exc}") from None
        kind = d.get("model_type")
        if kind not in CONFIG_MAPPING:
            raise ValueError(f"--model {name}: {path} has model_type {kind!r}, which this "
                             f"transformers {tf.__version__} does not know")
        cls = CONFIG_MAPPING[kind]
    elif src in CONFIG_MAPPING:
        d, cls = {}, CONFIG_MAPPING[src]
    else:
        raise ValueError(f"--model {name}: {src!r} is neither a config.json nor a "
                         f"transformers model type (e.g. gpt2, llama)")
    default = _construct(name, cls, d)
    for key in overrides:  # a config class takes unknown keys silently
        if not hasattr(default, key):
            raise ValueError(f"--model {name}: {cls.__name__} has no field {key!r}")
    # Overrides go in at construction: fields derived there (Llama's head_dim from
    # hidden_size and the heads) follow them.
    return _construct(name, cls, {**d, **overrides})


def _construct(name: str, cls, fields: dict):
    """cls.from_dict(fields), whatever it refuses as one line (transformers validates
    fields and architectures with its own error types, messages over several lines)."""
    try:
        return cls.from_dict(fields)
    except Exception as exc:  # the config class's checks: any of them is bad input
        why = " ".join(str(exc).split())
        raise ValueError(f"--model {name}: {cls.__name__} refuses it: {why}") from None


def _positions(c) -> int:
    return getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None) or 1024


def shape(name: str) -> dict:
    """ModelConfig's architecture fields for hf:CONFIG (seq_len: a default the flags may
    change, at most the model's positions)."""
    c = hf_config(name)
    positions = _positions(c)
    return dict(d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                n_heads=c.num_attention_heads, vocab=c.vocab_size, seq_len=min(16, positions))


def _parts(full: nn.Module) -> dict:
    base = full.base_model
    blocks = getattr(base, "h", None) or getattr(base, "layers", None)
    norm = getattr(base, "ln_f", None) or getattr(base, "norm", None)
    if blocks is None or norm is None or full.get_output_embeddings() is None:
        raise ValueError(f"{type(full).__name__}: no decoder blocks (h/layers), final norm "
                         f"(ln_f/norm) or LM head found; not a supported causal LM layout")
    return dict(embed=full.get_input_embeddings(), pos=getattr(base, "wpe", None),
                drop=getattr(base, "drop", None),  # GPT-2's dropout after the embeddings
                blocks=blocks, norm=norm, head=full.get_output_embeddings(),
                rotary=getattr(base, "rotary_emb", None))


class HFStage(nn.Module):
    """Blocks [lo, hi) of a Hugging Face decoder, with the embeddings on stage 0 and the
    final norm and head on the last stage."""

    def __init__(self, parts: dict, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        self.embed = parts["embed"] if first else None
        self.pos = parts["pos"] if first else None
        self.drop = parts["drop"] if first else None
        self.blocks = nn.ModuleDict({str(i): parts["blocks"][i] for i in range(lo, hi)})
        self.norm = parts["norm"] if last else None
        self.head = parts["head"] if last else None
        self.rotary = parts["rotary"]  # buffers only (inverse frequencies): every stage
        self.last = last
        self.n_layers = len(parts["blocks"])

    def _embed(self, x: Tensor, position_ids: Tensor) -> Tensor:
        h = self.embed(x)
        if self.pos is not None:
            h = h + self.pos(position_ids)
        return self.drop(h) if self.drop is not None else h

    def forward(self, x: Tensor, position_ids: Tensor = None):
        # layers numbered in the whole model (units.py): 0 the embeddings, 1..L the blocks
        if self.embed is not None:  # token ids
            b, T = x.shape
            position_ids = torch.arange(T, device=x.device).repeat(b, 1)
            h = layer(0, self._embed, x, position_ids)
        else:
            h = x
        kw = {}
        if self.rotary is not None:
            kw = dict(position_ids=position_ids,
                      position_embeddings=self.rotary(h, position_ids))
        for i, block in self.blocks.items():
            # no attention mask: SDPA's causal path
            h = layer(int(i) + 1, functools.partial(_block, block, **kw), h, block=int(i))
        if self.last:
            return layer(self.n_layers + 1, lambda t: self.head(self.norm(t)), h)
        return (h, position_ids) if self.rotary is not None else h


def _block(block: nn.Module, h: Tensor, **kw) -> Tensor:
    out = block(h, **kw)
    return out[0] if isinstance(out, tuple) else out


def build(config, cfg: ModelConfig, stage: int, stages: int) -> nn.Module:
    from transformers import AutoModelForCausalLM
    full = seeded_build(cfg, lambda: AutoModelForCausalLM.from_config(config))
    parts = _parts(full)
    n = len(parts["blocks"])
    mods = [HFStage(parts, *layer_range(n, s, stages, cfg.boundaries), s == 0, s == stages - 1)
            for s in range(stages)]
    names = [{id(p): k for k, p in m.named_parameters()} for m in mods]
    return declare(mods[stage], find_ties(names))


def workload(name: str) -> Workload:
    """The Workload of hf:CONFIG: next-token cross-entropy on token data (synthetic, or a
    token file with `--data`), the model's vocab from its config."""
    config = hf_config(name)
    positions = _positions(config)

    def build_stage(cfg: ModelConfig, stage: int, stages: int) -> nn.Module:
        if cfg.vocab != config.vocab_size:
            raise ValueError(f"--model {name} has vocab_size {config.vocab_size}, the run "
                             f"{cfg.vocab}")
        if cfg.seq_len > positions:
            raise ValueError(f"--seq-len {cfg.seq_len} is longer than --model {name}'s "
                             f"{positions} positions")
        return build(config, cfg, stage, stages)

    return Workload(build_stage=build_stage, microbatch=data.microbatch, reads_tokens=True,
                    reshapes=True)
