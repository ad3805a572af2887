"""Workers change the pipeline's shape at run time (issue 33, the runtime's half): real
Agents in threads of one process (their own store connections and gloo groups), plans
published by the test as a coordinator would, with a partition that cuts the model into
fewer stages. The workers build their new stages, move the state by parameter name from
the old stages' holders (or their peer-memory snapshots, when a stage was lost whole) and
train on; the final parameters equal the one-process reference's, name by name."""
import threading
import time

import torch

from executor.compute.model import ModelConfig
from executor.compute.one_process.reference import snapshot, train_reference
from executor.protocol import Done, incarnation_key
from executor.runtime.worker_loop import WorkerLoop
from executor.runtime.transport.endpoints import connect_store
from executor.runtime.transport.rendezvous import Mailbox, StorePlanSource, publish_plan
from executor.inputs.launch_spec import sections
from executor.runtime.worker_config import WorkerConfig
from executor.timeouts import Timeouts
from planner.job import JobSpec
from planner.plan import Plan, home_id
from planner.shapes.planning import plan_shape
from planner.solvers.backends import solve

CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=4, micro_batch_size=2)
D, S, M, TIMEOUT = 2, 4, 4, 5.0


def _agent(port, me, job, iterations, agents, snapshot_every):
    store = connect_store("127.0.0.1", port, timeout_s=TIMEOUT)
    inc = int(store.add(incarnation_key(me), 1))
    conn = connect_store("127.0.0.1", port, timeout_s=TIMEOUT)
    conf = WorkerConfig(CFG, job, iterations, timeouts=Timeouts(TIMEOUT),
                        checkpoint=sections(snapshot_every=snapshot_every,
                                            log_memory="off")["checkpoint"],
                        local_workers=D * S)
    agents[me] = a = WorkerLoop(conf, me, StorePlanSource(conn, me, inc), store, inc)
    a.exit = a.run()


def _drive(iterations: int, plans: list[tuple[int, Plan]], snapshot_every: int = 0):
    """Publish plans[0] (from iteration 0), each next one once every worker of the one in
    force reported the iteration before its first, then the final empty plan. -> agents"""
    job = JobSpec.uniform(D, S, M)
    store = connect_store("127.0.0.1", 0, timeout_s=TIMEOUT, is_master=True)
    mailbox = Mailbox(store)
    agents: dict = {}
    threads = [threading.Thread(target=_agent, daemon=True, name=f"agent-{r}:{s}",
                                args=(store.port, (r, s), job, iterations, agents,
                                      snapshot_every))
               for r in range(D) for s in range(S)]
    grid = [[1] * S for _ in range(D)]
    try:
        for t in threads:
            t.start()
        done: dict = {}
        steps = [*plans, (iterations, None)]
        for v, (first, plan) in enumerate(steps):
            if v > 0:  # wait until every worker of the plan in force reached `first - 1`
                live = [home_id(*w) for w in current.live_workers()] if current.roles is None \
                    else [r.worker for r in current.roles]
                deadline = time.monotonic() + 60
                while not all(done.get(w, -1) >= first - 1 for w in live):
                    assert time.monotonic() < deadline, (done, live)
                    for m in mailbox.drain():
                        if isinstance(m, Done) and not m.sync:
                            done[home_id(m.r, m.s)] = max(done.get(home_id(m.r, m.s), -1), m.it)
                    mailbox.wait(0.05)
            if plan is None:
                publish_plan(store, current.model_copy(update={"version": v, "workers": []}))
            else:
                current = plan.stamped(v, grid)
                publish_plan(store, current)
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    finally:
        mailbox.close()
    return agents


def _final(agents) -> dict:
    out = {}
    for a in agents.values():
        if a.state.done >= 0 and not a.state.fresh and a.h.stage is not None:
            out.update(snapshot(a.h.stage.module))
    return out


def _reference(iterations) -> dict:
    got = {}

    def after(it, modules, _opts):
        if it == iterations - 1:
            for m in modules:
                got.update(snapshot(m))
    train_reference(CFG, D, M, iterations, S, after_step=after)
    return got


def _assert_equal(got: dict, want: dict):
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    worst = max(float((got[n] - want[n]).abs().max()) for n in want)
    assert worst <= 1e-5, worst


