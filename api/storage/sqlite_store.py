"""SQLite persistence: jobs, events, plan versions, precompute progress, armed workers.

One file (WAL, synchronous=FULL) that the plan cache may share. Every state change of a
job (an accepted event with its new failed set, state and plan version) is written in one
transaction, so a crash at any point leaves either all of it or none of it on disk.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from planner.errors import UserError

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  spec_json TEXT NOT NULL,
  spec_hash TEXT NOT NULL,
  token_hash TEXT NOT NULL,
  state TEXT NOT NULL,
  reason TEXT,
  failed_json TEXT NOT NULL,
  max_failures INTEGER NOT NULL,
  created REAL NOT NULL,
  updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  event_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  replica INTEGER NOT NULL,
  stage INTEGER NOT NULL,
  source TEXT NOT NULL,
  body_json TEXT NOT NULL,
  response_json TEXT NOT NULL,
  created REAL NOT NULL,
  UNIQUE (job_id, event_id)
);
CREATE TABLE IF NOT EXISTS plan_versions (
  job_id TEXT NOT NULL,
  version INTEGER NOT NULL,
  plan_json TEXT NOT NULL,
  failed_key TEXT NOT NULL,
  solver TEXT NOT NULL,
  period INTEGER NOT NULL,
  cause TEXT NOT NULL,
  created REAL NOT NULL,
  moves_json TEXT,
  PRIMARY KEY (job_id, version)
);
CREATE TABLE IF NOT EXISTS precompute (
  job_id TEXT PRIMARY KEY,
  state TEXT NOT NULL,
  done INTEGER NOT NULL,
  total INTEGER NOT NULL,
  sets INTEGER NOT NULL,
  solvers TEXT NOT NULL,
  max_failures INTEGER NOT NULL,
  error TEXT,
  updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS armed (
  job_id TEXT NOT NULL,
  replica INTEGER NOT NULL,
  stage INTEGER NOT NULL,
  PRIMARY KEY (job_id, replica, stage)
);
"""


class DamagedDatabase(UserError):
    """A database file the service must not start on; the message is one line."""


def check_database(path: str) -> None:
    """Refuse (DamagedDatabase) a path that is not a sound SQLite database or a new file
    in an existing directory: starting on it would serve wrong state, fail later with 500s,
    or silently start empty over data that was lost."""
    import os
    if path == ":memory:":
        return
    if os.path.isdir(path):
        raise DamagedDatabase(f"database {path} is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise DamagedDatabase(f"database {path}: no such directory {parent}")
    if not os.path.exists(path):
        return  # a new database
    if os.path.getsize(path) == 0:
        raise DamagedDatabase(f"database {path} is an empty file, not a database (remove it "
                              f"to start a new one)")
    try:
        from urllib.parse import quote
        db = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True)
        try:
            rows = [r[0] for r in db.execute("PRAGMA quick_check(3)")]
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise DamagedDatabase(f"database {path} cannot be used: {exc}") from None
    if rows != ["ok"]:
        first = " ".join(str(rows[0]).split())[:200]
        raise DamagedDatabase(f"database {path} is damaged (PRAGMA quick_check: {first}); "
                              f"restore it from a backup")


WAL_BACKSTOP_PAGES = 20_000  # ~80 MB: the automatic checkpoint, should checkpoint() lag


