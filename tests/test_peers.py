"""benchmarks/peers: torchft (its lighthouse, Manager and fault-tolerant gloo) and ReCycle
on the same model, data and SIGKILL, really run; what each keeps and drops."""
import os

import pytest

pytest.importorskip("torchft")

from benchmarks.peers.runs import Setup, figures, recycle_run, torchft_run  # noqa: E402
from executor.compute.config import ModelConfig, TrainingSettings, split_flat  # noqa: E402
from executor.compute.one_process.reference import train_reference  # noqa: E402
from executor.data.prepare import prepare, stdlib_dir  # noqa: E402
from executor.data.token_file import with_data  # noqa: E402
from executor.compute.model import DEFAULT_WORKLOAD  # noqa: E402

MODEL = dict(d_model=32, n_layers=2, n_heads=2, seq_len=16, micro_batch_size=2, vocab=256,
             lr=1e-2)
D, M, N, KILL = 2, 2, 6, 2


@pytest.mark.slow  # a benchmark peer (torchft), not the product: `pytest -m slow`
@pytest.mark.hard_timeout(300)
def test_torchft_drops_the_failed_share_recycle_keeps_it_exact(tmp_path):
    data = prepare([os.path.join(stdlib_dir(), "json")], str(tmp_path / "t.bin")).token_file.path
    clean = Setup(D, M, N, MODEL, data, -1, 5.0)
    kill = Setup(D, M, N, MODEL, data, KILL, 5.0)
    shape, settings = split_flat(MODEL)
    cfg = ModelConfig(**shape)
    training = TrainingSettings(**settings, total_iters=N, data=data)
    ref = train_reference(cfg, D, M, N, 1, training=training,
                          workload=with_data(DEFAULT_WORKLOAD, training.data))
    runs = {}
    for name, fn, st in (("ft", torchft_run, clean), ("ft_kill", torchft_run, kill),
                         ("rc_kill", recycle_run, kill)):
        wd = tmp_path / name
        wd.mkdir()
        runs[name] = fn(st, str(wd))
        assert not runs[name].error, (name, runs[name].error)
        assert sorted(runs[name].losses) == list(range(N)), (name, runs[name].losses)

    # without a failure torchft trains what ReCycle's reference trains
    assert all(abs(runs["ft"].losses[i] - ref.losses[i]) < 1e-5 for i in range(N))
    # ReCycle under the kill: every sample, the same losses and parameters
    rc = figures(runs["rc_kill"], kill, runs["ft"])
    assert rc["dropped"] == 0 and rc["losses_equal"] and rc["checksum_rel"] < 1e-5, rc
    assert 0 < rc["kill_to_step_s"] < 30, rc
    # torchft under the kill: the same until it, then replica 1's share is gone from every
    # step (the step in flight is re-run by the survivor, not committed twice)
    ft = figures(runs["ft_kill"], kill, runs["ft"])
    share = M * MODEL["micro_batch_size"]
    assert ft["dropped"] == share * (N - KILL), ft
    assert [runs["ft_kill"].samples[i] for i in range(N)] == [2 * share] * KILL + [share] * (N - KILL)
    assert all(abs(runs["ft_kill"].losses[i] - ref.losses[i]) < 1e-5 for i in range(KILL))
    assert not ft["losses_equal"] and ft["max_loss_diff"] > 1e-3, ft
    assert 0 < ft["kill_to_step_s"] < 30, ft