def test_five_of_eight_lost_the_three_left_train_on_three_stages_exact():
    """The issue's run, its plans as the coordinator would publish them: 2x4, and before
    iteration 5 five workers gone for good, stage 3 with both its workers. The three left
    train on in the shape the planner chose for them, stage 3's state from its snapshot."""
    job = JobSpec.uniform(D, S, M)
    failed = [(0, 0), (0, 1), (1, 2), (0, 3), (1, 3)]
    shaped, choice = plan_shape(job, failed, horizon=100.0)
    assert shaped.partition is not None and shaped.job.stages < S
    iterations = 9
    agents = _drive(iterations, [(0, solve(job, [])), (5, shaped)], snapshot_every=2)
    left = [a for w, a in agents.items() if list(w) not in [list(f) for f in failed]]
    assert all(a.exit == 0 for a in agents.values())
    assert all(a.h.conf.stages == shaped.job.stages for a in left)
    _assert_equal(_final({w: a for w, a in agents.items() if a in left}), _reference(iterations))


def test_all_eight_move_to_two_stages_by_name_from_live_holders():
    """No loss: a plan that cuts the same model into 2 stages (4 replicas): every stage's
    state comes from a live worker of the old shape, nothing is re-trained."""
    job = JobSpec.uniform(D, S, M)
    shaped, choice = plan_shape(job, [], horizon=100.0)
    if shaped.partition is None:  # the planner keeps the job's shape: cut it ourselves
        shaped = _two_stages(job)
    iterations = 7
    agents = _drive(iterations, [(0, solve(job, [])), (3, shaped)])
    assert all(a.exit == 0 for a in agents.values())
    assert {a.h.conf.stages for a in agents.values()} == {shaped.job.stages}
    _assert_equal(_final(agents), _reference(iterations))


def _two_stages(job: JobSpec) -> Plan:
    from planner.shapes.choose import ShapeChooser
    from planner.shapes.units import units_of_job
    from planner.control.roles import live_from_failed
    ch = ShapeChooser(job, units_of_job(job))
    two = next(s for s in ch.candidates(D * S) if s.stages == 2)
    c = ch.choose(two, live_from_failed(job, [], ()), 1e9)
    plan = solve(c.shape.job, c.failed).with_roles(c.roles, c.moves)
    return plan.model_copy(update={"partition": c.shape.partition(job, ch.units)})


def test_a_stage_lost_before_any_snapshot_restarts_the_new_shape_from_the_seed():
    """No snapshot yet (here: none at all): stage 3's only copy is the run's start, which
    every worker rebuilds from the seed; the three left start the new shape there and
    re-train, exact. (It halted: no iteration had a copy of every stage.)"""
    job = JobSpec.uniform(D, S, M)
    failed = [(0, 0), (0, 1), (1, 2), (0, 3), (1, 3)]
    shaped, _ = plan_shape(job, failed, horizon=100.0)
    iterations = 6
    agents = _drive(iterations, [(0, solve(job, [])), (3, shaped)])
    left = {w: a for w, a in agents.items() if list(w) not in [list(f) for f in failed]}
    assert all(a.exit == 0 for a in agents.values())
    assert all(a.state.restored_at == -1 for a in left.values())
    _assert_equal(_final(left), _reference(iterations))


def test_final_checksums_count_one_version_only(tmp_path):
    """A stage of a 3-stage shape finished the last iteration before a death sent the job
    back to a 2-stage shape: its report must not be summed with the 2-stage ones (chaos
    seed 90 run 19: base stage 2 counted twice, 34.2 against 17.1)."""
    from executor.inputs.launch_spec import LaunchSpec
    from executor.launch.coordinator.ending import RunEnd
    spec = LaunchSpec(CFG, JobSpec.uniform(2, 3, M), 5, run_dir=str(tmp_path))
    end = RunEnd(spec, str(tmp_path), console=None)
    end.final(2, 5, 17.0, [0.0, 0.0, 17.0])  # under v5 (3 stages)
    end.final(0, 6, 50.0, [32.0, 18.0, 0.0])  # under v6 (2 stages)
    end.final(1, 6, 17.1, [0.0, 0.0, 17.1])
    end.final(2, 5, 17.0, [0.0, 0.0, 17.0])  # a late report of the older version
    assert end._checksums() == [32.0, 18.0, 17.1]


def test_final_checksums_of_a_stage_that_never_changed_shape_count_as_its_own(tmp_path):
    """Back on the job's own cut after a change, a restarted worker that never changed
    shape reports no parts: its checksum is its own stage's (chaos seed 91 run 35: base
    stage 1 summed to 0)."""
    from executor.inputs.launch_spec import LaunchSpec
    from executor.launch.coordinator.ending import RunEnd
    end = RunEnd(LaunchSpec(CFG, JobSpec.uniform(2, 2, M), 5, run_dir=str(tmp_path)),
                 str(tmp_path), console=None)
    end.final(0, 7, 30.0, [30.0, 0.0])
    end.final(1, 7, 40.0, None)
    assert end._checksums() == [30.0, 40.0]
