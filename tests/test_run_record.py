"""What a run's summary derives from its record: recovery times and the failed set each
iteration trained under (executor/launch/report/run_record.py). Pure data, no processes."""
from executor.launch.report.run_record import RunRecord, failed_by_iteration
from planner.job import JobSpec
from planner.solvers.backends import solve

JOB = JobSpec.uniform(2, 2, 2)


def test_kill_recovery_ignores_a_member_that_died_meanwhile():
    """torchrun: the coordinator kills 1:1, node 1's agent then stops 1:0. The plan after
    the kill still names 1:0, whose process never enters it: the recovery is the time the
    survivors took (0.2 s), not the time until 1:0's replacement came (it was 13 s)."""
    rec = RunRecord()
    rec.plans[0] = solve(JOB, []).stamped(0, [[1, 1], [1, 1]])
    rec.plans[1] = solve(JOB, [(1, 1)]).stamped(1, [[1, 1], [1, 1]])
    rec.plans[2] = solve(JOB, []).stamped(2, [[1, 1], [2, 2]])
    rec.published_at = [(0.0, 0), (10.05, 1), (23.0, 2)]
    rec.kills_at = [(10.0, (1, 1), 1)]
    rec.entries = [(0.1, w, 1, 0, 0) for w in [(0, 0), (0, 1), (1, 0), (1, 1)]]
    rec.entries += [(10.1, (0, 0), 1, 1, 1), (10.2, (0, 1), 1, 1, 1)]  # 1:0 died: never in
    rec.entries += [(23.1, w, 1, 2, 3) for w in [(0, 0), (0, 1)]]
    rec.entries += [(23.2, w, 2, 2, 3) for w in [(1, 0), (1, 1)]]  # the new incarnations
    kill = [r for r in rec.recovery([]) if r["kind"] == "kill"]
    assert [r["seconds"] for r in kill] == [0.2], kill


def test_failed_by_iteration_follows_the_newest_version_entered():
    """A re-plan for speeds splits the failed set's span into two versions; a version
    nobody entered before the next one is not there at all."""
    plans = [{"version": 0, "failed": [], "first_iteration": 0},
             {"version": 1, "failed": [[0, 1]], "first_iteration": 2},
             {"version": 3, "failed": [[0, 1]], "first_iteration": 3},  # speeds changed
             {"version": 4, "failed": [], "first_iteration": 5}]
    assert failed_by_iteration(plans, 6) == [[], [], [[0, 1]], [[0, 1]], [[0, 1]], []]


def test_an_iteration_under_a_shape_names_the_dead_workers_not_the_shapes_empty_slots():
    """A shape's `failed` is its own grid's empty slots (a 2x2 job cut to one stage of 4
    replicas, one filled: [(1, 0), (2, 0), (3, 0)]); the progress line names the workers
    of the user's grid that are dead."""
    from planner.shapes.planning import plan_shape
    plan, _ = plan_shape(JOB, [(0, 0), (0, 1), (1, 1)], 1e9)
    assert plan.partition is not None and plan.job.stages == 1
    rec = RunRecord()
    rec.plans[3] = plan.stamped(3, [[2, 1], [1, 2]])
    rec.trained[5] = 3
    assert rec.trained_under(5, 3, []) == (3, [(0, 0), (0, 1), (1, 1)])
    rec.plans[0] = solve(JOB, [(1, 1)]).stamped(0, [[1, 1], [1, 1]])
    rec.trained[1] = 0
    assert rec.trained_under(1, 0, []) == (0, [(1, 1)])


def test_the_record_is_written_through_its_own_methods_only():
    """The parts that learn a fact say it (`record.killed(...)`, `record.paused()`); no
    product module outside run_record.py assigns, appends to or updates a RunRecord's
    field (it was written from 4 files, each with its own tuple layout)."""
    import ast
    import dataclasses
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = {f.name for f in dataclasses.fields(RunRecord)}
    mutators = {"append", "extend", "update", "pop", "clear", "setdefault", "insert"}
    offenders = []
    for part in ("executor", "api", "recycle"):
        for dp, _, fs in os.walk(os.path.join(root, part)):
            for f in fs:
                path = os.path.join(dp, f)
                if not f.endswith(".py") or path.endswith("run_record.py"):
                    continue
                tree = ast.parse(open(path, encoding="utf-8").read())

                def is_field(n):  # <anything>.record.<field>
                    return (isinstance(n, ast.Attribute) and n.attr in names
                            and isinstance(n.value, ast.Attribute) and n.value.attr == "record")
                for node in ast.walk(tree):
                    targets = []
                    if isinstance(node, (ast.Assign, ast.AugAssign)):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        targets = [t.value if isinstance(t, ast.Subscript) else t
                                   for t in targets]
                    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                          and node.func.attr in mutators):
                        targets = [node.func.value]
                    offenders += [f"{os.path.relpath(path, root)}:{node.lineno}"
                                  for t in targets if is_field(t)]
    assert not offenders, offenders
