"""The README's main command, part 2: the live cluster on real text through a SIGKILL and a
rejoin matches the failure-free reference, and the loss-curve PNG is written."""
import pytest
from rich.console import Console

from recycle.live_demo import live_demo


@pytest.mark.hard_timeout(180)
def test_live_demo_matches_and_plots(tmp_path):
    console = Console(record=True, width=200)
    assert live_demo(str(tmp_path), console)
    out = console.export_text()
    assert "byte tokens from" in out and "match" in out, out
    png = tmp_path / "demo-loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
