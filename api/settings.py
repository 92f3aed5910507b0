"""Service settings, read from MEMSCHED_* environment variables; every default runs out of the box."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from memsched.options import SolveOptions


def default_data_dir() -> Path:
    """Where the embedded SQLite database lives: $XDG_DATA_HOME/memsched (XDG base-directory spec)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "memsched"


def default_database_url() -> str:
    return f"sqlite:///{default_data_dir() / 'memsched.db'}"


BROKER_SCHEMES = {"redis": "redis", "rediss": "redis", "amqp": "amqp", "amqps": "amqp", "pyamqp": "amqp"}
"""The Celery brokers memsched supports, by URL scheme."""


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""The log levels the service and uvicorn share."""


class Settings(BaseSettings):
    """Environment: MEMSCHED_<FIELD>, e.g. MEMSCHED_DATABASE_URL, MEMSCHED_API_KEYS=key1,key2."""

    model_config = SettingsConfigDict(env_prefix="MEMSCHED_", extra="ignore")

    database_url: str = Field(default_factory=default_database_url)
    """SQLAlchemy URL: sqlite:///path.db (default, under the XDG data dir) or postgresql+psycopg://..."""
    # NoDecode: read "k1,k2" as text and split it ourselves, instead of pydantic-settings' JSON-list parsing.
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Accepted Bearer keys, comma-separated. Empty: no authentication (one anonymous owner)."""
    host: str = "127.0.0.1"
    """Interface `memsched serve` binds to."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Port `memsched serve` listens on."""
    workers: int = Field(default=2, ge=1, le=256)
    """Solver processes: how many solves run at once (each one is CPU-bound and single-threaded)."""
    solver_threads: int = Field(default=1, ge=1, le=256)
    """Threads each solve may use (CP-SAT, HiGHS, CBC): workers x solver_threads should not exceed the cores."""
    max_queued_jobs: int = Field(default=1000, ge=1)
    """Jobs waiting for a worker beyond this are refused with 429 (back-pressure instead of an endless queue)."""
    max_body_bytes: int = Field(default=16 * 2**20, ge=1024)
    """Largest request body accepted; bigger ones get 413."""
    max_layers: int = Field(default=5000, ge=1)
    """Largest trace accepted, in layers; bigger ones get 422."""
    max_time_limit_s: float = Field(default=300.0, gt=0)
    """Ceiling on a job's solver time limit; a request above it gets 422."""
    default_time_limit_s: float = Field(default=SolveOptions.model_fields["time_limit_s"].default, gt=0)
    """Solver time limit when a request names none (clipped to max_time_limit_s)."""
    max_wait_s: float = Field(default=60.0, ge=0)
    """Ceiling on ?wait=SECONDS; larger waits are clipped to it."""
    job_grace_s: float = Field(default=30.0, gt=0)
    """How far past its time limit a solve may run before its worker is killed and the job failed."""
    max_attempts: int = Field(default=2, ge=1)
    """A job interrupted (restart, worker crash) this many times is failed instead of re-queued."""
    log_level: str = "info"
    """Log level of the service and of uvicorn: debug | info | warning | error | critical."""
    broker_url: str | None = None
    """Celery broker: redis://host:6379/0 (default kind) or amqp://user:pw@host:5672//. Set, `memsched serve`
    queues solves to `memsched worker` processes instead of its own pool, and any number of replicas may share
    one (PostgreSQL) database. Unset: the embedded mode."""
    queue: str = Field(default="memsched", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")
    """Celery queue the API replicas send solves to and `memsched worker` consumes by default."""
    broker_key_prefix: str = Field(default="memsched:", max_length=200)
    """Prefix of every Redis key Celery uses, so that deployments sharing one Redis stay apart (not used
    with RabbitMQ, where a vhost does that)."""
    visibility_timeout_s: float | None = Field(default=None, gt=0)
    """Redis: a job whose worker vanished (kill -9, lost machine) is delivered again after this long. It must
    exceed the largest hard time limit, or a job still running would be delivered twice. Default: the
    largest hard time limit + 10 s."""

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, v: str) -> str:
        if v.lower() not in _LOG_LEVELS:
            raise ValueError(f"give one of {', '.join(_LOG_LEVELS)}, got {v!r}")
        return v.lower()

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, v: object) -> object:
        if isinstance(v, str):
            return [k.strip() for k in v.split(",") if k.strip()]
        return v

    @field_validator("broker_url")
    @classmethod
    def _check_broker(cls, url: str | None) -> str | None:
        if not url:
            return None
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme not in BROKER_SCHEMES:
            raise ValueError(
                f"{scheme or 'no'} scheme; use redis://host:6379/0 (Redis) or amqp://user:password@host:5672// "
                "(RabbitMQ)"
            )
        return url

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, keys: list[str]) -> list[str]:
        for i, k in enumerate(keys):
            # Short keys are guessable; refusing them at start-up beats a silently weak deployment.
            if len(k) < 8:
                raise ValueError(f"api_keys[{i}] is {len(k)} characters; use keys of at least 8 characters")
        return keys

    @model_validator(mode="after")
    def _check_visibility(self) -> Settings:
        if self.visibility_timeout_s is not None and self.visibility_timeout_s <= self.max_hard_limit_s:
            raise ValueError(
                f"visibility_timeout_s {self.visibility_timeout_s:g} is not above the largest hard time limit, "
                f"{self.max_hard_limit_s:g} s (max_time_limit_s + 2 x job_grace_s): a job still running would "
                "be delivered to a second worker; raise it or lower the limits"
            )
        return self

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)

    @property
    def distributed(self) -> bool:
        """True when solves go to Celery workers (MEMSCHED_BROKER_URL set)."""
        return bool(self.broker_url)

    def soft_limit_s(self, time_limit_s: float) -> float:
        """Celery's soft time limit of a job: the worker stops the solver and returns the heuristic's schedule."""
        return time_limit_s + self.job_grace_s

    def hard_limit_s(self, time_limit_s: float) -> float:
        """Celery's hard time limit of a job: the worker process is killed and the job failed."""
        return time_limit_s + 2 * self.job_grace_s

    @property
    def max_hard_limit_s(self) -> float:
        return self.hard_limit_s(self.max_time_limit_s)

    @property
    def effective_visibility_timeout_s(self) -> float:
        return self.visibility_timeout_s or self.max_hard_limit_s + 10.0


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
