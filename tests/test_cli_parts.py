"""recycle/cli.py: a build without a part (a service-only image has no executor/) still
has every other command, and leaves out only the commands of the part it lacks."""
import pytest
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An editable install's finder would find the part elsewhere: this build is PYTHONPATH's.
PROBE = ("import json, sys; sys.meta_path[:] = [f for f in sys.meta_path "
         "if '__editable__' not in getattr(f, '__module__', '')]; "
         "import typer; from recycle.cli import app; "
         "print(json.dumps(sorted(typer.main.get_command(app).commands)))")


def commands(tmp_path, *parts: str) -> set:
    """The commands of a build holding only `parts` (links into this tree)."""
    build = tmp_path / "-".join(parts)
    build.mkdir()
    for part in parts:
        (build / part).symlink_to(os.path.join(ROOT, part))
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=build, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(build)})
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout))


@pytest.mark.procs
def test_a_missing_part_takes_only_its_own_commands_along(tmp_path):
    full = commands(tmp_path, "planner", "executor", "api", "recycle")
    assert {"plan", "train", "profile", "serve", "agent", "data", "compare"} <= full
    assert full - commands(tmp_path, "planner", "api", "recycle") == {
        "train", "profile", "agent", "data", "compare"}
    assert full - commands(tmp_path, "planner", "executor", "recycle") == {"serve"}
