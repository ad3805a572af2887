"""Tied weights through a change of shape (issue 33): a GPT-2 from transformers ties its
embedding (stage 0) and its head (the last stage), each stage holding a copy
(executor/runtime/steps/tied.py). Three of four workers SIGKILLed for good leave one,
which trains the whole model as one stage, where the two are one tensor again: the cut
must carry both copies' state in, exact against the one-process reference."""
import io

import pytest
from rich.console import Console

from executor.compute.config import ModelConfig
from executor.compute.one_process.reference import compare, train_reference
from executor.inputs.launch_spec import Faults, LaunchSpec, sections
from executor.inputs.workload_name import load_workload
from executor.launch.launcher import train
from planner.job import JobSpec

pytestmark = pytest.mark.hard_timeout(150)
HF_GPT2 = "hf:gpt2?n_layer=2&n_embd=16&n_head=2&vocab_size=32&n_positions=16"
TOL = 1e-5


@pytest.mark.parametrize("back", [False, True], ids=["cut", "cut-and-back"])
def test_a_tied_gpt2_cut_to_one_stage_trains_on_exact(tmp_path, back):
    """`back`: 0:1 restarts after the cut, and the pipeline goes back to two stages: the
    one shared tensor is sent to the stages as both the embedding and the head."""
    pytest.importorskip("transformers")
    from executor.models.families import architecture
    cfg = ModelConfig(micro_batch_size=2, **architecture(
        HF_GPT2, d_model=None, n_layers=None, n_heads=None, seq_len=8, vocab=None))
    out = io.StringIO()
    spec = LaunchSpec(cfg, JobSpec.uniform(2, 2, 2), 8,
                      Faults(kills=[(0, 0, 1), (0, 1, 2), (1, 1, 3)],
                             rejoins=[(0, 1, 5)] if back else []), deadline_s=110,
                      run_dir=str(tmp_path), model=HF_GPT2,
                      **sections(timeout=4.0, snapshot_every=1))
    res = train(spec, console=Console(file=out, width=200))
    assert res.summary is not None, f"halted: {res.halted}\n{out.getvalue()}"
    assert "the pipeline changes shape to 1 stages" in out.getvalue(), out.getvalue()
    if back:
        assert "the pipeline changes shape to 2 stages" in out.getvalue(), out.getvalue()
    ref = train_reference(cfg, 2, 2, 8, 2, workload=load_workload(HF_GPT2))
    diffs = compare(res.summary, ref, TOL)
    assert not diffs, "\n".join(diffs) + "\n" + out.getvalue()
