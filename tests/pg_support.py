"""A real PostgreSQL server (Debian's postgresql package, installed by scripts/setup.sh)
in a temporary directory on a free loopback port, started with initdb/pg_ctl and stopped
after. As root (CI), the server runs as the `postgres` user, which PostgreSQL requires."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile

from api_support import free_port


def pg_bin() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries: run scripts/setup.sh (it installs "
                           "Debian's postgresql)")
    return os.path.dirname(found[-1])


class PgServer:
    def __init__(self):
        self.bin = pg_bin()
        self.dir = tempfile.mkdtemp(prefix="recycle-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.url = f"postgresql://recycle@127.0.0.1:{self.port}/postgres"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres")

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=60)

    def start(self) -> "PgServer":
        if not os.path.exists(self.data):
            self._run(f"{self.bin}/initdb", "-D", self.data, "-U", "recycle", "--auth=trust",
                      "--no-sync", "-E", "UTF8")
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c shared_buffers=16MB")
        self._run(f"{self.bin}/pg_ctl", "-D", self.data, "-o", opts, "-l",
                  os.path.join(self.dir, "log"), "-w", "-t", "30", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            self._run(f"{self.bin}/pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
