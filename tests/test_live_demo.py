"""The README's main command, part 2: the live cluster on real text through a SIGKILL and a
rejoin trains re-routed in between (every time: the death is a failure event and the
worker is kept out until the rejoin iteration), matches the failure-free reference, and
writes the loss-curve PNG."""
import pytest
from rich.console import Console

from executor.launch.report.run_record import failed_by_iteration
from recycle.live_demo import ITERATIONS, KILL, M, REJOIN, live_demo


@pytest.mark.hard_timeout(180)
def test_live_demo_reroutes_matches_and_plots(tmp_path):
    console = Console(record=True, width=200)
    result = live_demo(str(tmp_path), console)
    out = console.export_text()
    assert result, out
    assert "byte tokens from" in out and "match" in out, out
    # every iteration from the kill to the rejoin trained without 1:0, its micro-batches on 0:0
    row = result.rerouted
    assert row is not None, out
    assert row["failed"] == [[KILL[0], KILL[1]]], row
    assert row["iterations"] == (KILL[2], REJOIN[2] - 1), row
    assert row["microbatches"]["0:0"] == 2 * M and "1:0" not in row["microbatches"], row
    failed = failed_by_iteration(result.plans, ITERATIONS)  # a speed re-plan may add versions
    assert failed == [[] if not KILL[2] <= i < REJOIN[2] else [[1, 0]]
                      for i in range(ITERATIONS)], result.plans
    assert f"Iterations {KILL[2]}-{REJOIN[2] - 1} trained re-routed" in out, out
    assert "service event: failure of worker 1:0" in out, out
    assert f"0:0 {2 * M} ({M} re-routed)" in out, out
    # a worker's reason in words, not gloo's C++ source (it showed "pair.cc:534]")
    assert ".cc:" not in out and "third_party" not in out, out
    png = tmp_path / "demo-loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
