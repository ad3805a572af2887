"""The runtime's Python work per plan action, counted in bytecodes (not timed: a count does
not move with a shared machine's load): worker 0:1 of a 2x2 run in one process, waits
left out (benchmarks/instruction_counts.py says what is counted). The test fails when the
count grows more than 10% over the figure committed in
benchmarks/results/instruction_counts.md: a change that adds work to every action is made
in the open (re-run the benchmark and commit its table, saying why)."""
import pytest

from benchmarks.instruction_counts import OUT, committed, python_ops

GROWTH = 1.10


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One measurement for both tests (a run of the harness costs about 6 s)."""
    return python_ops(tmp_path_factory.mktemp("counted"))


def test_python_work_per_action_does_not_grow_past_the_committed_count(measured):
    got, base = measured, committed()
    ratio = got["per_action"] / base["opcodes_per_action"]
    grew = {k: (v, base["parts"].get(k)) for k, v in got["parts"].items()
            if v > GROWTH * base["parts"].get(k, 0) + 20}
    assert ratio <= GROWTH, (
        f"{got['per_action']} opcodes per action, {ratio:.3f}x the {base['opcodes_per_action']} "
        f"committed in {OUT.name}; parts (now, committed): {grew}; files: {got['files']}")
    # a count far below the committed one would let a later growth hide under it
    assert ratio >= 0.8, (f"{got['per_action']} opcodes per action, {ratio:.2f}x the committed "
                          f"count: re-run benchmarks/instruction_counts.py and commit its table")


def test_waits_are_not_counted_and_the_count_is_repeatable(measured, tmp_path):
    """How many times a poll spins is timing: two runs count the same work (a seed cached
    by the loader thread first may move it about 2%, never 10)."""
    a, b = measured, python_ops(tmp_path)
    assert abs(a["per_action"] / b["per_action"] - 1) < 0.05, (a, b)
    assert not any("waiting.py" in f for f in a["files"])
