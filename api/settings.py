"""Service settings, read from MEMSCHED_* environment variables; every default runs out of the box."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from memsched.optimizer.solve import SolveOptions


def default_data_dir() -> Path:
    """Where the embedded SQLite database lives: $XDG_DATA_HOME/memsched (XDG base-directory spec)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "memsched"


def default_database_url() -> str:
    return f"sqlite:///{default_data_dir() / 'memsched.db'}"


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
    default_time_limit_s: float = Field(default=SolveOptions.time_limit_s, gt=0)
    """Solver time limit when a request names none (clipped to max_time_limit_s)."""
    max_wait_s: float = Field(default=60.0, ge=0)
    """Ceiling on ?wait=SECONDS; larger waits are clipped to it."""
    job_grace_s: float = Field(default=30.0, gt=0)
    """How far past its time limit a solve may run before its worker is killed and the job failed."""
    max_attempts: int = Field(default=2, ge=1)
    """A job interrupted (restart, worker crash) this many times is failed instead of re-queued."""
    log_level: str = "info"
    """Log level of the service and of uvicorn."""

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, v: object) -> object:
        if isinstance(v, str):
            return [k.strip() for k in v.split(",") if k.strip()]
        return v

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, keys: list[str]) -> list[str]:
        for i, k in enumerate(keys):
            # Short keys are guessable; refusing them at start-up beats a silently weak deployment.
            if len(k) < 8:
                raise ValueError(f"api_keys[{i}] is {len(k)} characters; use keys of at least 8 characters")
        return keys

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
