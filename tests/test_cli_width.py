"""Output through a pipe is not cut at 80 columns: help keeps its option names whole, tables
their digits (the real console command in a subprocess, stdout a pipe, no terminal)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _piped(*args, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    r = subprocess.run([sys.executable, "-m", "recycle.cli", *args], capture_output=True,
                       text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL,
                       env={**base, "PYTHONPATH": ROOT, **env})
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.hard_timeout(90)
def test_help_and_tables_through_a_pipe_are_not_truncated():
    out = _piped("train", "--help")
    assert "…" not in out, out
    for name in ("--detect-stragglers", "--no-detect-stragglers", "--checkpoint-dir",
                 "executor.compute.model.Workload"):
        assert name in out, (name, out)
    out = _piped("plan", "examples/job.json", "--fail", "1:2")
    assert "…" not in out and "1:3" in out, out


@pytest.mark.hard_timeout(60)
def test_columns_given_is_honoured():
    out = _piped("train", "--help", COLUMNS="100")
    assert max(len(ln) for ln in out.splitlines()) <= 100


def _helps():
    """(command path, option, help text) of every option of every `recycle` command."""
    import typer.main

    from recycle.cli import app

    def walk(cmd, path):
        for p in cmd.params:
            if getattr(p, "help", None):
                yield path, p.opts[0], p.help
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, f"{path} {name}")
    return list(walk(typer.main.get_command(app), "recycle"))


def test_no_help_text_is_eaten_by_the_consoles_markup():
    """`--snapshot-every`'s help showed `%%` (typer does no %-formatting) and `--config`'s
    lost its section names ("with sections  ,"): rich took `[grid]` for a style tag."""
    import re
    helps = _helps()
    assert len(helps) > 100
    bad = [f"{c} {o}: {h[:60]}" for c, o, h in helps
           if "%%" in h or re.search(r"(?<!\\)\[[a-z]", h)]
    assert not bad, "\n".join(bad)


@pytest.mark.hard_timeout(60)
def test_the_config_sections_show_in_train_help():
    out = _piped("train", "--help", COLUMNS="400")
    assert "with sections [grid] [model] [optimizer]" in out and "%%" not in out, out
    assert "data-parallel replicas D [default: 2, or the --job's]" in out, out
