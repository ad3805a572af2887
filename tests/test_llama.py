"""The Llama-style family (`--model llama[:FLAVOUR]`): split == unsplit, GQA and rotary
shapes, the real flavours' parameter counts, exact distributed training against the
reference, and bad NAME:FLAVOUR input."""
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from executor.compute.model import ModelConfig
from executor.compute.measure.profile import measure_stage
from executor.compute.one_process.reference import Summary, compare
from executor.models.flavours import LLAMA
from executor.models.llama import (Attention, apply_rotary, build_full, build_stage,
                                   rotary, workload)
from recycle.cli import app

DEBUG = ModelConfig(**LLAMA["debug"].shape(), micro_batch_size=2)


def one_line_exit_2(r, says):
    err = r.stderr if getattr(r, "stderr", None) else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and says in lines[0], err


@pytest.mark.parametrize("stages,boundaries", [(2, ()), (3, ()), (3, (1, 1))])
def test_stages_equal_the_unsplit_model_forward_and_gradients(stages, boundaries):
    cfg = dataclasses.replace(DEBUG, boundaries=boundaries)
    full = build_full(cfg)
    parts = [build_stage(cfg, s, stages) for s in range(stages)]
    ref = dict(full.named_parameters())
    names = [n for p in parts for n, _ in p.named_parameters()]
    assert sorted(names) == sorted(ref)  # global layer keys: same names, none twice
    for p in parts:
        for n, t in p.named_parameters():
            assert torch.equal(t, ref[n]), n  # bit-identical initialisation
    tokens, targets = workload().microbatch(cfg, 0, 0)
    loss_fn = workload().loss_fn
    loss_fn(full(tokens), targets).backward()
    x = tokens
    for p in parts:
        x = p(x)
    loss_fn(x, targets).backward()
    for p in parts:
        for n, t in p.named_parameters():
            torch.testing.assert_close(t.grad, ref[n].grad, rtol=1e-5, atol=1e-7, msg=n)
    assert all(ref[n].grad.abs().sum() > 0 for n in ref)  # every parameter is trained


