"""Checkpoint parts load by parameter name into a stage of any shape (issue 42): parts
written by one split of the model fill the stages of another, the optimizer's moments
included. In one process, real DCP files."""

import torch

from executor.checkpoint.stage_state import load_by_name, run_of, save_state, stage_state
from executor.checkpoint.store import complete_parts, shape_dir
from executor.compute.config import ModelConfig, TrainingSettings
from executor.compute.model import DEFAULT_WORKLOAD as WL

CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=4, micro_batch_size=2)


def _stepped_stages(S: int, cfg=CFG):
    """The model split into S stages, each stepped once on the same loss as the whole."""
    torch.manual_seed(0)
    stages = [WL.build_stage(cfg, s, S) for s in range(S)]
    opts = [WL.make_optimizer(TrainingSettings(), m.parameters()) for m in stages]
    x = WL.microbatch(cfg, 0, 0)
    h = x[0]
    for m in stages[:-1]:
        h = m(h)
    loss = WL.loss_fn(stages[-1](h), x[1])
    loss.backward()
    for o in opts:
        o.step()
    return stages, opts


def _everything(stages, opts) -> dict:
    out = {}
    for m, o in zip(stages, opts):
        names = dict((id(p), n) for n, p in m.named_parameters())
        for n, p in m.named_parameters():
            out[n] = p.detach().clone()
        for p, st in o.state.items():
            out[names[id(p)] + ".exp_avg_sq"] = st["exp_avg_sq"].clone()
            out[names[id(p)] + ".step"] = torch.as_tensor(st["step"]).clone()
    return out


def test_parts_of_two_stages_load_into_one_and_into_four(tmp_path):
    stages, opts = _stepped_stages(2)
    parts = []
    for s, (m, o) in enumerate(zip(stages, opts)):
        path = str(tmp_path / f"stage{s}")
        assert save_state(stage_state(m, o), path, run="r1")
        assert run_of(path) == "r1"
        parts.append(path)
    want = _everything(stages, opts)
    for S in (1, 4):
        new = [WL.build_stage(CFG, s, S) for s in range(S)]
        new_opts = [WL.make_optimizer(TrainingSettings(), m.parameters()) for m in new]
        for m, o in zip(new, new_opts):
            load_by_name(m, o, parts)
        got = _everything(new, new_opts)
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), (S, k)


def test_a_model_entry_no_part_holds_is_an_error(tmp_path):
    stages, opts = _stepped_stages(2)
    path = str(tmp_path / "stage0")
    save_state(stage_state(stages[0], opts[0]), path)
    whole = WL.build_stage(CFG, 0, 1)
    try:
        load_by_name(whole, WL.make_optimizer(TrainingSettings(), whole.parameters()), [path])
    except KeyError as exc:
        assert "no part of the checkpoint holds" in str(exc)
    else:
        raise AssertionError("a stage half missing from the parts loaded")


def test_a_cut_s_parts_complete_an_iteration_when_the_job_s_own_stages_do_not(tmp_path):
    d = tmp_path / "iter000003"
    (d / "stage0").mkdir(parents=True)
    (d / "stage0" / ".metadata").write_text("")  # the job's own 2 stages: one part only
    assert complete_parts(str(d), 2) is None
    cut = d / shape_dir(1, 0xABC)
    (cut / "stage0").mkdir(parents=True)
    (cut / "stage0" / ".metadata").write_text("")
    assert complete_parts(str(d), 2) == [f"{shape_dir(1, 0xABC)}/stage0"]
    (d / "stage1").mkdir()
    (d / "stage1" / ".metadata").write_text("")
    assert complete_parts(str(d), 2) == ["stage0", "stage1"]
