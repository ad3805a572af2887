"""The coordinator's progress lines: rate-limited, never losing the lines that matter."""
import io

from rich.console import Console

from executor.launch.report.progress_lines import ProgressLines


def _lines(console: Console) -> list[str]:
    return [ln for ln in console.file.getvalue().splitlines() if ln.startswith("iter")]


def test_at_most_one_line_per_interval_but_first_last_and_new_plan_always():
    console = Console(file=io.StringIO(), width=200)
    lines = ProgressLines(console, tokens_per_iteration=1000, start=0, last=9, every_s=0.25)
    lines._since = 0.0
    for it in range(10):  # 10 iterations 10 ms apart: one line, then a new plan, then the end
        version, failed = (1, [(1, 0)]) if it >= 6 else (0, [])
        lines.completed(it, 2.0 - 0.1 * it, version, failed, now=0.01 * (it + 1))
    out = _lines(console)
    assert [ln.split()[1] for ln in out] == ["0", "6", "9"], out
    assert "plan v1" in out[1] and "failed [(1, 0)]" in out[1]
    # tok/s over the iterations since the line before: 6 iterations of 1000 tokens in 60 ms
    assert "100,000 tok/s" in out[1], out[1]


def test_slow_iterations_get_a_line_each():
    console = Console(file=io.StringIO(), width=200)
    lines = ProgressLines(console, tokens_per_iteration=10, start=5, last=8, every_s=0.25)
    for it in range(5, 9):
        lines.completed(it, 1.0, 0, [], now=float(it))
    assert [ln.split()[1] for ln in _lines(console)] == ["5", "6", "7", "8"]


def test_an_iteration_line_names_the_plan_it_trained_under_not_the_newest(tmp_path):
    """Iteration 0's losses (under v0) and worker 1:0's death come in the same tick: the
    death publishes v1 before the line is printed, which named v1 and its failed set."""
    from executor.compute.model import ModelConfig
    from executor.launch.launcher import Coordinator
    from executor.protocol import Done
    from executor.inputs.launch_spec import LaunchSpec
    from planner.job import JobSpec
    console = Console(file=io.StringIO(), width=200)
    c = Coordinator(LaunchSpec(ModelConfig(), JobSpec.uniform(2, 2, 2), 3, run_dir=str(tmp_path),
                               detect_stragglers=False), console=console)
    try:
        c.publish()
        assert c.version == 0
        for r in range(2):  # the last stage of each replica reports its micro-batches' losses
            c.handle(Done(r=r, s=1, v=0, inc=1, it=0,
                          losses={str(2 * r + g): 1.0 for g in range(2)}))
        c.died((1, 0), "test")
        assert c.version == 1
        c.report_progress()
        out = _lines(console)
        assert len(out) == 1 and "plan v0" in out[0] and "failed -" in out[0], out
    finally:
        c.mailbox.close()
