"""docker/compose.yaml against the real CLI, without a container engine.

Every command a container runs (compose `command`, the images' ENTRYPOINT) is parsed by
the real `recycle` click/typer command it names (unknown flags, missing values and bad
types fail as they would in the container), `python -c` scripts are compiled, and the
wiring the job needs is checked: every worker gets the worker token from the file the
register step writes into a volume it mounts, finds the coordinator's store, has a rank of
its own, and mounts the checkpoint volume where the coordinator keeps checkpoints.

Why not run it: a container engine does run here (Debian's podman 4.3 with runc; crun
refuses the host's hybrid cgroups, and --ulimit nofile/nproc must stay below the host's
hard limits), but the images cannot be built: they start FROM python:3.11-slim (no image
registry is reachable) and take torch from download.pytorch.org (unreachable too; only
PyPI, Debian and npm are)."""
from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker" / "compose.yaml"


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def recycle_command():
    """The console command's click group (typer's own click: not the `click` package)."""
    from recycle.cli import app
    return typer.main.get_command(app)


class Shell:
    """What `sh -c SCRIPT` does, for the simple scripts compose files hold: `A && B && C`
    where each part is `NAME="$(cat FILE)"`, `export NAME` or `exec ARGV...`."""

    def __init__(self, script: str):
        self.from_file: dict[str, str] = {}   # env var -> file it is read from
        self.exported: set[str] = set()
        self.argv: list[str] | None = None
        self.reads: dict[str, str] = {}       # placeholder -> file, in argv
        script = script.replace("$$", "$")    # compose's escape for a literal $
        for part in (p.strip() for p in script.split("&&")):
            m = re.fullmatch(r'([A-Z_][A-Z0-9_]*)="\$\(cat ([^)\s]+)\)"', part)
            if m:
                self.from_file[m.group(1)] = m.group(2)
                continue
            m = re.fullmatch(r"export ([A-Z_][A-Z0-9_ ]*)", part)
            if m:
                self.exported.update(m.group(1).split())
                continue
            assert part.startswith("exec "), f"unexpected shell step {part!r} in {script!r}"
            assert self.argv is None, f"two exec steps in {script!r}"

            def placeholder(m):
                key = f"FROM-FILE-{len(self.reads)}"
                self.reads[key] = m.group(1)
                return key
            argv_text = re.sub(r"\$\(cat ([^)\s]+)\)", placeholder, part[len("exec "):])
            assert "$" not in argv_text, f"unhandled substitution in {part!r}"
            self.argv = shlex.split(argv_text)
        assert self.argv is not None, f"no exec step in {script!r}"

    def env_from_files(self) -> dict[str, str]:
        """Variables the exec'd program gets from files (exported ones only)."""
        return {k: v for k, v in self.from_file.items() if k in self.exported}


def argv_of(svc: dict) -> tuple[list[str], dict[str, str]]:
    """(the program's argv, env var -> file it is read from) of a compose service."""
    cmd = svc["command"]
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    if cmd[:2] == ["sh", "-c"]:
        sh = Shell(cmd[2])
        return sh.argv, sh.env_from_files()
    return list(cmd), {}


def dockerfile_entrypoint(name: str) -> list[str]:
    text = (ROOT / "docker" / name).read_text()
    m = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    return json.loads(m.group(1)) if m else []


def check_recycle(argv: list[str]):
    """Parse `recycle ARGV...` with the real command tree (nothing runs): an unknown
    command or flag, a flag without its value or a value of the wrong type raise."""
    assert argv[0] == "recycle", argv
    cmd, args, names = recycle_command(), argv[1:], ["recycle"]
    while hasattr(cmd, "list_commands"):  # a group
        name, args = args[0], args[1:]
        sub = cmd.get_command(cmd.context_class(cmd), name)
        assert sub is not None, f"`{' '.join(names)}` has no sub-command {name!r}"
        cmd, names = sub, names + [name]
    try:
        return cmd.make_context(" ".join(names), list(args), resilient_parsing=False)
    except Exception as e:  # noqa: BLE001 - click's UsageError, typer's copy of it
        if not hasattr(e, "format_message"):
            raise
        raise AssertionError(f"`{' '.join(argv)}`: {e.format_message()}") from None


def check_program(argv: list[str]) -> None:
    if argv[0] == "recycle":
        check_recycle(argv)
    elif argv[:2] == ["python", "-m"]:
        assert importlib.util.find_spec(argv[2]) is not None, f"no module {argv[2]}"
        if argv[2] == "executor.worker":  # its own argparse: no flag here besides these
            for a in argv[3:]:
                assert a.split("=")[0] in ("--store", "--replica", "--stage"), argv
    elif argv[:2] == ["python", "-c"]:
        compile(argv[2], "<compose python -c>", "exec")
    else:
        raise AssertionError(f"a command this test does not know: {argv}")


