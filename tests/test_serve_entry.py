"""`python -m api serve` (argparse, no CLI package) and `recycle serve` (typer) are one
command: the same flags, defaults and checks, both from api.server.ServeOptions."""
import pytest
import os
import subprocess
import sys
from dataclasses import fields

import typer

from api.__main__ import parser
from api.server import ServeOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_both_entry_points_take_the_same_flags_and_defaults():
    from recycle.commands.serve import serve
    app = typer.Typer(add_completion=False)
    app.command()(serve)
    params = {p.name: p for p in typer.main.get_command(app).params}
    serve_ap = parser()._subparsers._group_actions[0].choices["serve"]
    argp = {a.dest: a for a in serve_ap._actions if a.dest != "help"}
    assert set(params) == set(argp) == {f.name for f in fields(ServeOptions)}
    for f in fields(ServeOptions):
        assert params[f.name].default == f.default, f.name
        # a switch both ways: typer's --x/--no-x, argparse's BooleanOptionalAction
        flags = params[f.name].opts + params[f.name].secondary_opts
        assert flags == argp[f.name].option_strings, f.name
        if f.name != "admin_token":  # argparse reads RECYCLE_ADMIN_TOKEN into its default
            assert argp[f.name].default == f.default, f.name


@pytest.mark.procs
def test_python_m_api_loads_no_cli_library_and_refuses_bad_input_in_one_line(tmp_path):
    code = ("import sys, api.__main__ as m; m.parser().parse_args(['serve']); "
            "print(sorted(k for k in sys.modules if k.split('.')[0] in "
            "('typer', 'click', 'recycle')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
    r = subprocess.run([sys.executable, "-m", "api", "serve", "--db", str(tmp_path / "s.db"),
                        "--solvers", "greedy,nope"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "unknown back-end 'nope'" in r.stderr and not (tmp_path / "s.db").exists()