class Store:
    def __init__(self, path: str):
        self.path = path
        check_database(path)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                   timeout=30.0)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        # Checkpoints (copying the WAL's pages into the database file) are left to
        # checkpoint(), called after an event's answer: by default the commit that takes
        # the WAL past 1,000 pages runs one, and at 4,096 workers every plan version is
        # ~700 pages, so most events' commits paid for one (36 -> 20 ms median per commit
        # of a 2.9 MB version on this machine). The automatic one stays as a backstop.
        self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_BACKSTOP_PAGES}")
        self._db.executescript(SCHEMA)
        self._migrate()
        self._ckpt: Optional[sqlite3.Connection] = None
        self._ckpt_lock = threading.Lock()

    # Columns added since a table was first created: a database made before gets them.
    ADDED = (("plan_versions", "moves_json", "TEXT"),
             ("jobs", "shape", "TEXT"))  # NULL: registered before shapes (fixed)

    def _migrate(self) -> None:
        for table, column, kind in self.ADDED:
            have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def checkpoint(self) -> None:
        """Copy committed WAL pages into the database file, on a connection of its own (a
        PASSIVE checkpoint: it waits for no reader or writer; what it cannot copy now the
        next one does). Durability does not depend on it: a commit is on disk once its WAL
        frames are (synchronous=FULL). At most one at a time; a call meanwhile is dropped."""
        if not self._ckpt_lock.acquire(blocking=False):
            return
        try:
            if self._ckpt is None:
                self._ckpt = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            self._ckpt.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            self._ckpt_lock.release()

    def close(self) -> None:
        with self._ckpt_lock:
            if self._ckpt is not None:
                self._ckpt.close()
                self._ckpt = None
        with self._lock:
            self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _one(self, sql: str, args: tuple = ()) -> Optional[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchone()

    def _all(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- jobs --------------------------------------------------------------------------
    def create_job(self, job_id: str, spec_json: str, spec_hash: str, token_hash: str,
                   max_failures: int, plan: dict[str, Any], solvers: list[str],
                   now: float, shape: str = "auto") -> None:
        with self.tx() as db:
            db.execute("INSERT INTO jobs (id, spec_json, spec_hash, token_hash, state, reason, "
                       "failed_json, max_failures, created, updated, shape) "
                       "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       (job_id, spec_json, spec_hash, token_hash, "running", None, "[]",
                        max_failures, now, now, shape))
            self._insert_plan(db, job_id, plan)
            db.execute("INSERT INTO precompute VALUES (?,?,?,?,?,?,?,?,?)",
                       (job_id, "queued", 0, 0, 0, json.dumps(solvers), max_failures, None, now))

    def set_state(self, job_id: str, state: str) -> None:
        with self.tx() as db:
            db.execute("UPDATE jobs SET state=?, updated=? WHERE id=?", (state, time.time(), job_id))
            db.execute("DELETE FROM armed WHERE job_id=?", (job_id,))

    def jobs(self) -> list[sqlite3.Row]:
        return self._all("SELECT * FROM jobs ORDER BY created")

    # ---- events ------------------------------------------------------------------------
    def event(self, job_id: str, event_id: str) -> Optional[sqlite3.Row]:
        return self._one("SELECT * FROM events WHERE job_id=? AND event_id=?", (job_id, event_id))

    def events(self, job_id: str) -> list[sqlite3.Row]:
        return self._all("SELECT * FROM events WHERE job_id=? ORDER BY seq", (job_id,))

    def apply_event(self, job_id: str, event: dict[str, Any], response: dict[str, Any],
                    state: str, reason: Optional[str], failed: list,
                    plan: Optional[dict[str, Any]]) -> None:
        """Record an accepted event with the job's new state and (if any) new plan."""
        self.apply_events(job_id, [(event, response)], state, reason, failed, plan)

    def apply_events(self, job_id: str, events: list[tuple[dict[str, Any], dict[str, Any]]],
                     state: str, reason: Optional[str], failed: list,
                     plan: Optional[dict[str, Any]]) -> None:
        """Record accepted events (each with its answer), the job's new state and (if any)
        the one new plan version they publish together, in one transaction."""
        now = time.time()
        with self.tx() as db:
            for event, response in events:
                db.execute(
                    "INSERT INTO events (job_id, event_id, kind, replica, stage, source, "
                    "body_json, response_json, created) VALUES (?,?,?,?,?,?,?,?,?)",
                    (job_id, event["event_id"], event["kind"], event["replica"],
                     event["stage"], event["source"], event["body_json"],
                     json.dumps(response), now))
                gone = ([(event["replica"], event["stage"])] if event["kind"] == "failure"
                        else event.get("workers", ()) if event["kind"] == "remove" else ())
                for r, s in gone:
                    db.execute("DELETE FROM armed WHERE job_id=? AND replica=? AND stage=?",
                               (job_id, r, s))
            db.execute("UPDATE jobs SET state=?, reason=?, failed_json=?, updated=? WHERE id=?",
                       (state, reason, json.dumps(failed), now, job_id))
            if plan is not None:
                self._insert_plan(db, job_id, plan)

    def speed_events(self, job_id: str) -> list[sqlite3.Row]:
        """Accepted speed events, oldest first (the operator's settings are replayed from
        them after a restart)."""
        return self._all("SELECT source, body_json FROM events WHERE job_id=? AND kind='speed' "
                         "ORDER BY seq", (job_id,))

    # ---- plans -------------------------------------------------------------------------
    @staticmethod
    def _insert_plan(db: sqlite3.Connection, job_id: str, plan: dict[str, Any]) -> None:
        db.execute("INSERT INTO plan_versions (job_id, version, plan_json, failed_key, solver, "
                   "period, cause, created, moves_json) VALUES (?,?,?,?,?,?,?,?,?)",
                   (job_id, plan["version"], plan["json"], plan["failed_key"], plan["solver"],
                    plan["period"], plan["cause"], time.time(), plan.get("moves_json")))

    def add_plan(self, job_id: str, plan: dict[str, Any]) -> None:
        with self.tx() as db:
            self._insert_plan(db, job_id, plan)

    def latest_plan(self, job_id: str) -> Optional[sqlite3.Row]:
        return self._one("SELECT * FROM plan_versions WHERE job_id=? ORDER BY version DESC "
                         "LIMIT 1", (job_id,))

    def plan(self, job_id: str, version: int) -> Optional[sqlite3.Row]:
        return self._one("SELECT * FROM plan_versions WHERE job_id=? AND version=?",
                         (job_id, version))

    def plan_history(self, job_id: str) -> list[sqlite3.Row]:
        return self._all("SELECT version, failed_key, solver, period, cause, created, "
                         "moves_json FROM plan_versions WHERE job_id=? ORDER BY version",
                         (job_id,))

    def cached_solver(self, spec_hash: str, failed_key: str, mode: str) -> Optional[str]:
        """Which back-end made the plan cache's entry (PlanCache's table, same file)."""
        try:
            row = self._one("SELECT solver FROM plans WHERE spec_hash=? AND failed_key=? AND "
                            "mode=?", (spec_hash, failed_key, mode))
        except sqlite3.OperationalError:  # the cache lives in another file
            return None
        return row[0] if row else None

    # ---- precompute --------------------------------------------------------------------
    def precompute(self, job_id: str) -> Optional[sqlite3.Row]:
        return self._one("SELECT * FROM precompute WHERE job_id=?", (job_id,))

    def set_precompute(self, job_id: str, **fields: Any) -> None:
        fields["updated"] = time.time()
        cols = ", ".join(f"{k}=?" for k in fields)
        with self.tx() as db:
            db.execute(f"UPDATE precompute SET {cols} WHERE job_id=?", (*fields.values(), job_id))

    # ---- heartbeat arming --------------------------------------------------------------
    def arm(self, job_id: str, replica: int, stage: int) -> None:
        self.arm_many([(job_id, replica, stage)])

    def arm_many(self, rows: list[tuple[str, int, int]]) -> None:
        with self.tx() as db:
            db.executemany("INSERT OR IGNORE INTO armed VALUES (?,?,?)", rows)

    def armed(self, job_id: str) -> list[tuple[int, int]]:
        return [(r["replica"], r["stage"]) for r in
                self._all("SELECT replica, stage FROM armed WHERE job_id=?", (job_id,))]

    # ---- tests and tools ---------------------------------------------------------------
    def snapshot(self) -> dict[str, list[tuple]]:
        """Every row of the service's own tables (the plan cache excluded)."""
        out = {}
        for table, order in (("jobs", "id"), ("events", "seq"),
                             ("plan_versions", "job_id, version")):
            out[table] = [tuple(r) for r in self._all(f"SELECT * FROM {table} ORDER BY {order}")]
        return out