def mounts(svc: dict) -> dict[str, tuple[str, bool]]:
    """container path -> (named volume or host path, writable)."""
    out = {}
    for v in svc.get("volumes", []):
        parts = v.split(":")
        out[parts[1]] = (parts[0], not (len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def volume_file(svc: dict, path: str) -> tuple[str, str]:
    """(named volume, path inside it) of `path` in `svc`'s container."""
    for where, (vol, _) in mounts(svc).items():
        if path.startswith(where.rstrip("/") + "/"):
            return vol, path[len(where.rstrip("/")) + 1:]
    raise AssertionError(f"{path} is on no volume of the service")


def workers(c: dict) -> dict[str, dict]:
    return {name: svc for name, svc in c["services"].items()
            if argv_of(svc)[0][:3] == ["python", "-m", "executor.worker"]}


def test_every_command_parses_with_the_real_cli():
    c = compose()
    for name, svc in c["services"].items():
        if "command" not in svc:
            continue
        argv, _ = argv_of(svc)
        if name == "service":  # its image's ENTRYPOINT is `recycle serve ...`
            argv = dockerfile_entrypoint("Dockerfile.service") + argv
        check_program(argv)
    assert dockerfile_entrypoint("Dockerfile.service")[:2] == ["recycle", "serve"]


def test_the_check_itself_catches_a_bad_flag():
    with pytest.raises(AssertionError, match="--no-such-flag"):
        check_recycle(["recycle", "train", "--no-such-flag", "1"])
    with pytest.raises(AssertionError, match="iterations"):
        check_recycle(["recycle", "train", "--iterations", "many"])
    with pytest.raises(AssertionError, match="no sub-command"):
        check_recycle(["recycle", "trian"])


def token_file_of_register(svcs: dict) -> tuple[str, str]:
    """(volume, path in it) of the worker token the register step writes."""
    reg_argv, _ = argv_of(svcs["register"])
    assert reg_argv[:2] == ["python", "-c"]
    written = set(re.findall(r'open\("([^"]+)", "w"\)', reg_argv[2]))
    token_file = next(p for p in written if p.endswith("/token"))
    return volume_file(svcs["register"], token_file)


def coordinator_options(svcs: dict) -> dict:
    argv, _ = argv_of(svcs["coordinator"])
    return check_recycle(argv).params


def test_workers_get_the_token_the_store_and_a_rank():
    c = compose()
    svcs = c["services"]
    job = json.loads((ROOT / "docker" / "job-2x2.json").read_text())
    size = job["replicas"] * job["stages"]
    token_at = token_file_of_register(svcs)

    coord = svcs["coordinator"]
    p = coordinator_options(svcs)
    assert p["service"] and p["external"], "the coordinator follows the service, workers are external"
    assert p["job_id"] and p["job_id"].startswith("FROM-FILE-")
    if p["token"] is None:  # from the register's file, into RECYCLE_TOKEN
        assert volume_file(coord, argv_of(coord)[1]["RECYCLE_TOKEN"]) == token_at

    ranks = []
    ws = workers(c)
    assert len(ws) == size, f"{len(ws)} worker services for a {size}-worker job"
    for name, svc in ws.items():
        _, env_files = argv_of(svc)
        env = svc.get("environment", {})
        assert "RECYCLE_TOKEN" in env_files or "RECYCLE_TOKEN" in env, \
            f"{name} gets no worker token: executor.worker exits at start"
        if "RECYCLE_TOKEN" in env_files:
            assert volume_file(svc, env_files["RECYCLE_TOKEN"]) == token_at, name
        host, port = env["RECYCLE_STORE"].rsplit(":", 1)
        assert host == "coordinator" and int(port) == p["store_port"], name
        assert "coordinator" in svc.get("depends_on", {}), name
        ranks.append(int(env["RANK"]))
    assert sorted(ranks) == list(range(size))
    for svc in svcs.values():
        for where, (vol, _) in mounts(svc).items():
            assert vol.startswith(".") or vol in c["volumes"], f"volume {vol} not declared"


def test_checkpoints_go_to_a_volume_every_worker_writes():
    """Each worker writes its stage's part under the coordinator's checkpoint directory (a
    path in the run's config); the coordinator completes the manifest there."""
    c = compose()
    svcs = c["services"]
    ckpt = coordinator_options(svcs)["checkpoint_dir"]
    assert ckpt, "no --checkpoint-dir: checkpoints would stay in the coordinator's container"
    ckpt_vol, ckpt_rw = mounts(svcs["coordinator"]).get(ckpt, (None, False))
    assert ckpt_vol in (c.get("volumes") or {}) and ckpt_rw, f"{ckpt} is not on a named volume"
    for name, svc in workers(c).items():
        assert mounts(svc).get(ckpt) == (ckpt_vol, True), \
            f"{name} cannot write its checkpoint part to {ckpt}"


def test_the_worker_image_lets_its_user_write_the_checkpoint_volume():
    """A new named volume takes the owner of the image's directory at its mount point."""
    text = (ROOT / "docker" / "Dockerfile.worker").read_text()
    assert re.search(r"chown recycle [^\n]*/checkpoints", text)
    assert re.search(r"^USER recycle$", text, re.M)
