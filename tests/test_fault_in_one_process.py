"""A worker's fault path in one process, as torchft's manager_integ_test does it: the real
Coordinator (its workers external, so it watches heartbeats) and one real WorkerLoop per
worker, each in a thread with its own store connections and gloo groups; one worker
"dies" between iterations (its thread ends, its groups close, its heartbeats stop). The
survivors see the comm error, report it, the coordinator declares the silent worker
failed and re-plans, and training ends equal to the one-process reference. No process is
started: this runs in the fast tier."""
import io
import threading
import time

import pytest

from rich.console import Console

from executor.compute.model import ModelConfig
from executor.compute.one_process.reference import compare, train_reference
from executor.inputs.launch_spec import LaunchSpec, sections
from executor.launch.launcher import Coordinator
from executor.protocol import incarnation_key
from executor.runtime.worker_loop import WorkerLoop
from executor.runtime.transport.endpoints import connect_store
from executor.runtime.transport.rendezvous import StorePlanSource
from executor.runtime.worker_config import WorkerConfig
from executor.timeouts import Timeouts
from planner.job import JobSpec

CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, micro_batch_size=2)
D, S, M, ITERATIONS, TIMEOUT = 2, 2, 2, 6, 2.0


class Killed(BaseException):
    """The injected death: no handler of the WorkerLoop catches it, as none sees a SIGKILL."""


class DyingSource(StorePlanSource):
    """The plan source of the worker that dies: before iteration `at` its thread ends
    (WorkerLoop.run's `finally` closes its gloo groups, as an exit closes a process's sockets),
    and from then on it heartbeats no more."""

    def __init__(self, *args, at: int):
        super().__init__(*args)
        self.at, self.dead = at, False

    def gate(self, version, iteration):
        if iteration >= self.at:
            self.dead = True
            raise Killed()
        return super().gate(version, iteration)

    def heartbeat(self, *args, **kw):
        if not self.dead:
            super().heartbeat(*args, **kw)


def _worker(port: int, me, spec: LaunchSpec, die_at, out: dict, **conf_fields) -> None:
    store = connect_store("127.0.0.1", port, timeout_s=TIMEOUT)
    inc = int(store.add(incarnation_key(me), 1))
    conn = connect_store("127.0.0.1", port, timeout_s=TIMEOUT)
    source = (DyingSource(conn, me, inc, at=die_at) if die_at is not None
              else StorePlanSource(conn, me, inc))
    conf = WorkerConfig(spec.cfg, spec.job, spec.iterations, training=spec.training,
                        timeouts=Timeouts(TIMEOUT), checkpoint=spec.checkpoint, **conf_fields)
    try:
        out[me] = WorkerLoop(conf, me, source, store, inc).run()
    except Killed:
        out[me] = "killed"


def _run(tmp_path, D_, S_, iterations, dies, snapshot_every=0, log_memory="off"):
    """The coordinator (external workers) and one WorkerLoop thread per worker; `dies(w)`: the
    iteration before which worker w's thread ends, or None. (result, exits, console text)"""
    spec = LaunchSpec(CFG, JobSpec.uniform(D_, S_, M), iterations, deadline_s=60,
                      run_dir=str(tmp_path), detect_stragglers=False,
                      **sections(external=True, timeout=TIMEOUT, snapshot_every=snapshot_every,
                                 log_memory=log_memory))
    text = io.StringIO()
    before = set(threading.enumerate())
    coord = Coordinator(spec, console=Console(file=text, width=200))
    exits: dict = {}
    threads = [threading.Thread(target=_worker, daemon=True, name=f"agent-{r}:{s}",
                                args=(coord.store.port, (r, s), spec, dies((r, s)), exits),
                                kwargs={"local_workers": D_ * S_})
               for r in range(D_) for s in range(S_)]
    for t in threads:
        t.start()
    res = coord.run()
    for t in threads:
        t.join(30)
    # Everything a WorkerLoop starts ends with its run(): a heartbeat or snapshot thread
    # left behind holds store connections into the interpreter's shutdown, which then
    # aborted now and then ("terminate called without an active exception").
    deadline = time.monotonic() + 10
    while (left := [t.name for t in set(threading.enumerate()) - before if t.is_alive()]) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"threads outlived their WorkerLoop: {sorted(left)}"
    assert res.summary is not None, f"halted: {res.halted}\n{text.getvalue()}"
    return res, exits, text.getvalue()


def test_a_worker_dies_between_iterations_and_the_survivors_train_on_exact(tmp_path):
    res, exits, text = _run(tmp_path, D, S, ITERATIONS, lambda w: 3 if w == (1, 1) else None)
    assert exits == {(0, 0): 0, (0, 1): 0, (1, 0): 0, (1, 1): "killed"}, exits
    assert any("worker 1:1 failed (heartbeat stopped" in e for e in res.events), res.events
    assert [tuple(w) for w in res.summary.plans[-1]["failed"]] == [(1, 1)]
    diffs = compare(res.summary, train_reference(CFG, D, M, ITERATIONS, S), 1e-5)
    assert not diffs, "\n".join(diffs) + "\n" + text


@pytest.mark.parametrize("D3,S3,lost,replayers", [(2, 3, 1, 1), (4, 2, 0, 2)],
                         ids=["2x3-middle-stage", "4x2-first-stage-two-replayers"])
def test_a_stage_lost_whole_is_replayed_in_one_process(tmp_path, D3, S3, lost, replayers):
    """Every worker of stage `lost` dies before iteration 5, at once (as a machine holding
    the stage would): survivors move in, load the stage's snapshot of iteration 3 from its
    holder and replay iteration 4 from their neighbours' boundary logs, the micro-batches
    split between them; the other stages keep their work (nothing re-trained). (With real
    processes the kills of a stage land one by one, and with four replicas the plan may
    move a worker in before the last one dies: then no stage is lost whole.)"""
    iters = 7
    res, _, text = _run(tmp_path, D3, S3, iters, lambda w: 5 if w[1] == lost else None,
                        snapshot_every=2, log_memory="96M")
    el = res.summary.elastic
    assert (el["replays"], el["replayed_iterations"], el["retrained_iterations"]) == (1, 1, 0), el
    assert any(f"stage {lost} replayed iterations 4..4 from the boundary logs on {replayers} "
               f"worker(s)" in e for e in res.events), res.events
    diffs = compare(res.summary, train_reference(CFG, D3, M, iters, S3), 1e-5)
    assert not diffs, "\n".join(diffs) + "\n" + text