def test_grouped_query_attention_and_rotary_shapes():
    cfg = DEBUG
    attn = build_full(cfg).layers["0"].attention
    hd = cfg.d_model // cfg.n_heads
    assert attn.wq.weight.shape == (cfg.n_heads * hd, cfg.d_model)
    assert attn.wk.weight.shape == attn.wv.weight.shape == (cfg.n_kv_heads * hd, cfg.d_model)
    assert cfg.n_kv_heads < cfg.n_heads and attn.wq.bias is None
    x = torch.randn(2, cfg.seq_len, cfg.d_model, generator=torch.Generator().manual_seed(0))
    cos, sin = rotary(cfg.seq_len, hd)
    assert cos.shape == sin.shape == (cfg.seq_len, hd)
    y = attn(x, cos, sin)
    assert y.shape == x.shape
    # GQA == every query head attending with its group's key/value head, causally
    b, T, _ = x.shape
    heads = lambda t, h: t.view(b, T, h, hd).transpose(1, 2)
    q = apply_rotary(heads(attn.wq(x), cfg.n_heads), cos, sin)
    k = apply_rotary(heads(attn.wk(x), cfg.n_kv_heads), cos, sin)
    v = heads(attn.wv(x), cfg.n_kv_heads)
    rep = cfg.n_heads // cfg.n_kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    att = (q @ k.transpose(-1, -2)) / hd ** 0.5
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    manual = attn.wo((att.softmax(-1) @ v).transpose(1, 2).reshape(b, T, -1))
    torch.testing.assert_close(y, manual, rtol=1e-5, atol=1e-6)
    # rotary: a rotation (norms kept), and q.k depends only on the positions' offset
    u = torch.randn(1, 1, 1, hd).expand(1, 1, T, hd)
    w = torch.randn(1, 1, 1, hd).expand(1, 1, T, hd)
    ru, rw = apply_rotary(u, cos, sin), apply_rotary(w, cos, sin)
    torch.testing.assert_close(ru.norm(dim=-1), u.norm(dim=-1))
    dots = ru[0, 0] @ rw[0, 0].T  # [i, j] = <R_i u, R_j w>
    torch.testing.assert_close(dots[5, 3], dots[9, 7], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(dots[5, 3], dots[5, 4])


@pytest.mark.parametrize("flavour,expected", [
    ("125m", 125e6), ("1b", 1.1e9), ("8b", 8.03e9)])  # 1b: TinyLlama-1.1B, 8b: Llama-3-8B
def test_real_flavours_have_their_parameter_counts(flavour, expected):
    cfg = ModelConfig(**LLAMA[flavour].shape())
    with torch.device("meta"):  # shapes only: 8B parameters are never allocated
        full = build_full(cfg)
        parts = [build_stage(cfg, s, 4) for s in range(4)]
    n = sum(p.numel() for p in full.parameters())
    assert abs(n / expected - 1) < 0.02, (flavour, n)
    assert sum(p.numel() for m in parts for p in m.parameters()) == n
    assert full.output.weight is not full.tok_embeddings.weight  # untied head
    assert not any(m.bias is not None for m in full.modules() if isinstance(m, torch.nn.Linear))


def test_profile_excludes_parameters_from_activation_memory():
    """torch.nn.Linear saves its weight for backward as a transposed view: counted as a
    micro-batch's activation, a 125m stage "held" 150 MB per micro-batch at 16 tokens."""
    cfg = dataclasses.replace(DEBUG, micro_batch_size=1, seq_len=4)
    r = measure_stage(cfg, 1, 2, repeats=1, workload=workload())
    assert 0 < r["saved_bytes"] < r["param_bytes"] / 4, r


@pytest.mark.hard_timeout(120)
def test_train_llama_debug_is_exact_against_the_reference(tmp_path):
    common = ["train", "--model", "llama:debug", "-d", "2", "-s", "2", "-m", "2",
              "--micro-batch-size", "2", "--iterations", "3"]
    got, ref = tmp_path / "run.json", tmp_path / "ref.json"
    r = CliRunner().invoke(app, [*common, "--kill", "1:1@1", "--timeout", "4",
                                 "--run-dir", str(tmp_path), "--summary", str(got)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, [*common, "--reference", "--summary", str(ref)])
    assert r.exit_code == 0, r.output
    a, b = Summary.load(str(got)), Summary.load(str(ref))
    assert not compare(a, b, 1e-5), compare(a, b, 1e-5)
    assert [[1, 1]] in [p["failed"] for p in json.loads(got.read_text())["plans"]]
    assert a.losses[-1] < a.losses[0]  # it trains
    assert abs(a.losses[0] - torch.log(torch.tensor(256.0)).item()) < 0.5  # vocab 256


@pytest.mark.parametrize("args,says", [
    (["--model", "llama:7b"], "unknown flavour '7b' of llama (flavours: llama:debug, "
                              "llama:125m, llama:1b, llama:8b)"),
    (["--model", "gpt:large"], "unknown flavour 'large' of gpt (flavours: none; use gpt)"),
    (["--model", "lama:7b"], "cannot import lama: ModuleNotFoundError"),
    (["--model", "lama"], "neither a built-in (gpt, llama, llama:debug"),
    (["--model", "llama:8b", "--d-model", "1024"],
     "--d-model 1024 contradicts --model llama:8b, whose d_model is 4096"),
    (["--model", "llama", "--vocab", "64"],
     "--vocab 64 contradicts --model llama (= llama:debug), whose vocab is 256"),
    (["--model", "llama:debug", "--heads", "0"], "--heads must be at least 1, not 0"),
])
@pytest.mark.parametrize("command", ["train", "profile"])
def test_bad_model_names_and_shapes_get_one_line(tmp_path, command, args, says):
    r = CliRunner().invoke(app, [command, *args, "-s", "2", "-o" if command == "profile"
                                 else "--summary", str(tmp_path / "out.json")])
    one_line_exit_2(r, says)
    assert not (tmp_path / "out.json").exists()


def test_a_flavour_accepts_its_own_values_and_a_shorter_context(tmp_path):
    """Repeating a flavour's value is no contradiction; --seq-len changes no parameter."""
    job = tmp_path / "job.json"
    r = CliRunner().invoke(app, ["profile", "--model", "llama:debug", "--d-model", "64",
                                 "--layers", "4", "--seq-len", "8", "--micro-batch-size", "1",
                                 "-s", "2", "--repeats", "1", "-o", str(job)])
    assert r.exit_code == 0, r.output


def test_a_model_this_machine_cannot_hold_is_refused_before_any_worker_starts(tmp_path):
    from executor.compute.measure.profile import machine_memory
    from executor.models.footprint import check_fits
    if machine_memory() > 200 * 2**30:
        pytest.skip("this machine could hold llama:8b's state 1.6 times over")
    for args, says in [(["train", "-d", "2", "-s", "2"], "4 worker processes need 239.3 GB"),
                       (["train", "--reference"], "one process (--reference) needs 119.7 GB")]:
        r = CliRunner().invoke(app, [*args, "--model", "llama:8b", "--device", "cpu",
                                     "--run-dir", str(tmp_path)])
        one_line_exit_2(r, says)
    assert not list(tmp_path.iterdir())  # no worker started, no log written
    cfg = ModelConfig(**LLAMA["125m"].shape())
    wl = workload()
    check_fits("llama:125m", wl, cfg, 2, replicas=1, device="cpu", mode="profile",
               budget=2**30)  # a stage of 62.3M parameters: 0.93 GB of state
    with pytest.raises(ValueError, match="its largest stage needs 0.9 GB"):
        check_fits("llama:125m", wl, cfg, 2, replicas=1, device="cpu", mode="profile",
                   budget=2**29)
