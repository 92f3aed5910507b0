"""Engine and sessions. SQLite is the embedded default; PostgreSQL is picked by URL (postgresql+psycopg://)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from memsched.api.tables import Base
from memsched.errors import MemschedError

log = logging.getLogger(__name__)

_SCHEMA_LOCK = 0x6D656D73  # "mems": the advisory lock key under which replicas create the tables


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL lets readers run while the single writer commits; without it concurrent submissions see
    # "database is locked" as soon as a job finishes during a burst of requests.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise MemschedError(
            f"MEMSCHED_DATABASE_URL {url!r} is not a database URL; use sqlite:///path/to/memsched.db or "
            "postgresql+psycopg://user:password@host:5432/dbname"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        # Route handlers run in a thread pool, so connections cross threads; the long busy timeout makes
        # writers queue behind each other instead of failing under a burst.
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() != "psycopg":
        raise MemschedError(
            f"MEMSCHED_DATABASE_URL uses driver {parsed.get_driver_name()!r}; memsched ships psycopg 3: "
            "write postgresql+psycopg://..."
        )
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


class Database:
    """One engine and its session factory; the app keeps one for its lifetime."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def create_all(self) -> None:
        """Create missing tables and migrate older ones (`migrate`). On PostgreSQL under an advisory lock: API
        replicas starting together would otherwise race to create or migrate the same tables."""
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
            migrate(conn)
            Base.metadata.create_all(conn)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s:
            yield s

    def ping(self) -> None:
        """Raise if the database cannot answer a trivial query (used by /readyz)."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()

    @property
    def safe_url(self) -> str:
        """The URL with the password masked, for logs."""
        return make_url(self.url).render_as_string(hide_password=True)


_OPTION_COLUMNS = ("solver", "time_limit_s", "gap", "window", "max_segment")
"""The solve options' columns of schedule_jobs before they became one JSON column (`options`)."""


def migrate(conn: Connection) -> None:
    """Bring tables written by an older memsched up to date, keeping every row.

    1. schedule_jobs stored each solve option in a column of its own; now the options are one JSON column
       (SolveOptions as JSON), so that adding an option needs no migration. Each row's options are rebuilt from
       its old columns, then those columns are dropped (SQLite >= 3.35 and PostgreSQL both drop columns).
    2. schedule_jobs gained `min_feasible_host_bytes` (a job failed for a host budget too small): added, null in
       the rows before it."""
    insp = inspect(conn)
    if "schedule_jobs" not in insp.get_table_names():
        return
    columns = {c["name"] for c in insp.get_columns("schedule_jobs")}
    if "min_feasible_host_bytes" not in columns:
        log.info("migrating schedule_jobs: adding the column min_feasible_host_bytes")
        conn.execute(text("ALTER TABLE schedule_jobs ADD COLUMN min_feasible_host_bytes BIGINT"))
    old = [c for c in _OPTION_COLUMNS if c in columns]
    if "options" in columns or not old:
        return
    log.info("migrating schedule_jobs: solve options %s -> one JSON column 'options'", ", ".join(old))
    conn.execute(text("ALTER TABLE schedule_jobs ADD COLUMN options TEXT"))
    quote = conn.dialect.identifier_preparer.quote  # "window" is a reserved word in PostgreSQL
    rows = conn.execute(text(f"SELECT id, {', '.join(map(quote, old))} FROM schedule_jobs")).mappings().all()
    for row in rows:
        # The stored values as they are (they passed the same checks when they were stored).
        options = json.dumps({c: row[c] for c in old})
        conn.execute(text("UPDATE schedule_jobs SET options = :o WHERE id = :id"), {"o": options, "id": row["id"]})
    for c in old:
        conn.execute(text(f"ALTER TABLE schedule_jobs DROP COLUMN {quote(c)}"))
