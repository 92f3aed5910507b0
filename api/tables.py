"""Database tables. Traces are stored once per owner under their content hash; schedule jobs once per owner
per cache key, which is what makes repeated submissions idempotent and lets the database settle races."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Dialect, Float, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from memsched.schema import JobStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone on the way back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return value.astimezone(UTC) if value is not None and value.tzinfo else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    pass


class TraceRow(Base):
    __tablename__ = "traces"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Hash of the API key that stored it ('' without authentication); keys never see each other's rows."""
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Trace.content_hash(): the same trace always gets the same id."""
    model: Mapped[str] = mapped_column(String(256))
    n_layers: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)
    """The validated trace as JSON."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class JobRow(Base):
    __tablename__ = "schedule_jobs"
    __table_args__ = (UniqueConstraint("owner", "cache_key", name="uq_job_owner_cache_key"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    trace_id: Mapped[str] = mapped_column(String(64))
    cache_key: Mapped[str] = mapped_column(String(64), index=True)
    """sha256 of trace hash + budget bytes + solve options: equal keys mean equal answers."""
    budget_bytes: Mapped[int] = mapped_column(BigInteger)
    budget_spec: Mapped[str] = mapped_column(String(64))
    """The budget as the client wrote it ('50%', '8GiB', '123'), for display."""
    options: Mapped[str] = mapped_column(Text)
    """The job's SolveOptions as JSON (memsched.options): one column, so a new option needs no migration."""
    status: Mapped[str] = mapped_column(String(16), index=True, default=JobStatus.QUEUED.value)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Why a job failed, or what happened to it (re-queued after a restart)."""
    min_feasible_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    min_feasible_host_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """For a host budget too small at the job's device budget: the smallest that works (InfeasibleHostBudgetError)."""
    schedule: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The Schedule as JSON once done."""
    plot_png: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    """The rendered timeline, kept after the first request for it."""
    cached: Mapped[bool] = mapped_column(default=False)
    """True when the schedule was copied from an earlier identical solve instead of being solved."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    solve_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
