"""Every benchmark script still imports: a module the product moved must not leave a
results table that no longer re-runs (benchmarks/simulate_real.py imported the trace
window from a path the runtime's redesign had moved, and only failed when run)."""
import importlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_script_imports(name, monkeypatch):
    # run as `python benchmarks/X.py`, a script also finds its siblings (rawhttp)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setattr(sys, "argv", [f"benchmarks/{name}.py"])
    importlib.import_module(f"benchmarks.{name}")
    assert os.path.exists(ROOT / "benchmarks" / f"{name}.py")


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_reads_its_arguments_only_when_run(name):
    """Importing a script must not run it: cpsat_wall_limit.py parsed its arguments and ran
    two CP-SAT solves at import, 13 s of the fast tier in the test above."""
    text = (ROOT / "benchmarks" / f"{name}.py").read_text()
    if "parse_args(" in text:
        assert 'if __name__ == "__main__"' in text, f"benchmarks/{name}.py runs on import"
