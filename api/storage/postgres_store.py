"""The service's state in PostgreSQL, for a deployment with a standby service.

`recycle serve --db postgresql://USER@HOST:PORT/DB` keeps what the SQLite file would hold
(jobs, events, plan versions, precompute progress, armed workers, and the plan cache) in
that database instead; a plain path keeps the embedded SQLite default. The store is the
SQLite `Store` with its connection swapped: the same SQL, with `?` parameters and SQLite's
`INSERT OR IGNORE/REPLACE` rewritten for PostgreSQL and the schema's types mapped, so the
two back-ends cannot drift apart.

One active service per database: the active one holds a session-level advisory lock for
its whole life. A second `recycle serve` on the same database is a standby: it waits for
that lock before it loads anything or opens its port, and takes over (loading every job,
failed set, plan version and armed worker from the database) as soon as the active one's
session ends: its process exited or was killed, or its machine vanished (the session's TCP
keep-alives, set below, end it within about 10 s). An active service that loses its
database connection stops (fail-stop): it could no longer persist an event, and the lock
that made it the only writer is gone. See docs/operators.md.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import re
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from api.storage.sqlite_store import SCHEMA, Store
from planner.cache import SCHEMA as CACHE_SCHEMA
from planner.cache import PlanCache

log = logging.getLogger("recycle.api")
LOCK_KEY = 0x7265_6379  # "recy": the advisory lock that makes a service the active one
STANDBY_POLL_S = 0.5
KEEPALIVE_S = 1.0
# on the server side of the active service's session: a vanished peer ends it (and frees
# the lock) after idle + interval * count seconds
SESSION_KEEPALIVES = {"tcp_keepalives_idle": 5, "tcp_keepalives_interval": 2,
                      "tcp_keepalives_count": 3}
UPSERT_KEYS = {"plans": ("spec_hash", "failed_key", "mode")}


def is_postgres(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


def pg_schema(sqlite_schema: str) -> str:
    s = re.sub(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b", "BIGSERIAL PRIMARY KEY", sqlite_schema)
    s = re.sub(r"\bINTEGER\b", "BIGINT", s)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", s)


@functools.lru_cache(maxsize=256)
def pg_sql(sql: str) -> Optional[str]:
    """SQLite's SQL as PostgreSQL's; None for a statement with no meaning there (PRAGMA)."""
    head = sql.lstrip()
    if head.upper().startswith("PRAGMA"):
        return None
    s = sql.replace("?", "%s")
    m = re.match(r"\s*INSERT OR (IGNORE|REPLACE) INTO (\w+)", s)
    if m:
        s = f"INSERT INTO {m.group(2)}" + s[m.end():]
        if m.group(1) == "IGNORE":
            s += " ON CONFLICT DO NOTHING"
        else:  # the whole row replaces the one with its key
            keys = UPSERT_KEYS[m.group(2)]
            cols = _columns(m.group(2))
            s += (f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET "
                  + ", ".join(f"{c}=EXCLUDED.{c}" for c in cols if c not in keys))
    return s


def _columns(table: str) -> list[str]:
    schema = SCHEMA + CACHE_SCHEMA
    body = re.search(rf"CREATE TABLE IF NOT EXISTS {table} \((.*?)\n\)", schema, re.S).group(1)
    return [ln.split()[0] for ln in body.strip().splitlines()
            if ln.split() and ln.split()[0].upper() not in ("PRIMARY", "UNIQUE")]


class Row(tuple):
    """A row as sqlite3.Row has it: by index, by column name, and dict(row)."""

    def __getitem__(self, key):
        if isinstance(key, str):
            key = self._names[key]
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor):
    names = {c.name: i for i, c in enumerate(cursor.description or ())}

    def make(values):
        row = Row(values)
        row._names = names
        return row
    return make


class Conn:
    """A psycopg connection with sqlite3's execute/executemany; a lost connection calls
    `on_lost` (the service stops) before the error goes up."""

    def __init__(self, url: str, on_lost: Callable[[], None] = lambda: None):
        import psycopg
        self._errors = (psycopg.OperationalError, psycopg.InterfaceError)
        self.raw = psycopg.connect(url, autocommit=True, row_factory=_row_factory,
                                   connect_timeout=10)
        self.on_lost = on_lost

    def _run(self, fn):
        try:
            return fn()
        except self._errors:
            if self.raw.closed or self.raw.broken:
                log.critical("lost the PostgreSQL connection: this service stops")
                self.on_lost()
            raise

    def execute(self, sql: str, args: tuple = ()):
        q = pg_sql(sql)
        if q is None:
            return _Empty()
        return self._run(lambda: self.raw.execute(q, args))

    def executemany(self, sql: str, rows) -> None:
        q = pg_sql(sql)
        self._run(lambda: self.raw.cursor().executemany(q, list(rows)))

    def executescript(self, script: str) -> None:
        self._run(lambda: self.raw.execute(script))

    def close(self) -> None:
        self.raw.close()


class _Empty:
    def fetchone(self):
        return None

    def fetchall(self):
        return []


class PgStore(Store):
    """api.storage.sqlite_store.Store on PostgreSQL (see the module docstring)."""

    def __init__(self, url: str, on_lost: Callable[[], None] = lambda: None):
        self.path = url
        self._lock = threading.RLock()
        self._db = Conn(url, on_lost)
        for name, value in SESSION_KEEPALIVES.items():
            self._db.raw.execute(f"SET {name} = {int(value)}")
        self._keeper: Optional[asyncio.Task] = None

    def checkpoint(self) -> None:
        """Nothing to do: PostgreSQL checkpoints on its own."""

    def try_activate(self) -> bool:
        """Take the advisory lock (then create the tables); False if another holds it."""
        with self._lock:
            row = self._db.raw.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
            if not row[0]:
                return False
            self._db.executescript(pg_schema(SCHEMA))
            self._db.executescript(pg_schema(CACHE_SCHEMA))
            for table, column, kind in self.ADDED:
                self._db.executescript(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "
                                       f"{column} {pg_schema(kind)}")
            return True

    @contextmanager
    def tx(self) -> Iterator[Conn]:
        with self._lock, self._db.raw.transaction():
            yield self._db

    async def keep_alive(self) -> None:
        """Notice a lost connection while idle too (the lock went with it)."""
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            try:
                await asyncio.to_thread(self._one, "SELECT 1")
            except Exception:  # noqa: BLE001 - Conn has stopped the service
                return

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
        with self._lock:
            self._db.close()  # ends the session: the lock passes to a standby


class PgPlanCache(PlanCache):
    """planner.cache.PlanCache with its table in the same PostgreSQL database, so a
    standby takes over with the precomputed plans (planner/ itself stays SQLite-only)."""

    def __init__(self, url: str, on_lost: Callable[[], None] = lambda: None,
                 memory_actions: int = 100_000):
        super().__init__(":memory:", memory_actions)
        super().close()
        self.path = url
        self._db = Conn(url, on_lost)


def _stopper(app) -> Callable[[], None]:
    def stop() -> None:
        server = getattr(app.state, "server", None)
        if server is not None:
            server.should_exit = True
    return stop


def _stopping(app) -> bool:
    server = getattr(app.state, "server", None)
    return bool(server is not None and server.should_exit)


def check_reachable(url: str) -> Optional[str]:
    """None if the database answers, else the reason in one line."""
    import psycopg
    try:
        psycopg.connect(url, connect_timeout=5).close()
        return None
    except psycopg.Error as e:
        return " ".join(str(e).split())[:300] or type(e).__name__


async def open_store(db: str, app=None) -> Store:
    """The service's store: SQLite at a path, or PostgreSQL at a postgresql:// URL, where
    this waits as a standby until it may be the active service."""
    if not is_postgres(db):
        return Store(db)
    stop = _stopper(app) if app is not None else (lambda: None)
    store = await asyncio.to_thread(PgStore, db, stop)
    waited = False
    while not await asyncio.to_thread(store.try_activate):
        if not waited:
            log.warning("standby: another service holds %s; taking over when it stops",
                        _redacted(db))
            waited = True
        if app is not None and _stopping(app):
            store.close()
            raise RuntimeError("stopped while standing by")
        await asyncio.sleep(STANDBY_POLL_S)
    log.warning("active on %s%s", _redacted(db), " (took over)" if waited else "")
    store._keeper = asyncio.create_task(store.keep_alive())
    return store


def open_cache(path: str, app=None, memory_actions: int = 100_000) -> PlanCache:
    if not is_postgres(path):
        return PlanCache(path, memory_actions)
    return PgPlanCache(path, _stopper(app) if app is not None else (lambda: None),
                       memory_actions)


def _redacted(url: str) -> str:
    """The URL without its password, for the log."""
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)
